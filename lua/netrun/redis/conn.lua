-- netrun.redis.conn: the connections under netrun.redis and its cluster
-- client, in each loop's own Lua state (nothing here crosses threads).
--
-- A pool holds the connections of one client (or cluster node) on this
-- loop: up to cfg.pool shared ones, used by every coroutine (one per turn
-- of the loop, round robin),
-- and dedicated ones (idle, or bound to a coroutine for WATCH/MULTI,
-- pub/sub and blocking commands).
--
-- A connection is a channel whose last handler is a Handler of this
-- file, and a codec (runtime/bindings/lredis.c) that encodes what is to
-- be sent and decodes what comes back. Commands are encoded into the
-- codec as they are called; the bytes leave in one write per connection
-- when the replies being handed out have all been handed out (a read of
-- many replies wakes many coroutines, and what they send next goes in
-- one write), or after the loop's current iteration otherwise.
--
-- Replies come back in the order commands were sent, so each connection
-- keeps a queue (a ring) of waiters, { n = replies due, co = the parked
-- coroutine | cb = an internal callback, [1..n] = the replies }; the
-- head takes the replies as they are decoded (conn.got counts them) and
-- is completed, exactly once, with them or with w.err set when the
-- connection fails. A coroutine waits parked (core.park), not on a
-- promise: nothing is allocated for the wait.
--
-- A connection is opened on first use: commands queue at once and leave
-- after the handshake (HELLO 3 with AUTH and SETNAME, or AUTH on a server
-- without HELLO; SELECT, READONLY), which has a little queue of its own.
--
-- Timeouts: a watchdog timer runs every timeout/2 while replies are due;
-- the same waiter at the head of the queue three times running (due for
-- at least `timeout`, at most 1.5 x) fails the connection with
-- "timeout", and with it every command queued on it. Blocking commands
-- are exempt. Nothing per command: no clock read, no timer.
local core = require "netrun.core"
local rcore = core.redis

local C = {}

local park, unpark = core.park, core.unpark
local running = coroutine.running
local rtable = rcore.table

-- The loop this state runs (false: the main thread), asked once.
local here
function C.current()
  if here == nil then here = core.current() or false end
  return here or nil
end

local Handler = {}                 -- the pipeline handler of a connection
Handler.__index = Handler
C.Handler = Handler

local Error                        -- netrun.redis's error reply class (C.init)
function C.init(error_mt) Error = error_mt end

-- A pool: the connections of one server on this loop.
function C.new_pool(cfg, host, port, readonly)
  return { cfg = cfg, host = host, port = port, readonly = readonly or false,
           loop = C.current(), max = cfg.pool, conns = {}, rr = 0, cur = false, idle = {},
           bound = {}, nbound = 0, scripts = {},
           name = (host:find(":", 1, true) and "[" .. host .. "]" or host) .. ":" .. port }
end

-- Codecs for handshakes (small, reused).
local scratch = {}
local function take_codec(cfg)
  local n = #scratch
  if n > 0 then
    local c = scratch[n]
    scratch[n] = nil
    return c
  end
  return rcore.codec(cfg.max_reply, cfg.max_depth, cfg.max_line, Error)
end

local function give_codec(c)
  if #scratch < 16 and c:waiting() == 0 then scratch[#scratch + 1] = c end
end

local fail_conn, flush

-- ---- flushing ----------------------------------------------------------------------

-- Replies being handed out (dispatch below): connections written to
-- meanwhile are flushed once it ends.
local dispatching, dirty, ndirty = 0, {}, 0

local function schedule_flush(conn)
  conn.flushing = true
  if dispatching > 0 then
    ndirty = ndirty + 1
    dirty[ndirty] = conn
  else
    conn.loop:after_iteration(flush, conn)
  end
end

local rsend = rcore.send

function flush(conn)
  conn.flushing = false
  if conn.closed or not conn.ready then return end
  rsend(conn.codec, conn.ch)
  conn.qsent = conn.qn               -- every queued command is on its way
end

local function flush_dirty()
  local i = 1
  while i <= ndirty do
    local c = dirty[i]
    dirty[i] = nil
    flush(c)
    i = i + 1
  end
  ndirty = 0
end

-- ---- the queue of waiters (a ring) ---------------------------------------------------

local QCAP = 64

local function grow(conn)
  local q, cap, h = conn.q, conn.qcap, conn.qh
  local nq = rtable(cap * 2, 0)
  for i = 1, cap do
    nq[i] = q[h]
    h = h == cap and 1 or h + 1
  end
  conn.q, conn.qh, conn.qcap = nq, 1, cap * 2
end

local watchdog

