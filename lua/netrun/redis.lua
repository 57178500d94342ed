--- A Redis client (RESP2 and RESP3): `netrun.redis`, loaded on first use.
--
-- Every command is a method of a client, named as the command in lower
-- case (`r:get`, `r:hgetall`, `r:xadd`), or `client:call(name, ...)`;
-- arguments are strings and numbers. A command returns its reply; a null
-- reply is `nil` with no error; an error reply is `nil, "ERR ..."` (the
-- server's text); a failure `nil, "closed"`, `"timeout"`,
-- `"connect HOST:PORT: ..."` or `"protocol error: ..."`. Inside arrays (and in a
-- pipeline's result) a null is `netrun.redis.null` (`netrun.json.null`)
-- and an error reply an object `{ err = "..." }` (`is_error`). RESP3, the
-- default where the server speaks it, also gives maps as tables, doubles
-- and booleans.
--
-- A command waits for its reply in a coroutine on a loop (`netrun.spawn`,
-- a stream server's) and never blocks the loop; from the main thread (a
-- script, the REPL) it runs on a loop of a daemon group and blocks until
-- done. Each loop keeps its own `pool` connections to the server (1 by
-- default), opened on first use, and pipelines the commands of all its
-- coroutines on them; a coroutine that watches, begins a transaction,
-- subscribes or runs a blocking command (BLPOP, XREAD BLOCK, ...) gets a
-- connection of its own until it is done. Commands that would change a
-- shared connection (SELECT, HELLO, RESET, QUIT, MONITOR, CLIENT REPLY)
-- raise. The defaults are fields of the module: `pool` (1), `timeout` (5),
-- `max_reply` (64 MiB), `max_depth` (32), `max_line` (64 KiB),
-- `max_messages` (10,000). docs/guide/redis.md and docs/guide/limits.md.
-- @module netrun.redis
-- @usage local r = netrun.redis.connect { url = "redis://:secret@127.0.0.1:6379/0" }
-- netrun.spawn(function()
--   assert(r:await())
--   r:set("k", "v", "EX", 10)   --> "OK"
--   print(r:get("k"))           --> v
-- end)

-- netrun.redis: a Redis client on netrun's channels, with
-- the RESP codec of runtime/bindings/lredis.c. Cluster: netrun/redis/cluster.lua.
--
--   local r = netrun.redis.connect { url = "redis://:pass@127.0.0.1:6379/0",
--                                    timeout = 5, pool = 1, tls = nil }
--   r:await()                --> r | nil, err (one connection made and ready)
--   r:set("k", "v", "EX", 10)   --> "OK"          r:get("k") --> "v" | nil
--   r:pipeline(function(p) p:set("a", 1) p:get("a") end)  --> { "OK", "1" }
--   r:transaction(function(t) t:incr("n") t:get("n") end) --> EXEC's array
--   r:watch("k") ... r:multi() ... r:exec()      (a connection of its own)
--   r:eval(script, numkeys, ...)  --> EVALSHA, and EVAL on NOSCRIPT
--   r:subscribe("ch") r:read_reply([timeout]) r:unsubscribe()
--   r:subscribe("ch", function(msg) end) --> subscription (sub:close())
--   r:call("OBJECT", "ENCODING", "k")   any command by name
--
-- Calls: every command is a method (r:hgetall, r:xadd, ...: the method's
-- name in capitals is the command), returning the reply or nil, err. A
-- null reply is nil with no error; an error reply is nil, "ERR ..." (the
-- server's text); a network failure nil, "closed" / "timeout" / "connect
-- HOST:PORT: ..." / "protocol error: ...". Replies: strings, integers,
-- arrays; where the server speaks RESP3 (HELLO 3, Redis 6+, the default)
-- also maps as tables, doubles, booleans. Inside arrays (and in the array
-- a pipeline returns) a null is netrun.redis.null (netrun.json.null), so
-- that an array has no holes, and an error is an object
-- { err = "..." } (netrun.redis.is_error(v)). Arguments are strings and
-- numbers; anything else raises at the caller's line.
--
-- Connections: a client keeps, on each loop that uses it (in that loop's
-- own Lua state), up to `pool` connections opened on first use, and
-- sends every coroutine's commands on them, round robin: commands and
-- pipelines of many coroutines share a connection (their replies come
-- back in order), and what they send within one turn of the loop leaves
-- in one write. A coroutine that begins WATCH or MULTI, subscribes, or
-- calls a blocking command (BLPOP, XREAD BLOCK, ...) gets a connection of
-- its own until EXEC/DISCARD/UNWATCH, the last unsubscribe, or the reply;
-- idle ones are kept (up to `pool`) for the next. Commands that would
-- change a shared connection for everyone (SELECT, HELLO, RESET, QUIT,
-- MONITOR, CLIENT REPLY) raise: the database and credentials come from
-- the URL or the options.
--
-- Waiting: a command suspends the calling coroutine (netrun.spawn, a
-- stream server's) until its reply, and never blocks the loop. From the
-- main thread (a script, the REPL) it runs on a loop of a daemon group
-- ("redis", one thread) and blocks until done.
--
-- Timeouts: `timeout` (seconds, default 5; 0: none) bounds the connect and
-- each reply: a reply later than that fails its command with "timeout"
-- and closes the connection (commands queued behind it fail the same
-- way; the next command opens a new one). Blocking commands wait as
-- long as they asked the server to.
--
-- Bounds (a server that cannot be trusted): a reply larger than
-- max_reply bytes (64 MiB), nested deeper than max_depth (32), or with a
-- line longer than max_line (64 KiB) fails with "protocol error: ..." as
-- soon as its header says so, and the connection is closed; so does
-- garbage, and a reply nobody asked for. A subscriber that does not read
-- stops reading from the socket past max_messages (10,000) unread
-- messages (Redis then applies its own output limit).
local core = require "netrun.core"
local rcore = core.redis

--- The Redis Cluster hash slot of a key: CRC16 of the key, or of its
-- `{hash tag}`, modulo 16384 (what `cluster` routes by).
-- @function slot
-- @string key
-- @treturn int the slot, 0 to 16383

local M = {
  pool = 1, timeout = 5, max_reply = 64 << 20, max_depth = 32, max_line = 64 << 10,
  max_messages = 10000,
  null = rcore.null,             -- a null inside an array (netrun.json.null)
  slot = rcore.slot,             -- the cluster slot of a key
}

local NULL = rcore.null
local rcmd, rmethod, rappend, rtable = rcore.cmd, rcore.method, rcore.append, rcore.table
local now = core.now
local running, isyieldable = coroutine.running, coroutine.isyieldable
local pack, unpack, select, type, getmetatable = table.pack, table.unpack, select, type,
  getmetatable

-- ---- values -------------------------------------------------------------------

-- An error reply: { err = "ERR ..." }. Module-level, so that it travels
-- between states by name (a pipeline's result copied through a future).
local Error = {}
Error.__index = Error
function Error:__tostring() return self.err end
M.Error = Error

--- Whether a value is an error reply inside an array (a pipeline's
-- result, EXEC's, MGET's...): an object whose `err` field (and `tostring`)
-- is the server's text.
-- @param v a value
-- @treturn boolean
-- @function is_error
local function is_error(v) return type(v) == "table" and getmetatable(v) == Error end
M.is_error = is_error

-- ---- options and URLs -----------------------------------------------------------

local function unescape(s)
  return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

-- redis://[[user]:password@]host[:port][/db] (rediss:// for TLS) as a
-- table { tls, host, port, db, username, password }, or nil, why.
function M.parse_url(url)
  if type(url) ~= "string" then return nil, "url must be a string, got " .. type(url) end
  local scheme, rest = url:match("^([%a][%w+.-]*)://(.*)$")
  if not scheme then return nil, "not a redis:// or rediss:// URL" end
  scheme = scheme:lower()
  if scheme ~= "redis" and scheme ~= "rediss" then
    return nil, "unsupported scheme '" .. scheme .. "'"
  end
  local authority, path = rest:match("^([^/?#]*)([^?#]*)")
  local u = { tls = scheme == "rediss", db = 0 }
  local userinfo, hostport = authority:match("^(.*)@(.*)$")
  if userinfo then
    local user, pass = userinfo:match("^([^:]*):(.*)$")
    if user then
      u.username = user ~= "" and unescape(user) or nil
      u.password = unescape(pass)
    else
      u.username = unescape(userinfo)
    end
  else
    hostport = authority
  end
  local host, port = hostport:match("^%[([%x:.]+)%]:?(%d*)$")
  if not host then host, port = hostport:match("^([^:]*):?(%d*)$") end
  if not host or host == "" then return nil, "no host" end
  u.host = host
  u.port = port ~= "" and math.tointeger(tonumber(port)) or 6379
  if u.port < 1 or u.port > 65535 then return nil, "port out of range" end
  if path ~= "" and path ~= "/" then
    local db = path:match("^/(%d+)$")
    if not db then return nil, "the path must be a database number, got '" .. path .. "'" end
    u.db = math.tointeger(tonumber(db))
  end
  return u
end

-- The options of a client, checked by lopts.c's readers (core.options):
-- numeric strings are numbers, sizes may be "64k". The cluster client
-- takes these but url, host, port and db, and its own.
local SCHEMA = { url = "string", host = "string", port = "integer 1 65535", db = "integer 0",
                 username = "string", password = "string", timeout = "seconds",
                 connect_timeout = "seconds", tls = "any", pool = "integer 1 10000",
                 resp = "integer 2 3", name = "string", max_reply = "size 64",
                 max_depth = "integer 1 64", max_line = "size 16", max_messages = "integer 1" }
M.SCHEMA = SCHEMA
local check_connect = core.options("netrun.redis.connect", SCHEMA)

-- The settings of a client (plain data: it travels to loops) from its
-- options, checked. Shared with the cluster client, which checks its own.
function M.settings(what, opts)
  -- Absent values are false, not nil: a client's missing field would be
  -- a command method (Client's __index).
  local s = { db = 0, port = 6379, username = false, password = false, name = false,
              tls = false }
  if opts.url ~= nil then
    local u, why = M.parse_url(opts.url)
    if not u then core.raise(what .. ": bad url: " .. why) end
    for k, v in pairs(u) do s[k] = v end
  end
  s.host = opts.host or s.host or "127.0.0.1"
  s.port = opts.port or s.port
  s.db = opts.db or s.db
  for _, k in ipairs { "username", "password", "name" } do
    if opts[k] ~= nil then s[k] = opts[k] end
  end
  s.timeout = opts.timeout or M.timeout
  s.connect_timeout = opts.connect_timeout or s.timeout
  s.pool = opts.pool or M.pool
  s.resp = opts.resp or 3
  s.max_reply = opts.max_reply or M.max_reply
  s.max_depth = opts.max_depth or M.max_depth
  s.max_line = opts.max_line or M.max_line
  s.max_messages = opts.max_messages or M.max_messages
  local tls = opts.tls
  if tls == true or (tls == nil and s.tls) then
    tls = core.tls.client {}
  elseif tls == false then
    tls = nil
  elseif tls ~= nil and not (type(tls) == "userdata" and tostring(tls):match("^netrun%.tls%.client")) then
    core.option_error(what, "tls", tls, "true, false or a netrun.tls.client config")
  end
  s.tls = tls or false
  return s
end

-- ---- this state's clients -------------------------------------------------------

local C = require "netrun.redis.conn"
C.init(Error)
M.conn = C
local current, submit, pick = C.current, C.submit, C.pick
local park = core.park

local pools = {}                 -- client id -> pool (this state's)

local function need_coroutine(level)
  error("netrun.redis: a command waits for its reply: call it inside netrun.spawn " ..
    "(or a stream server's coroutine) on a loop", (level or 2) + 1)
end

local function result(v, err)
  if v == nil then return nil, err end
  if v == NULL then return nil end
  if type(v) == "table" and getmetatable(v) == Error then return nil, v.err end
  return v
end
M.result = result

local main_group                 -- the daemon group of main-thread calls

-- From the main thread: run self[method](self, ...) in a coroutine on
-- the daemon group's loop, and wait for it.
local function on_main(self, method, ...)
  main_group = main_group or require("netrun").group { threads = 1, name = "redis", daemon = true }
  local f = main_group:next():submit(function(c, m, ...)
    return require("netrun").spawn(function(...)
      return pack(c[m](c, ...))
    end, ...)
  end, self, method, ...)
  local t = f:sync():sync()
  return unpack(t, 1, t.n)
end
M.on_main = on_main

-- This state's pool of the client (nil on the main thread).
local function pool_of(self)
  local p = pools[self.id]
  if p then return p end
  if not current() then return nil end
  if getmetatable(self) == nil or type(self.id) ~= "string" then
    error("netrun.redis: call it as r:method(...)", 3)
  end
  p = C.new_pool(self, self.host, self.port, false)
  pools[self.id] = p
  return p
end

local BLOCKING = { BLPOP = true, BRPOP = true, BRPOPLPUSH = true, BLMOVE = true,
                   BLMPOP = true, BZPOPMIN = true, BZPOPMAX = true, BZMPOP = true,
                   WAIT = true, WAITAOF = true, XREAD = "BLOCK", XREADGROUP = "BLOCK" }
M.BLOCKING = BLOCKING
local FORBIDDEN = { SELECT = "the database", HELLO = "the protocol", RESET = "its state",
                    QUIT = "its state", MONITOR = "its replies", SYNC = "its replies",
                    PSYNC = "its replies" }

-- Does this command block the connection until the server has an answer?
local function blocks(name, ...)
  local b = BLOCKING[name]
  if b == true then return true end
  if b then                             -- XREAD: only with BLOCK
    for i = 1, select("#", ...) do
      local a = select(i, ...)
      if type(a) == "string" and a:upper() == b then return true end
    end
  end
  return false
end
M.blocks = blocks

-- A blocking command, on a connection of its own for as long as it waits.
local function blocking(pool, name, ...)
  local conn = C.acquire(pool, "dedicated")
  local v, err = C.send(conn, true, name, ...)
  C.release(pool, conn)
  return result(v, err)
end

-- A command on the client: the reply, or nil, err.
local function command(self, name, ...)
  local pool = pools[self.id] or pool_of(self)
  if pool == nil then return on_main(self, "call", name, ...) end
  if not isyieldable() then need_coroutine(2) end
  local conn
  if pool.nbound > 0 then conn = pool.bound[running()] end
  if conn == nil then
    if BLOCKING[name] and blocks(name, ...) then return blocking(pool, name, ...) end
    conn = pick(pool)
  end
  conn.codec:cmd(name, ...)
  local w = rtable(1, 2)
  w.n = 1
  if not submit(conn, w) then return nil, w.err end
  w.co = running()
  park()
  local err = w.err
  if err then return nil, err end
  local v = w[1]
  if v == NULL then return nil end
  if type(v) == "table" and getmetatable(v) == Error then return nil, v.err end
  return v
end

local Client = {}
Client.__index = Client
M.Client = Client

local function forbid(name, first, level)
  if FORBIDDEN[name] or (name == "CLIENT" and type(first) == "string" and first:upper() == "REPLY") then
    error(string.format("netrun.redis: %s would change %s of a connection other " ..
      "coroutines share: give db, credentials and protocol in connect { ... }", name,
      FORBIDDEN[name] or "its replies"), level + 1)
  end
end

-- Commands with a method of their own (r:call("MULTI") is r:multi()).
local SPECIAL = { WATCH = "watch", MULTI = "multi", EXEC = "exec", DISCARD = "discard",
                  UNWATCH = "unwatch", EVAL = "eval", SUBSCRIBE = "subscribe",
                  PSUBSCRIBE = "psubscribe", SSUBSCRIBE = "ssubscribe",
                  UNSUBSCRIBE = "unsubscribe", PUNSUBSCRIBE = "punsubscribe",
                  SUNSUBSCRIBE = "sunsubscribe" }
M.SPECIAL = SPECIAL

--- A client of one Redis server, made by `connect`. Besides the methods
-- below, every command is a method named as the command in lower case
-- (`r:hset(k, f, v)` is `r:call("HSET", k, f, v)`).
-- @type client

--- Run any command by name (`client:multi()` and the others with methods
-- of their own are called for theirs).
-- @function client:call
-- @string name the command, in any case
-- @param ... its arguments, strings and numbers
-- @return[1] the reply (`nil` and no error for a null)
-- @treturn[2] nil
-- @treturn[2] string the error reply's text, or the failure
-- @usage r:call("OBJECT", "ENCODING", "k")
function Client:call(name, ...)
  if type(name) ~= "string" then
    error("netrun.redis: r:call: the command name must be a string, got " .. type(name), 2)
  end
  local up = name:upper()
  if SPECIAL[up] then return self[SPECIAL[up]](self, ...) end
  forbid(up, (...), 2)
  return command(self, up, ...)
end

-- Methods for every other name: r:hgetall(k) is r:call("HGETALL", k).
setmetatable(Client, { __index = function(t, k)
  if type(k) ~= "string" or not k:match("^%a[%w_]*$") or k:sub(1, 2) == "__" then return nil end
  local name = k:upper()
  local f
  if FORBIDDEN[name] or name == "CLIENT" then
    f = function(self, ...)
      forbid(name, (...), 2)
      return command(self, name, ...)
    end
  else
    f = function(self, ...) return command(self, name, ...) end
  end
  rawset(t, k, f)
  return f
end })

-- ---- transactions: WATCH, MULTI, EXEC on a connection of the coroutine's --------

local function on_bound(self, name, before, after, ...)
  local pool = pools[self.id] or pool_of(self)
  if pool == nil then
    error("netrun.redis: r:" .. name:lower() .. " holds a connection for a coroutine: " ..
      "call it inside netrun.spawn on a loop (the main thread is not one)", 3)
  end
  if not isyieldable() then need_coroutine(3) end
  local conn = C.bind(pool, running(), "dedicated")
  if before then before(conn) end
  local v, err = C.send(conn, false, name, ...)
  if after then after(pool, conn, v) end
  return result(v, err)
end

--- WATCH keys: the coroutine keeps a connection of its own until `exec`,
-- `discard` or `unwatch` (in a coroutine on a loop).
-- @function client:watch
-- @string ... the keys
-- @return "OK", or nil, err
function Client:watch(...)
  return on_bound(self, "WATCH", function(c) c.watching = true end, nil, ...)
end

--- MULTI: begin a transaction on the coroutine's own connection; the
-- commands until `exec` answer "QUEUED".
-- @function client:multi
-- @return "OK", or nil, err
function Client:multi()
  return on_bound(self, "MULTI", function(c) c.multi = true end, nil)
end

local function done_tx(pool, conn)
  conn.multi, conn.watching = false, false
  C.unbind(pool, conn)
end

--- EXEC: run the transaction and give the coroutine's connection back.
-- @function client:exec
-- @return[1] the array of the commands' replies
-- @return[2] nil and no error: a watched key changed, nothing ran
-- @return[3] nil, err
function Client:exec()
  return on_bound(self, "EXEC", nil, done_tx)
end

--- DISCARD: drop the transaction and give the coroutine's connection back.
-- @function client:discard
-- @return "OK", or nil, err
function Client:discard()
  return on_bound(self, "DISCARD", nil, done_tx)
end

--- UNWATCH: forget the watched keys (and, outside MULTI, give the
-- coroutine's connection back).
-- @function client:unwatch
-- @return "OK", or nil, err
function Client:unwatch()
  return on_bound(self, "UNWATCH", nil, function(pool, conn)
    conn.watching = false
    if not conn.multi then C.unbind(pool, conn) end
  end)
end

-- ---- pipelines --------------------------------------------------------------------

-- A pipeline is a codec (lredis.c) with this metatable: p:set(...) is a
-- C function that encodes the command, nothing in Lua between.
local Pipeline = {}
M.Pipeline = Pipeline
local PipelineMT = { __index = Pipeline, __name = "netrun.redis.pipeline", __gc = rcore.gc }
M.PipelineMT = PipelineMT

setmetatable(Pipeline, { __index = function(t, k)
  if type(k) ~= "string" or not k:match("^%a[%w_]*$") or k:sub(1, 2) == "__" then return nil end
  local f = rmethod(k:upper())
  rawset(t, k, f)
  return f
end })

--- The commands of a `client:pipeline` or `client:transaction`, queued
-- (encoded at once, sent when `fn` returns). Every command is a method
-- here too (`p:set(k, v)`), returning nothing; its reply is in the result.
-- @type pipeline

--- Queue any command by name.
-- @function pipeline:call
-- @string name the command, in any case
-- @param ... its arguments, strings and numbers
function Pipeline:call(name, ...)
  if type(name) ~= "string" then
    error("netrun.redis: p:call: the command name must be a string, got " .. type(name), 2)
  end
  rcmd(self, name:upper(), ...)
end

-- What a pipeline's scripts need: the pool (whose server may know them:
-- kept with the codec, rcore.ctx), the scripts sent with EVAL (known once
-- they ran), and those sent with EVALSHA (sent again with EVAL if the
-- server forgot them).
local pstate = setmetatable({}, { __mode = "k" })
local rctx = rcore.ctx

local shas = {}
local nshas = 0
local function sha_of(script)
  local s = shas[script]
  if s == nil then
    if nshas >= 1000 then shas, nshas = {}, 0 end   -- scripts made on the fly: bounded
    s = rcore.sha1(script)
    shas[script] = s
    nshas = nshas + 1
  end
  return s
end

--- Queue a Lua script: EVALSHA if this server ran it before, else EVAL (a
-- NOSCRIPT answer is retried with EVAL when the pipeline is done; a
-- cluster's pipeline always sends EVAL).
-- @function pipeline:eval
-- @string script the script's source
-- @int numkeys how many of the arguments are keys
-- @param ... the keys, then the other arguments
function Pipeline:eval(script, ...)
  if type(script) ~= "string" then
    error("netrun.redis: p:eval: the script must be a string, got " .. type(script), 2)
  end
  local st = pstate[self]
  if st == nil then
    st = {}
    pstate[self] = st
  end
  local pool = rctx(self)
  local sha = sha_of(script)
  local i = rcore.waiting_cmds(self) + 1
  if pool and pool.scripts[sha] then
    rcmd(self, "EVALSHA", sha, ...)
    st.evals = st.evals or {}
    st.evals[i] = pack(script, ...)
  else
    rcmd(self, "EVAL", script, ...)
    st.loads = st.loads or {}
    st.loads[i] = sha
  end
end

local free_pipes = {}
local function new_pipeline(pool, cfg)
  local n = #free_pipes
  local p
  if n > 0 then
    p = free_pipes[n]
    free_pipes[n] = nil
  else
    p = rcore.codec(cfg.max_reply, cfg.max_depth, cfg.max_line, Error, PipelineMT)
  end
  rctx(p, pool)
  return p
end
M.new_pipeline = new_pipeline

local function give_pipeline(p)
  rctx(p, nil)
  pstate[p] = nil
  if #free_pipes < 16 and rcore.waiting(p) == 0 then free_pipes[#free_pipes + 1] = p end
end
M.give_pipeline = give_pipeline
M.pipeline_state = pstate

-- After a pipeline: scripts it loaded are known; EVALSHAs the server
-- had forgotten run again with EVAL.
local function fix_scripts(self, pool, st, res)
  if st.loads then
    for i, sha in pairs(st.loads) do
      if not is_error(res[i]) then pool.scripts[sha] = true end
    end
  end
  if st.evals then
    for i, a in pairs(st.evals) do
      local v = res[i]
      if is_error(v) and v.err:find("^NOSCRIPT") then
        pool.scripts[sha_of(a[1])] = nil
        local r, err = self:eval(unpack(a, 1, a.n))
        if r == nil and err then r = setmetatable({ err = err }, Error) end
        res[i] = r == nil and NULL or r
      end
    end
  end
end
M.fix_scripts = fix_scripts

--- @type client

--- Send many commands in one write: `fn(p)` queues them on a `pipeline`
-- (`p:set(...)`, `p:call(...)`), and their replies come back as one array
-- in the same order. An empty pipeline sends nothing.
-- @function client:pipeline
-- @tparam function fn `fn(p)`, which queues the commands
-- @treturn[1] table the replies (error replies as `is_error` objects,
-- nulls as `netrun.redis.null`; `n` the count)
-- @treturn[2] nil
-- @treturn[2] string why the connection failed
-- @usage local res = r:pipeline(function(p) p:incr("n") p:get("n") end)
function Client:pipeline(fn)
  if type(fn) ~= "function" then
    error("netrun.redis: r:pipeline: expects a function(p), got " .. type(fn), 2)
  end
  local pool = pools[self.id] or pool_of(self)
  if pool == nil then return on_main(self, "pipeline", fn) end
  if not isyieldable() then need_coroutine(2) end
  local p = new_pipeline(pool, self)
  fn(p)
  if rcore.waiting_cmds(p) == 0 then
    give_pipeline(p)
    return { n = 0 }
  end
  local st = pstate[p]
  local conn
  if pool.nbound > 0 then conn = pool.bound[running()] end
  local res, err = C.send_pipeline(conn or pick(pool), p)
  give_pipeline(p)
  if res and st then fix_scripts(self, pool, st, res) end
  return res, err
end

--- A transaction in one write: `fn(t)` queues commands on a `pipeline`,
-- sent between MULTI and EXEC. A command the server refused to queue
-- aborts all ("EXECABORT ..."). After `watch`, on the coroutine's
-- connection, a nil with no error means a watched key changed and
-- nothing ran.
-- @function client:transaction
-- @tparam function fn `fn(t)`, which queues the commands
-- @return[1] EXEC's array of replies
-- @return[2] nil, err
-- @usage r:transaction(function(t) t:incr("a") t:incr("b") end)   --> { 1, 1 }
function Client:transaction(fn)
  if type(fn) ~= "function" then
    error("netrun.redis: r:transaction: expects a function(t), got " .. type(fn), 2)
  end
  local pool = pools[self.id] or pool_of(self)
  if pool == nil then return on_main(self, "transaction", fn) end
  local bound = pool.nbound > 0 and pool.bound[running()]
  local res, err = self:pipeline(function(p)
    p:multi()
    fn(p)
    p:exec()
  end)
  if bound then done_tx(pool, bound) end
  if not res then return nil, err end
  if is_error(res[1]) then return nil, res[1].err end      -- MULTI refused
  return result(res[res.n])
end

-- ---- scripts --------------------------------------------------------------------

--- Run a Lua script: EVALSHA by its SHA-1 (computed once per script),
-- and EVAL when the server answers NOSCRIPT.
-- @function client:eval
-- @string script the script's source
-- @int numkeys how many of the arguments are keys
-- @param ... the keys, then the other arguments
-- @return the script's reply, or nil, err
-- @usage r:eval("return redis.call('GET', KEYS[1])", 1, "k")
function Client:eval(script, ...)
  if type(script) ~= "string" then
    error("netrun.redis: r:eval: the script must be a string, got " .. type(script), 2)
  end
  local pool = pools[self.id] or pool_of(self)
  if pool == nil then return on_main(self, "eval", script, ...) end
  local sha = sha_of(script)
  local v, err = command(self, "EVALSHA", sha, ...)
  if v == nil and err and err:find("^NOSCRIPT") then
    v, err = command(self, "EVAL", script, ...)
  end
  if v ~= nil or err == nil then pool.scripts[sha] = true end
  return v, err
end
M.sha_of = sha_of

-- ---- the client -------------------------------------------------------------------

-- Clients are told apart across states by an id unique in the process.
local function new_id(prefix)
  local d = core.dict("netrun.redis", { capacity = 64 })
  return prefix .. d:incr("clients", 1, 0)
end
M.new_id = new_id

--- @section end

--- A client of one Redis server. Nothing is sent yet: the first command on
-- a loop connects (`client:await` connects now). Made anywhere, used on
-- any loop. On every new connection AUTH (or `HELLO 3 AUTH`), SELECT and
-- the name are sent before any command.
-- @tparam table opts
-- @string[opt] opts.url `redis://[[user]:password@]host[:port][/db]`, `rediss://` for TLS
-- @string[opt="127.0.0.1"] opts.host the server (instead of the URL's)
-- @int[opt=6379] opts.port
-- @int[opt=0] opts.db the database (SELECT)
-- @string[opt] opts.username
-- @string[opt] opts.password
-- @string[opt] opts.name the connections' name (CLIENT SETNAME)
-- @number[opt=5] opts.timeout seconds for the connect and each reply (0: none); a late reply fails its command and closes the connection
-- @number[opt=timeout] opts.connect_timeout seconds for the connect
-- @int[opt=1] opts.pool connections per loop
-- @int[opt=3] opts.resp the protocol, 2 or 3 (3 falls back to 2 where the server lacks HELLO)
-- @param[opt] opts.tls `true`, `false` or a `netrun.tls.client` config (`rediss://`: the system's CAs, the host name checked)
-- @int[opt=67108864] opts.max_reply the largest reply, bytes
-- @int[opt=32] opts.max_depth the deepest nesting of a reply
-- @int[opt=65536] opts.max_line the longest line of a reply
-- @int[opt=10000] opts.max_messages unread pub/sub messages before the connection stops reading
-- @treturn client
-- @usage local r = netrun.redis.connect { host = "127.0.0.1", pool = 4 }
function M.connect(opts)
  local s = M.settings("netrun.redis.connect", check_connect(opts) or {})
  s.id = new_id("r")
  return setmetatable(s, Client)
end

--- @type client

--- Connect now: a connection made and ready on this loop (on the main
-- thread: on the daemon group's).
-- @function client:await
-- @treturn[1] client the client
-- @treturn[2] nil
-- @treturn[2] string why not
function Client:await()
  if pools[self.id] == nil and not current() then return on_main(self, "await") end
  local v, err = command(self, "PING")
  if v == nil then return nil, err end
  return self
end

--- Close this loop's connections of the client; a command after it opens
-- new ones.
-- @function client:close
-- @treturn boolean true
function Client:close()
  local pool = pools[self.id]
  if pool == nil then return true end
  pools[self.id] = nil
  C.close_pool(pool)
  return true
end

function Client:__tostring()
  return string.format("netrun.redis.client(%s:%d/%d, pool = %d)", self.host, self.port,
    self.db, self.pool)
end

--- This loop's connections of the client.
-- @function client:stats
-- @treturn table `{ shared, idle, bound, unread }`: connections shared by
-- the coroutines, kept idle, held by one coroutine, and pub/sub messages
-- waiting for `client:read_reply`
function Client:stats()
  local pool = pools[self.id]
  if pool == nil then return { shared = 0, idle = 0, bound = 0, unread = 0 } end
  local shared, unread = 0, 0
  for _, c in pairs(pool.conns) do if not c.closed then shared = shared + 1 end end
  for _, c in pairs(pool.bound) do
    if c.sub then unread = unread + (c.sub.mt - c.sub.mh + 1) end
  end
  return { shared = shared, idle = #pool.idle, bound = pool.nbound, unread = unread }
end

-- Pub/sub adds its methods; the cluster client is its own module.
M.internal = { pools = pools, command = command, pool_of = function(self)
                 return pools[self.id] or pool_of(self) end,
               need_coroutine = need_coroutine }
require("netrun.redis.pubsub")(M)

--- @section end

--- A Redis Cluster client, with the methods of a `client` (its class:
-- `cluster`). Each loop fetches the slot map (CLUSTER SHARDS, CLUSTER
-- SLOTS before Redis 7) on first use; a command goes to the master of its
-- first key's slot (`slot`). MOVED moves the slot and refreshes the map;
-- ASK sends the command once to the node named; a failed connection,
-- TRYAGAIN, CLUSTERDOWN or LOADING refresh the map and send the command
-- again after a growing delay (so a command may run more than once).
-- Redirects and retries are counted in `netrun.metrics`.
-- @tparam table opts the options of `connect` but `url`, `host`, `port` and `db`, and:
-- @tparam {string,...} opts.nodes seed nodes, `"host:port"`
-- @string[opt="master"] opts.read_from `"replica"`: read-only commands go to the slot's replicas (READONLY, round robin)
-- @int[opt=16] opts.max_redirects redirects a command follows before it fails
-- @int[opt=8] opts.max_retries times a command is sent again after a failure
-- @number[opt=0.05] opts.retry_delay seconds before the first retry, doubled up to 1 s
-- @treturn cluster
-- @usage local c = netrun.redis.cluster { nodes = { "10.0.0.1:6379", "10.0.0.2:6379" } }
function M.cluster(opts)
  return require("netrun.redis.cluster").new(opts)
end

return M
