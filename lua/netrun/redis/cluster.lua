--- The Redis Cluster client, `netrun.redis.cluster`.
-- @module netrun.redis

-- netrun.redis.cluster: a Redis Cluster client with netrun.redis's methods.
--
--   local c = netrun.redis.cluster { nodes = { "10.0.0.1:6379", ... },
--                                    password = ..., tls = ..., timeout = 5,
--                                    pool = 1, read_from = "master",
--                                    max_redirects = 16, max_retries = 8 }
--   c:set("k", "v")  c:get("k")  c:pipeline(fn)  c:transaction(fn)
--   c:eval(script, numkeys, ...)  c:ssubscribe(ch)  c:read_reply()
--
-- The slot map: on first use (per loop) from CLUSTER SHARDS (CLUSTER
-- SLOTS on servers before 7), asked of the seed nodes then of the nodes
-- known, in turn. Each command goes to the master of its key's slot
-- (CRC16 of the key, or of its {hash tag}; netrun.redis.slot); commands
-- without a key to a master. With read_from = "replica" the commands
-- that only read go to the slot's replicas (round robin, READONLY on
-- their connections; the master while a slot has none).
--
-- Redirects: MOVED updates that slot's owner at once and refreshes the
-- whole map in the background (at most one refresh at a time, and not
-- more often than every 0.1 s); ASK sends the command once to the node
-- named, after ASKING, without changing the map. A command follows at
-- most max_redirects redirects (16): a cluster that answers MOVED in a
-- loop fails it with "too many redirects (MOVED ...)".
--
-- Retries: a command whose connection failed (a node killed: refused,
-- reset, closed, timeout), or answered TRYAGAIN, CLUSTERDOWN or LOADING,
-- is sent again after refreshing the map, up to max_retries times (8) at
-- growing delays (retry_delay, 0.05 s, doubled up to 1 s): a failover
-- (a replica promoted, CLUSTER FAILOVER or a master killed) is followed
-- without failing the command. A command sent again after its
-- connection failed may have run already (at least once: as ioredis).
--
-- Pipelines are split by node, sent to every node at once and the
-- replies put back in order; a command of one that was redirected or
-- whose node failed is run again alone, as above. A transaction goes to
-- the node of its first key (all its keys must share a slot, as the
-- server requires), and again, whole, if it was redirected.
--
-- Sharded pub/sub: c:ssubscribe subscribes on the master of each
-- channel's slot, c:read_reply reads them all. A slot that moves (the
-- server's "sunsubscribe" comes as a message) or a node that fails ("closed")
-- ends those subscriptions; subscribing again is the caller's to do.
--
-- Metrics: netrun_redis_redirects_total{kind="moved"|"ask"},
-- netrun_redis_retries_total and netrun_redis_slot_refreshes_total in
-- netrun.metrics (a shared dict counts them, in every loop).
local core = require "netrun.core"
local R = require "netrun.redis"
local C = R.conn

local M = { max_redirects = 16, max_retries = 8, retry_delay = 0.05, refresh_every = 0.1 }

local NULL, Error, result = R.null, R.Error, R.result
local slot_of_key = core.redis.slot
local running, isyieldable = coroutine.running, coroutine.isyieldable
local pack, unpack = table.pack, table.unpack
local park, unpark = core.park, core.unpark
local now = core.now

local function is_error(v) return type(v) == "table" and getmetatable(v) == Error end

-- ---- metrics ---------------------------------------------------------------------

local counters
local function count(what)
  counters = counters or core.dict("netrun.redis.metrics", { capacity = 64 })
  counters:incr(what, 1, 0)
end
M.count = count

-- ---- options ---------------------------------------------------------------------

local SCHEMA = { nodes = "strings!", read_from = "enum master replica",
                 max_redirects = "integer 0", max_retries = "integer 0", retry_delay = "seconds" }
for k, v in pairs(R.SCHEMA) do
  if k ~= "url" and k ~= "host" and k ~= "port" and k ~= "db" then SCHEMA[k] = v end
end
local check_new = core.options("netrun.redis.cluster", SCHEMA)

local function parse_node(what, i, s)
  local host, port = s:match("^%[([%x:.]+)%]:(%d+)$")
  if not host then host, port = s:match("^([^:]+):(%d+)$") end
  port = math.tointeger(tonumber(port))
  if not host or not port or port < 1 or port > 65535 then
    core.option_error(what, "nodes[" .. i .. "]", s, '"host:port"')
  end
  return { host, port }
end

local Cluster = {}
Cluster.__index = Cluster
M.Cluster = Cluster