-- Queue w (its commands are in conn.codec already); false if conn is
-- closed (then w.err is set and nothing waits).
local function submit(conn, w)
  if conn.closed then
    w.err = conn.err or "closed"
    return false
  end
  local n, cap = conn.qn, conn.qcap
  if n == cap then
    grow(conn)
    cap = conn.qcap
  end
  local i = conn.qh + n
  if i > cap then i = i - cap end
  conn.q[i] = w
  conn.qn = n + 1
  if not conn.timer and conn.timeout then
    conn.timer = true
    conn.loop:schedule(conn.timeout / 2, watchdog, conn)
  end
  if conn.ready and not conn.flushing then schedule_flush(conn) end
  return true
end
C.submit = submit

-- The head waiter is done: take it off the queue.
local function pop(conn)
  local h = conn.qh
  conn.q[h] = nil
  conn.qh = h == conn.qcap and 1 or h + 1
  conn.qn = conn.qn - 1
  if conn.qsent > 0 then conn.qsent = conn.qsent - 1 end
  conn.got = 0
end
C.pop = pop

local function head(conn)
  if conn.qn == 0 then return nil end
  return conn.q[conn.qh]
end
C.head = head

-- Wake w's coroutine (or run its callback).
local function complete(w)
  local co = w.co
  if co then
    w.co = nil
    return unpark(co)
  end
  local cb = w.cb
  if cb then return cb(w) end
end
C.complete = complete

-- Sleep in a coroutine, parked with a plain timer: unlike netrun.sleep
-- (a promise and a listener), nothing is left allocated if the loop
-- shuts down meanwhile.
function C.sleep(seconds)
  local co = running()
  C.current():schedule(seconds, function() unpark(co) end)
  park()
end

-- Park the running coroutine until w completes (after submit).
local function wait(w)
  w.co = running()
  park()
end
C.wait = wait

function watchdog(conn)
  conn.timer = false
  if conn.closed then return end
  local w = conn.ready and head(conn) or conn.hs[conn.hsh]
  if w == nil then
    conn.seen = nil
    return
  end
  if w == conn.seen and not w.block then
    conn.strikes = conn.strikes + 1
    if conn.strikes >= 2 then return fail_conn(conn, "timeout") end
  else
    conn.seen, conn.strikes = w, 0
  end
  conn.timer = true
  conn.loop:schedule(conn.timeout / 2, watchdog, conn)
end

-- ---- opening: connect and handshake -------------------------------------------------

local function ready(conn)
  conn.ready = true
  if not conn.flushing then flush(conn) end
end

local function handshake(conn)
  local cfg, cmds = conn.cfg, {}
  if conn.resp == 3 then
    local hello = { "HELLO", "3" }
    if cfg.password then
      hello[#hello + 1], hello[#hello + 2], hello[#hello + 3] = "AUTH",
        cfg.username or "default", cfg.password
    end
    if cfg.name then hello[#hello + 1], hello[#hello + 2] = "SETNAME", cfg.name end
    cmds[1] = hello
  else
    if cfg.password then
      cmds[#cmds + 1] = cfg.username and { "AUTH", cfg.username, cfg.password }
        or { "AUTH", cfg.password }
    end
    if cfg.name then cmds[#cmds + 1] = { "CLIENT", "SETNAME", cfg.name } end
  end
  if cfg.db ~= 0 then cmds[#cmds + 1] = { "SELECT", cfg.db } end
  if conn.pool.readonly then cmds[#cmds + 1] = { "READONLY" } end
  if #cmds == 0 then return ready(conn) end
  local c = take_codec(cfg)
  for _, a in ipairs(cmds) do c:cmdv(a) end
  local w = { n = #cmds, got = 0, cb = function(w)
    for i = 1, w.n do
      local v = w[i]
      if type(v) == "table" and getmetatable(v) == Error then
        if i == 1 and conn.resp == 3 and (v.err:find("^ERR unknown command") or
                                          v.err:find("^NOPROTO")) then
          conn.resp = 2                  -- a server before Redis 6: RESP2
          return handshake(conn)
        end
        return fail_conn(conn, v.err)
      end
    end
    ready(conn)
  end }
  conn.hst = conn.hst + 1
  conn.hs[conn.hst] = w
  if not conn.timer and conn.timeout then
    conn.timer = true
    conn.loop:schedule(conn.timeout / 2, watchdog, conn)
  end
  conn.ch:write_and_flush(c:out())
  give_codec(c)
end

local function connect_failed(conn, f)
  local cause = tostring(f:cause()):gsub("^netrun%.connect: ", "")
  if not cause:find(conn.pool.name, 1, true) then cause = conn.pool.name .. ": " .. cause end
  fail_conn(conn, "connect " .. cause)
end

-- Handlers of connections being made, by number: the channel's init
-- (packed, so it cannot hold the handler itself) takes its own from here,
-- on this loop, before any byte or error can reach the pipeline's tail.
local attaching, nattach = {}, 0

function C.attach(ch, id)
  local h = attaching[id]
  attaching[id] = nil
  if h then ch:pipeline():add_last("redis", h) end
end

-- A connection to the pool's server, connecting (commands may be queued
-- at once). mode: "shared", "dedicated" or "pubsub".
function C.new_conn(pool, mode)
  local cfg = pool.cfg
  local conn = {
    pool = pool, cfg = cfg, loop = pool.loop, mode = mode, resp = cfg.resp,
    codec = rcore.codec(cfg.max_reply, cfg.max_depth, cfg.max_line, Error),
    q = rtable(QCAP, 0), qh = 1, qn = 0, qcap = QCAP, got = 0, qsent = 0,
    hs = {}, hsh = 1, hst = 0,
    ready = false, closed = false, flushing = false, timer = false, strikes = 0,
    timeout = cfg.timeout > 0 and cfg.timeout or false,
  }
  nattach = nattach + 1
  local id = nattach
  attaching[id] = setmetatable({ conn = conn }, Handler)
  require("netrun").connect {
    group = conn.loop, host = pool.host, port = pool.port,
    timeout = cfg.connect_timeout > 0 and cfg.connect_timeout or nil, tls = cfg.tls or nil,
    init = function(ch) require("netrun.redis.conn").attach(ch, id) end,
  }:add_listener(function(f)
    attaching[id] = nil
    if not f:is_success() then return connect_failed(conn, f) end
    local ch = f:result()
    conn.ch = ch
    if conn.closed then return ch:close() end
    handshake(conn)
  end)
  return conn
end

-- Close conn and fail everything it was due to answer with err.
function fail_conn(conn, err)
  if conn.closed then return end
  conn.closed, conn.ready, conn.err = true, false, err
  if conn.ch then conn.ch:close() end
  for i = conn.hsh, conn.hst do conn.hs[i] = nil end
  conn.hsh = conn.hst + 1
  while conn.qn > 0 do
    local w = conn.q[conn.qh]
    pop(conn)
    w.err = err
    complete(w)
  end
  local sub = conn.sub             -- a pub/sub reader (pubsub.lua)
  if sub and sub.reader then
    local co = sub.reader
    sub.reader = nil
    unpark(co)
  end
  local owner, pool = conn.owner, conn.pool
  if owner and pool.bound[owner] == conn then
    pool.bound[owner] = nil
    pool.nbound = pool.nbound - 1
  end
end
C.fail_conn = fail_conn

-- ---- reading ------------------------------------------------------------------------

-- A reply nobody asked for: a RESP3 push (to conn.on_push, if any), else
-- a broken server.
local function unsolicited(conn, why)
  if why == "push" then
    local t = {}
    conn.codec:take(t, 1, 1, true)
    if conn.on_push then conn.on_push(conn, t[1]) end
    return
  end
  return fail_conn(conn, why or "protocol error: a reply nobody asked for")
end

-- A take stopped short of its count: a push to hand on (and go on: true),
-- more bytes to wait for, or the codec failed (the connection goes).
local function stopped(conn, why)
  if why == "push" then
    unsolicited(conn, why)
    return true
  end
  if why then fail_conn(conn, why) end
  return false
end

-- Hand the replies read to their waiters, in order (a push may come
-- between them). Nulls are NULL here; a single command's caller makes
-- its own nil. Only commands already sent (qsent of the queue) may take
-- a reply: one queued meanwhile -- by a coroutine woken here -- has not
-- left yet, and bytes read before it left are no answer to it.
local function drain(conn)
  local codec = conn.codec
  while not conn.closed do
    if conn.qsent == 0 then
      if codec:buffered() == 0 then return end
      local t = {}
      local k, why = codec:take(t, 1, 1)
      if why == "push" then
        unsolicited(conn, why)
      elseif k == 1 then
        return fail_conn(conn, "protocol error: a reply nobody asked for")
      else
        if why then fail_conn(conn, why) end
        return
      end
    else
      local w = conn.q[conn.qh]
      local got, n = conn.got, w.n
      local k, why = codec:take(w, got + 1, n - got, false, true)
      got = got + k
      if got == n then
        pop(conn)
        complete(w)
      else
        conn.got = got
        if not stopped(conn, why) then return end
      end
    end
  end
end

local function drain_handshake(conn)
  local codec, hs = conn.codec, conn.hs
  while not conn.closed and not conn.ready do
    local w = hs[conn.hsh]
    if w == nil then return end
    local k, why = codec:take(w, w.got + 1, w.n - w.got)
    w.got = w.got + k
    if w.got == w.n then
      hs[conn.hsh] = nil
      conn.hsh = conn.hsh + 1
      complete(w)
    elseif not stopped(conn, why) then
      return
    end
  end
end

local function read(conn)
  if not conn.ready then drain_handshake(conn) end
  if conn.ready then
    if conn.mode == "pubsub" then C.drain_pubsub(conn) else drain(conn) end
  end
end

function Handler:channel_read(ctx, msg)
  local conn = self.conn
  conn.codec:feed(msg)
  dispatching = dispatching + 1
  local ok, err = pcall(read, conn)
  dispatching = dispatching - 1
  if dispatching == 0 and ndirty > 0 then flush_dirty() end
  if not ok then
    fail_conn(conn, "internal error: " .. tostring(err))
    error(err, 0)
  end
end

function Handler:channel_inactive(ctx)
  fail_conn(self.conn, "closed")
end

function Handler:exception_caught(ctx, err)
  fail_conn(self.conn, tostring(err))
end

-- ---- choosing a connection ----------------------------------------------------------

-- The shared connection for a command (opened on demand). With several,
-- the commands of one turn of the loop (what the coroutines woken by a
-- read send next, say) stay on one connection, to leave in one write;
-- the next turn's go to the next connection (round robin).
local function pick(pool)
  local max = pool.max
  local i = 1
  if max > 1 then
    local c = pool.cur
    if c and c.flushing and not c.closed then return c end
    i = pool.rr % max + 1
    pool.rr = i
  end
  local c = pool.conns[i]
  if c == nil or c.closed then
    c = C.new_conn(pool, "shared")
    pool.conns[i] = c
  end
  pool.cur = c
  return c
end
C.pick = pick

-- The connection a coroutine's command goes to: its own, else shared.
function C.conn_for(pool)
  if pool.nbound > 0 then
    local c = pool.bound[running()]
    if c then return c end
  end
  return pick(pool)
end

-- Dedicated connections whose coroutine ended without giving them back.
local function sweep(pool)
  for co, conn in pairs(pool.bound) do
    if coroutine.status(co) == "dead" then
      pool.bound[co] = nil
      pool.nbound = pool.nbound - 1
      fail_conn(conn, "closed")
    end
  end
end

-- A connection of the caller's alone (an idle dedicated one, or new).
function C.acquire(pool, mode)
  local idle = pool.idle
  while #idle > 0 do
    local c = idle[#idle]
    idle[#idle] = nil
    if not c.closed then
      c.mode = mode
      return c
    end
  end
  return C.new_conn(pool, mode)
end

-- Give back a dedicated connection: kept idle if clean (up to the pool's
-- size), else closed.
function C.release(pool, conn)
  if conn.closed then return end
  if conn.mode == "dedicated" and not conn.multi and not conn.watching and
     #pool.idle < pool.max and conn.qn == 0 then
    pool.idle[#pool.idle + 1] = conn
  else
    fail_conn(conn, "closed")
  end
end

-- The coroutine's own connection (made if it has none).
function C.bind(pool, co, mode)
  local conn = pool.bound[co]
  if conn and not conn.closed then return conn end
  if conn then
    pool.bound[co] = nil
    pool.nbound = pool.nbound - 1
  end
  sweep(pool)
  conn = C.acquire(pool, mode)
  conn.owner = co
  pool.bound[co] = conn
  pool.nbound = pool.nbound + 1
  return conn
end

function C.unbind(pool, conn)
  local co = conn.owner
  if co and pool.bound[co] == conn then
    pool.bound[co] = nil
    pool.nbound = pool.nbound - 1
  end
  conn.owner = nil
  C.release(pool, conn)
end

function C.close_pool(pool, why)
  for _, c in pairs(pool.conns) do fail_conn(c, why or "closed") end
  for _, c in ipairs(pool.idle) do fail_conn(c, why or "closed") end
  for _, c in pairs(pool.bound) do fail_conn(c, why or "closed") end
  pool.conns, pool.idle = {}, {}
end

-- ---- sending --------------------------------------------------------------------------

-- One command on conn, waited for: the reply as it came (an error reply
-- as an Error object, a null as NULL), or nil, err if the connection
-- failed. block: a blocking command (no timeout).
function C.send(conn, block, name, ...)
  conn.codec:cmd(name, ...)
  local w = rtable(1, 2)
  w.n = 1
  if block then w.block = true end
  if not submit(conn, w) then return nil, w.err end
  wait(w)
  if w.err then return nil, w.err end
  return w[1]
end

-- A filled pipeline p (a codec) on conn: the array of its replies (nulls
-- NULL, errors Error objects; res.n their count), or nil, err.
function C.send_pipeline(conn, p)
  local n = rcore.append(conn.codec, p)
  local w = rtable(n, 2)
  w.n = n
  if not submit(conn, w) then return nil, w.err end
  wait(w)
  if w.err then return nil, w.err end
  return w
end

return C