function M.new(opts)
  local what = "netrun.redis.cluster"
  opts = check_new(opts)
  local s = R.settings(what, opts)
  s.seeds = {}
  for i, n in ipairs(opts.nodes) do s.seeds[i] = parse_node(what, i, n) end
  s.read_from = opts.read_from or "master"
  s.max_redirects = opts.max_redirects or M.max_redirects
  s.max_retries = opts.max_retries or M.max_retries
  s.retry_delay = opts.retry_delay or M.retry_delay
  s.db = 0
  s.id = R.new_id("c")
  return setmetatable(s, Cluster)
end

-- ---- this loop's view of the cluster -----------------------------------------------

local states = {}            -- cluster id -> state (this state's)

local function addr_of(host, port) return host .. ":" .. port end

-- The pool of a node (masters and replicas apart: a replica's connections
-- send READONLY).
local function pool_at(st, addr, readonly)
  local key = readonly and "r " .. addr or addr
  local p = st.pools[key]
  if p == nil then
    local host, port = addr:match("^%[?(.-)%]?:(%d+)$")
    p = C.new_pool(st.cfg, host, math.tointeger(tonumber(port)), readonly)
    st.pools[key] = p
  end
  return p
end

-- A RESP3 map is a table; RESP2 gives the same as a flat array.
local function as_map(v)
  if type(v) ~= "table" then return {} end
  if v[1] == nil then return v end
  local m = {}
  for i = 1, #v - 1, 2 do m[v[i]] = v[i + 1] end
  return m
end

-- Shards from CLUSTER SHARDS: { { from, to, ... }, master = addr, replicas = { addr... } }.
local function from_shards(reply, asked)
  local shards = {}
  for _, raw in ipairs(reply) do
    local sh = as_map(raw)
    local s = { ranges = {}, replicas = {} }
    for _, x in ipairs(sh.slots or {}) do s.ranges[#s.ranges + 1] = math.tointeger(x) end
    for _, rn in ipairs(sh.nodes or {}) do
      local n = as_map(rn)
      local host = n.endpoint
      if host == nil or host == "" or host == "?" or host == NULL then host = n.ip end
      if host == nil or host == "" or host == NULL then host = asked end
      local port = math.tointeger(n.port or n["tls-port"])
      if port then
        local addr = addr_of(host, port)
        if n.role == "master" then
          s.master = addr
        elseif n.health ~= "failed" then
          s.replicas[#s.replicas + 1] = addr
        end
      end
    end
    if s.master and #s.ranges > 0 then shards[#shards + 1] = s end
  end
  return shards
end

-- Shards from CLUSTER SLOTS: { from, to, { ip, port, id }, { replica }... }.
local function from_slots(reply, asked)
  local shards = {}
  for _, e in ipairs(reply) do
    local function addr(n)
      local host = n[1]
      if host == nil or host == "" or host == NULL or host == "?" then host = asked end
      return addr_of(host, math.tointeger(n[2]))
    end
    local s = { ranges = { math.tointeger(e[1]), math.tointeger(e[2]) }, replicas = {} }
    if type(e[3]) == "table" then
      s.master = addr(e[3])
      for i = 4, #e do
        if type(e[i]) == "table" then s.replicas[#s.replicas + 1] = addr(e[i]) end
      end
      shards[#shards + 1] = s
    end
  end
  return shards
end

local function install(st, shards)
  local slots, known = {}, {}
  for _, s in ipairs(shards) do
    known[s.master] = true
    for _, r in ipairs(s.replicas) do known[r] = true end
    for i = 1, #s.ranges - 1, 2 do
      for slot = s.ranges[i], s.ranges[i + 1] do slots[slot + 1] = s end
    end
  end
  st.slots, st.shards, st.epoch = slots, shards, st.epoch + 1
  for a in pairs(known) do st.known[a] = true end
end

-- Ask one node for the map: the shards, or nil, err.
local function ask_map(st, addr)
  local conn = C.pick(pool_at(st, addr, false))
  local v, err = C.send(conn, false, "CLUSTER", "SHARDS")
  if is_error(v) and v.err:find("^ERR unknown subcommand") then
    v, err = C.send(conn, false, "CLUSTER", "SLOTS")
    if type(v) == "table" and not is_error(v) then
      return from_slots(v, addr:match("^(.*):%d+$"))
    end
  end
  if v == nil then return nil, err end
  if is_error(v) then return nil, v.err end
  if type(v) ~= "table" then return nil, "unexpected reply to CLUSTER SHARDS" end
  return from_shards(v, addr:match("^%[?(.-)%]?:%d+$"))
end

-- Refresh the slot map: the seeds and every node seen, in turn, until one
-- answers. One refresh at a time: others wait for it. true, or nil, err.
local function refresh(st)
  if st.refreshing then
    local co = running()
    st.waiting[#st.waiting + 1] = co
    park()
    return st.shards ~= nil or nil, st.refresh_err
  end
  st.refreshing = true
  count("refreshes")
  local tried, err = {}, "no node answered"
  local order = {}
  for _, n in ipairs(st.cfg.seeds) do order[#order + 1] = addr_of(n[1], n[2]) end
  for a in pairs(st.known) do order[#order + 1] = a end
  local ok = false
  for _, a in ipairs(order) do
    if not tried[a] then
      tried[a] = true
      local shards, e = ask_map(st, a)
      if shards and #shards > 0 then
        install(st, shards)
        ok = true
        break
      end
      err = a .. ": " .. tostring(e or "no slots")
    end
  end
  st.refreshing, st.last_refresh = false, now()
  st.refresh_err = not ok and ("cluster: no slot map: " .. err) or nil
  local waiting = st.waiting
  st.waiting = {}
  for _, co in ipairs(waiting) do unpark(co) end
  if ok then return true end
  return nil, st.refresh_err
end

-- A refresh soon, in a coroutine of its own (after a MOVED), unless one
-- ran within refresh_every.
local function refresh_later(st)
  if st.refreshing or st.scheduled then return end
  st.scheduled = true
  local wait = math.max(0, M.refresh_every - (now() - st.last_refresh))
  C.current():schedule(wait, function()
    core.spawn(function()
      st.scheduled = false
      refresh(st)
    end)
  end)
end

local function state_of(self)
  local st = states[self.id]
  if st then return st end
  if not C.current() then return nil end
  st = { cfg = self, pools = {}, slots = {}, shards = nil, known = {}, epoch = 0,
         refreshing = false, scheduled = false, waiting = {}, last_refresh = 0, rr = 0,
         bound = {} }
  states[self.id] = st
  return st
end

-- ---- routing -----------------------------------------------------------------------

-- Where a command's first key is (its argument index, from 1), by name;
-- absent: the first argument. "none": no key.
local FIRST_KEY = {
  PING = "none", INFO = "none", TIME = "none", ECHO = "none", DBSIZE = "none",
  CLUSTER = "none", COMMAND = "none", CONFIG = "none", FLUSHALL = "none",
  FLUSHDB = "none", KEYS = "none", SCAN = "none", RANDOMKEY = "none", SCRIPT = "none",
  FUNCTION = "none", PUBLISH = "none", PUBSUB = "none", LASTSAVE = "none",
  ROLE = "none", READONLY = "none", READWRITE = "none", ASKING = "none",
  ACL = "none", CLIENT = "none", LATENCY = "none", MEMORY = 2, OBJECT = 2,
  SLOWLOG = "none", SWAPDB = "none", WAIT = "none", WAITAOF = "none",
  BITOP = 2, XINFO = 2, XGROUP = 2,
  ZUNION = 2, ZINTER = 2, ZDIFF = 2, ZINTERCARD = 2, SINTERCARD = 2,
  LMPOP = 2, ZMPOP = 2, BLMPOP = 3, BZMPOP = 3,
  EVAL = "numkeys", EVALSHA = "numkeys", EVAL_RO = "numkeys", EVALSHA_RO = "numkeys",
  FCALL = "numkeys", FCALL_RO = "numkeys",
  XREAD = "streams", XREADGROUP = "streams",
}
M.FIRST_KEY = FIRST_KEY

-- Commands that only read (replica reads).
local READS = {}
for _, n in ipairs { "GET", "MGET", "EXISTS", "STRLEN", "GETRANGE", "SUBSTR", "TTL", "PTTL",
                     "EXPIRETIME", "PEXPIRETIME", "TYPE", "HGET", "HMGET", "HGETALL", "HKEYS",
                     "HVALS", "HLEN", "HEXISTS", "HSTRLEN", "HRANDFIELD", "HSCAN", "LRANGE",
                     "LLEN", "LINDEX", "LPOS", "SMEMBERS", "SISMEMBER", "SMISMEMBER", "SCARD",
                     "SRANDMEMBER", "SINTER", "SUNION", "SDIFF", "SSCAN", "ZRANGE", "ZREVRANGE",
                     "ZRANGEBYSCORE", "ZREVRANGEBYSCORE", "ZRANGEBYLEX", "ZREVRANGEBYLEX",
                     "ZSCORE", "ZMSCORE", "ZCARD", "ZCOUNT", "ZLEXCOUNT", "ZRANK", "ZREVRANK",
                     "ZSCAN", "ZRANDMEMBER", "XRANGE", "XREVRANGE", "XLEN", "BITCOUNT",
                     "BITPOS", "GETBIT", "PFCOUNT", "GEOPOS", "GEODIST", "GEOHASH",
                     "GEOSEARCH", "DUMP", "EVAL_RO", "EVALSHA_RO", "FCALL_RO", "SORT_RO" } do
  READS[n] = true
end

-- The slot of a command (nil: it has no key).
local function slot_of(name, ...)
  local where = FIRST_KEY[name]
  local key
  if where == nil then
    key = (...)
  elseif where == "none" then
    return nil
  elseif where == "numkeys" then
    local nk = tonumber((select(2, ...)))
    if not nk or nk < 1 then return nil end
    key = (select(3, ...))
  elseif where == "streams" then
    for i = 1, select("#", ...) do
      local a = select(i, ...)
      if type(a) == "string" and a:upper() == "STREAMS" then
        key = (select(i + 1, ...))
        break
      end
    end
  else
    key = (select(where, ...))
  end
  if type(key) == "number" then key = tostring(math.tointeger(key) or key) end
  if type(key) ~= "string" then return nil end
  return slot_of_key(key)
end
M.slot_of = slot_of

-- The node a command goes to: its master, a replica for reads when asked,
-- any master when it has no key.
local function node_for(st, slot, read)
  local s = slot and st.slots[slot + 1]
  if s == nil then
    local shards = st.shards
    if not shards or #shards == 0 then return nil end
    st.rr = st.rr % #shards + 1
    s = shards[st.rr]
  end
  if read and #s.replicas > 0 then
    s.rr = ((s.rr or 0) % #s.replicas) + 1
    return s.replicas[s.rr], true
  end
  return s.master, false
end

-- ---- running commands ----------------------------------------------------------------

-- The error's redirect: "MOVED"|"ASK", slot, addr.
local function redirect(e)
  local kind, slot, addr = e:match("^(%u+) (%d+) (%S+)")
  if kind ~= "MOVED" and kind ~= "ASK" then return nil end
  if addr:sub(1, 1) == ":" then addr = "127.0.0.1" .. addr end   -- "endpoint unknown"
  return kind, math.tointeger(tonumber(slot)), addr
end
M.redirect = redirect

local RETRY = { TRYAGAIN = true, CLUSTERDOWN = true, LOADING = true, MASTERDOWN = true }

local function backoff(cfg, tries)
  local d = math.min(1, cfg.retry_delay * 2 ^ (tries - 1))
  if d > 0 then C.sleep(d) end
end

-- Point slot at addr's shard (after MOVED), making one if unknown.
local function move(st, slot, addr)
  for _, s in ipairs(st.shards or {}) do
    if s.master == addr then
      st.slots[slot + 1] = s
      return
    end
  end
  local s = { ranges = {}, replicas = {}, master = addr }
  st.shards = st.shards or {}
  st.shards[#st.shards + 1] = s
  st.slots[slot + 1] = s
  st.known[addr] = true
end

-- A redirect answer e (MOVED/ASK), counted; a MOVED applied to the map
-- (and a refresh asked for). The node to ASK, if it is an ASK; nil, kind
-- otherwise (nil, nil: no redirect).
local function follow(st, e)
  local kind, slot, addr = redirect(e)
  if kind == "MOVED" then
    count("moved")
    move(st, slot, addr)
    refresh_later(st)
  elseif kind == "ASK" then
    count("ask")
    return addr, kind
  end
  return nil, kind
end

-- Send one command (args packed, a table) where the map says, following
-- redirects and retrying failures; ask: a node to send it to once, after
-- ASKING. The reply as it came (Error objects kept), or nil, err.
local function run(st, read, args)
  local cfg = st.cfg
  if st.shards == nil then
    local ok, err = refresh(st)
    if not ok then return nil, err end
  end
  local name = args[1]
  local slot = slot_of(unpack(args, 1, args.n))
  local redirects, tries, asking = 0, 0, nil
  while true do
    local addr, ro
    if asking then
      addr, ro = asking, false
    else
      addr, ro = node_for(st, slot, read)
    end
    local v, err
    if addr == nil then
      err = "cluster: no node serves slot " .. tostring(slot)
    else
      local conn = C.pick(pool_at(st, addr, ro))
      if asking then
        local p = R.new_pipeline(nil, cfg)
        core.redis.cmd(p, "ASKING")
        core.redis.cmdv(p, args, args.n)
        local res, e = C.send_pipeline(conn, p)
        R.give_pipeline(p)
        if res then v = res[2] else err = e end
        asking = nil
      else
        conn.codec:cmdv(args, args.n)
        local w = core.redis.table(1, 2)
        w.n = 1
        if C.submit(conn, w) then
          C.wait(w)
        end
        if w.err then err = w.err else v = w[1] end
      end
    end
    if v ~= nil and is_error(v) then
      local ask, kind = follow(st, v.err)
      if kind then
        redirects = redirects + 1
        if redirects > cfg.max_redirects then
          return nil, "too many redirects (" .. v.err .. ")"
        end
        asking = ask
        goto continue
      end
      local code = v.err:match("^(%u+)")
      if not RETRY[code] then return v end
      err = v.err
      v = nil
    end
    if v ~= nil then return v end
    tries = tries + 1
    count("retries")
    if tries > cfg.max_retries then return nil, err end
    backoff(cfg, tries)
    refresh(st)
    ::continue::
  end
end
M.run = run

local main_on = R.on_main

local function command(self, name, ...)
  local st = states[self.id] or state_of(self)
  if st == nil then return main_on(self, "call", name, ...) end
  if not isyieldable() then R.internal.need_coroutine(2) end
  local bound = st.bound[running()]
  if bound then return result(C.send(bound, false, name, ...)) end
  if R.BLOCKING[name] and R.blocks(name, ...) then
    -- a blocking command: a connection of its own on its slot's master
    local slot = slot_of(name, ...)
    if st.shards == nil then refresh(st) end
    local addr = node_for(st, slot, false)
    if addr == nil then return nil, "cluster: no slot map" end
    local pool = pool_at(st, addr, false)
    local conn = C.acquire(pool, "dedicated")
    local v, err = C.send(conn, true, name, ...)
    C.release(pool, conn)
    return result(v, err)
  end
  return result(run(st, st.cfg.read_from == "replica" and READS[name], pack(name, ...)))
end

--- A Redis Cluster client, made by `netrun.redis.cluster`. It has the
-- methods of a `client` (every command is a method, named in lower case)
-- with these differences: a command goes to its first key's node, a
-- pipeline is split by node, a transaction and `cluster:watch` stay on
-- one node, and a command may be sent again after a failure.
-- @type cluster

--- Run any command by name, on the node of its first key's slot
-- (commands without a key: some master), following redirects and
-- retrying failures.
-- @function cluster:call
-- @string name the command, in any case
-- @param ... its arguments, strings and numbers
-- @return the reply, or nil, err (`"too many redirects (MOVED ...)"` past `max_redirects`)
function Cluster:call(name, ...)
  if type(name) ~= "string" then
    error("netrun.redis.cluster: c:call: the command name must be a string, got " .. type(name), 2)
  end
  local up = name:upper()
  local special = R.SPECIAL[up]
  if special and Cluster[special] then return Cluster[special](self, ...) end
  return command(self, up, ...)
end

setmetatable(Cluster, { __index = function(t, k)
  if type(k) ~= "string" or not k:match("^%a[%w_]*$") or k:sub(1, 2) == "__" then return nil end
  local name = k:upper()
  local f = function(self, ...) return command(self, name, ...) end
  rawset(t, k, f)
  return f
end })

--- Fetch the slot map on this loop now (else: on first use).
-- @function cluster:await
-- @treturn[1] cluster the client
-- @treturn[2] nil
-- @treturn[2] string why no node answered
function Cluster:await()
  local st = states[self.id] or state_of(self)
  if st == nil then return main_on(self, "await") end
  local ok, err = refresh(st)
  if not ok then return nil, err end
  return self
end

-- ---- pipelines ------------------------------------------------------------------------

-- A cluster pipeline records its commands; c:pipeline sends them by node.
local CPipe = {}
M.CPipe = CPipe
local CPipeMT = { __index = CPipe }

setmetatable(CPipe, { __index = function(t, k)
  if type(k) ~= "string" or not k:match("^%a[%w_]*$") or k:sub(1, 2) == "__" then return nil end
  local name = k:upper()
  local f = function(p, ...)
    local n = #p + 1
    p[n] = pack(name, ...)
  end
  rawset(t, k, f)
  return f
end })

function CPipe:call(name, ...)
  if type(name) ~= "string" then
    error("netrun.redis.cluster: p:call: the command name must be a string, got " .. type(name), 2)
  end
  self[#self + 1] = pack(name:upper(), ...)
end

function CPipe:eval(script, ...)
  if type(script) ~= "string" then
    error("netrun.redis.cluster: p:eval: the script must be a string, got " .. type(script), 2)
  end
  self[#self + 1] = pack("EVAL", script, ...)
end

-- Send the groups (addr -> { indices }) at once, each as a pipeline to its
-- node; put each reply at its command's index in res (or, for a group
-- whose connection failed, nothing: those are run again alone).
local function send_groups(st, cmds, groups, res)
  local co, pending, parked = running(), 0, false
  for key, idx in pairs(groups) do
    local ro = key:sub(1, 2) == "r "
    local pool = pool_at(st, ro and key:sub(3) or key, ro)
    local conn = C.pick(pool)
    local p = R.new_pipeline(nil, st.cfg)
    for _, i in ipairs(idx) do core.redis.cmdv(p, cmds[i], cmds[i].n) end
    local n = core.redis.append(conn.codec, p)
    R.give_pipeline(p)
    local w = core.redis.table(n, 2)
    w.n = n
    w.cb = function(w)
      if not w.err then
        for j, i in ipairs(idx) do res[i] = w[j] end
      end
      pending = pending - 1
      if pending == 0 and parked then unpark(co) end
    end
    pending = pending + 1
    if not C.submit(conn, w) then pending = pending - 1 end
  end
  if pending > 0 then
    parked = true
    park()
  end
end

-- Does a pipeline's reply call for the command to be run again alone?
-- A redirect is counted, and a MOVED applied to the map, here.
local function needs_rerun(st, v)
  if v == nil then return true end
  if not is_error(v) then return false end
  local _, kind = follow(st, v.err)
  if kind then return true end
  return RETRY[v.err:match("^(%u+)")] or false
end

-- What c:pipeline and c:transaction begin with: fn's commands recorded,
-- and this loop's state with a slot map. st, cmds; or false and what to
-- return (the main thread's answer, or nil, err).
local function recorded(self, what, fn)
  if type(fn) ~= "function" then
    error("netrun.redis.cluster: c:" .. what .. ": expects a function, got " .. type(fn), 3)
  end
  local st = states[self.id] or state_of(self)
  if st == nil then return false, pack(main_on(self, what, fn)) end
  if not isyieldable() then R.internal.need_coroutine(3) end
  local cmds = setmetatable({}, CPipeMT)
  fn(cmds)
  if st.shards == nil and #cmds > 0 then
    local ok, err = refresh(st)
    if not ok then return false, pack(nil, err) end
  end
  return st, cmds
end

--- As `client:pipeline`: the commands are split by node, sent to every
-- node at once and their replies put back in order; a command that was
-- redirected or whose node failed runs again alone.
-- @function cluster:pipeline
-- @tparam function fn `fn(p)`, which queues the commands (`p:call`, `p:eval`, `p:set`, ...)
-- @treturn[1] table the replies in order (error replies as `is_error` objects, nulls as `netrun.redis.null`)
-- @treturn[2] nil
-- @treturn[2] string why no slot map could be had
function Cluster:pipeline(fn)
  local st, cmds = recorded(self, "pipeline", fn)
  if not st then return unpack(cmds, 1, cmds.n) end
  local n = #cmds
  local res = { n = n }
  if n == 0 then return res end
  local groups = {}
  local read = st.cfg.read_from == "replica"
  for i = 1, n do
    local c = cmds[i]
    local addr, ro = node_for(st, slot_of(unpack(c, 1, c.n)), read and READS[c[1]])
    if addr then
      local key = ro and "r " .. addr or addr
      local g = groups[key]
      if g == nil then
        g = {}
        groups[key] = g
      end
      g[#g + 1] = i
    end
  end
  send_groups(st, cmds, groups, res)
  for i = 1, n do
    local v = res[i]
    if needs_rerun(st, v) then
      local err
      v, err = run(st, read and READS[cmds[i][1]], cmds[i])
      if v == nil then
        v = err and setmetatable({ err = err }, Error) or NULL
      end
    end
    if v == nil then v = NULL end
    res[i] = v
  end
  return res
end

--- As `client:transaction`, on the node of the first key (all the keys
-- must share a slot, as the server requires); sent again, whole, after a
-- redirect.
-- @function cluster:transaction
-- @tparam function fn `fn(t)`, which queues the commands
-- @return EXEC's array, or nil, err
function Cluster:transaction(fn)
  local st, cmds = recorded(self, "transaction", fn)
  if not st then return unpack(cmds, 1, cmds.n) end
  local slot
  for _, c in ipairs(cmds) do
    slot = slot_of(unpack(c, 1, c.n))
    if slot then break end
  end
  local redirects, tries, asking = 0, 0, nil
  while true do
    local addr = asking or node_for(st, slot, false)
    if addr == nil then return nil, "cluster: no node serves slot " .. tostring(slot) end
    local conn = C.pick(pool_at(st, addr, false))
    local p = R.new_pipeline(nil, st.cfg)
    if asking then core.redis.cmd(p, "ASKING") end
    core.redis.cmd(p, "MULTI")
    for _, c in ipairs(cmds) do core.redis.cmdv(p, c, c.n) end
    core.redis.cmd(p, "EXEC")
    local res, err = C.send_pipeline(conn, p)
    R.give_pipeline(p)
    asking = nil
    if res then
      local moved
      for i = 1, res.n do
        local v = res[i]
        if is_error(v) and redirect(v.err) then
          moved = v.err
          break
        end
      end
      if not moved then
        local ex = res[res.n]
        if is_error(res[1]) then return nil, res[1].err end
        return result(ex)
      end
      redirects = redirects + 1
      if redirects > st.cfg.max_redirects then return nil, "too many redirects (" .. moved .. ")" end
      asking = follow(st, moved)
    else
      tries = tries + 1
      count("retries")
      if tries > st.cfg.max_retries then return nil, err end
      backoff(st.cfg, tries)
      refresh(st)
    end
  end
end

--- As `client:eval`, on the node of the first key: EVALSHA, and EVAL on
-- NOSCRIPT.
-- @function cluster:eval
-- @string script the script's source
-- @int numkeys how many of the arguments are keys
-- @param ... the keys, then the other arguments
-- @return the script's reply, or nil, err
function Cluster:eval(script, ...)
  if type(script) ~= "string" then
    error("netrun.redis.cluster: c:eval: the script must be a string, got " .. type(script), 2)
  end
  local v, err = command(self, "EVALSHA", R.sha_of(script), ...)
  if v == nil and err and err:find("^NOSCRIPT") then
    v, err = command(self, "EVAL", script, ...)
  end
  return v, err
end

-- ---- WATCH / MULTI / EXEC on the node of the watched key ------------------------

local function bound_call(self, name, key, after, ...)
  local st = states[self.id] or state_of(self)
  if st == nil then
    error("netrun.redis.cluster: c:" .. name:lower() .. " holds a connection for a " ..
      "coroutine: call it inside netrun.spawn on a loop", 3)
  end
  if not isyieldable() then R.internal.need_coroutine(3) end
  local co = running()
  local conn = st.bound[co]
  if conn == nil or conn.closed then
    if st.shards == nil then refresh(st) end
    local addr = node_for(st, key and slot_of_key(key), false)
    if addr == nil then return nil, "cluster: no slot map" end
    conn = C.acquire(pool_at(st, addr, false), "dedicated")
    st.bound[co] = conn
  end
  local v, err = C.send(conn, false, name, ...)
  if after then
    st.bound[co] = nil
    C.release(conn.pool, conn)
  end
  return result(v, err)
end

--- WATCH keys, on the node of the first one: the coroutine keeps a
-- connection to that node until `cluster:exec`, `cluster:discard` or
-- `cluster:unwatch` (the keys must share a slot).
-- @function cluster:watch
-- @string key the first key
-- @string[opt] ... more keys
-- @return "OK", or nil, err
function Cluster:watch(key, ...)
  if type(key) ~= "string" then error("netrun.redis.cluster: c:watch: expects keys", 2) end
  return bound_call(self, "WATCH", key, false, key, ...)
end
--- MULTI, on the coroutine's connection (after `cluster:watch`: its
-- node's; else some master's).
-- @function cluster:multi
-- @return "OK", or nil, err
function Cluster:multi() return bound_call(self, "MULTI", nil, false) end
--- EXEC, and the coroutine's connection given back.
-- @function cluster:exec
-- @return EXEC's array; nil and no error if a watched key changed; or nil, err
function Cluster:exec() return bound_call(self, "EXEC", nil, true) end
--- DISCARD, and the coroutine's connection given back.
-- @function cluster:discard
-- @return "OK", or nil, err
function Cluster:discard() return bound_call(self, "DISCARD", nil, true) end
--- UNWATCH, and the coroutine's connection given back.
-- @function cluster:unwatch
-- @return "OK", or nil, err
function Cluster:unwatch() return bound_call(self, "UNWATCH", nil, true) end

-- ---- pub/sub ------------------------------------------------------------------------

-- Sharded channels (SSUBSCRIBE) go to the master of the channel's slot;
-- the others to any master (the cluster passes them on). A coroutine's
-- subscriptions on several nodes share one queue for read_reply.
local function sub_conn(self, st, addr)
  local co = running()
  local mine = st.subs and st.subs[co]
  if mine == nil then
    st.subs = st.subs or {}
    mine = { conns = {}, state = nil }
    st.subs[co] = mine
  end
  local conn = mine.conns[addr]
  if conn == nil or conn.closed then
    conn = C.acquire(pool_at(st, addr, false), "pubsub")
    conn.owner = co
    mine.conns[addr] = conn
    if mine.state then conn.sub = mine.state end
  end
  return conn, mine
end

local function subscribe(self, kind, ...)
  local st = states[self.id] or state_of(self)
  if st == nil then
    error("netrun.redis.cluster: c:" .. kind:lower() .. " holds a connection for a " ..
      "coroutine: call it inside netrun.spawn on a loop", 3)
  end
  if not isyieldable() then R.internal.need_coroutine(3) end
  if st.shards == nil then
    local ok, err = refresh(st)
    if not ok then return nil, err end
  end
  -- sharded channels: one command per slot (the server refuses a
  -- command whose channels span slots); the others: all on one master
  local by, sharded = {}, kind:sub(1, 1) == "S"
  for i = 1, select("#", ...) do
    local ch = select(i, ...)
    local slot = sharded and slot_of_key(tostring(ch)) or -1
    by[slot] = by[slot] or {}
    local l = by[slot]
    l[#l + 1] = ch
  end
  local last, err
  for slot, chans in pairs(by) do
    local addr = node_for(st, slot >= 0 and slot or nil, false)
    if addr == nil then return nil, "cluster: no node serves slot " .. slot end
    local conn, mine = sub_conn(self, st, addr)
    last, err = R.internal.subscribe_on(conn, kind, unpack(chans))
    mine.state = mine.state or conn.sub
    if not last then return nil, err end
  end
  return last
end

--- SUBSCRIBE to channels, on some master (the cluster passes messages
-- on); read them with `cluster:read_reply`. No callback form, and no
-- unsubscribe: `cluster:close` ends them.
-- @function cluster:subscribe
-- @string ... the channels
-- @return the last confirmation, or nil, err

--- PSUBSCRIBE to patterns, as `cluster:subscribe`.
-- @function cluster:psubscribe
-- @string ... the patterns
-- @return the last confirmation, or nil, err

--- SSUBSCRIBE to shard channels, each on the master of its slot. A slot
-- that moves (the server's `"sunsubscribe"` comes as a message) or a node
-- that fails (`nil, "closed"`) ends those subscriptions: subscribing
-- again is the caller's to do.
-- @function cluster:ssubscribe
-- @string ... the channels
-- @return the last confirmation, or nil, err
for _, kind in ipairs { "SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE" } do
  Cluster[kind:lower()] = function(self, ...) return subscribe(self, kind, ...) end
end

--- The next message of this coroutine's subscriptions, from any node (as
-- `client:read_reply`).
-- @function cluster:read_reply
-- @number[opt] timeout seconds to wait (none: for ever)
-- @treturn[1] table the message
-- @treturn[2] nil
-- @treturn[2] string `"timeout"`, `"closed"` or `"not subscribed"`
function Cluster:read_reply(timeout)
  local st = states[self.id]
  local mine = st and st.subs and st.subs[running()]
  if not mine then return nil, "not subscribed" end
  local conn
  for _, c in pairs(mine.conns) do
    if not c.closed then conn = c break end
  end
  if conn == nil then return nil, "closed" end
  return R.internal.read_on(conn, timeout)
end

--- Close this loop's connections of the client (and its slot map); a
-- command after it starts again.
-- @function cluster:close
-- @treturn boolean true
function Cluster:close()
  local st = states[self.id]
  if st == nil then return true end
  states[self.id] = nil
  for _, p in pairs(st.pools) do C.close_pool(p) end
  return true
end

--- The master this loop's slot map gives a slot to (for tests and
-- diagnosis).
-- @function cluster:slot_owner
-- @int slot 0 to 16383 (`netrun.redis.slot(key)`)
-- @treturn ?string `"host:port"`, or nil before the map is fetched
function Cluster:slot_owner(slot)
  local st = states[self.id]
  local s = st and st.slots[slot + 1]
  return s and s.master
end

--- @section end

function Cluster:__tostring()
  return string.format("netrun.redis.cluster(%d seeds, pool = %d)", #self.seeds, self.pool)
end

return M
