--- Pub/sub of `netrun.redis`'s clients (this file adds the methods).
-- @module netrun.redis

-- netrun.redis pub/sub (lua/netrun/redis.lua installs it): SUBSCRIBE,
-- PSUBSCRIBE and SSUBSCRIBE on a connection of the subscribing
-- coroutine's own, read with r:read_reply(); or a callback.
--
--   r:subscribe("a", "b")   --> { "subscribe", "b", 2 } (the last
--                               confirmation), or nil, err
--   r:read_reply([timeout]) --> { "message", channel, payload } |
--                               { "pmessage", pattern, channel, payload } |
--                               { "smessage", channel, payload } (and
--                               other pushes: an unasked "sunsubscribe"
--                               when a shard channel's slot moved), or nil,
--                               "timeout" (still subscribed) / "closed" /
--                               "not subscribed"
--   r:unsubscribe(["a"])    --> the last confirmation; after the last
--                               subscription ends, the connection closes
--   local sub = r:subscribe("a", function(payload, channel, msg) end)
--   sub:close()
--
-- The connection speaks RESP3 where the server does: messages are pushes
-- then, and the coroutine may run other commands on it meanwhile (in
-- RESP2 the server allows only (un)subscribe and PING). Messages wait in
-- order until read; past the client's max_messages unread the connection
-- stops reading from its socket until the reader catches up (the server
-- then holds them, up to its client-output-buffer-limit for pubsub).
local core = require "netrun.core"

local running = coroutine.running

local KINDS = { message = "message", pmessage = "message", smessage = "message",
                subscribe = "confirm", psubscribe = "confirm", ssubscribe = "confirm",
                unsubscribe = "confirm", punsubscribe = "confirm", sunsubscribe = "confirm" }
local SETS = { subscribe = "channels", unsubscribe = "channels", psubscribe = "patterns",
               punsubscribe = "patterns", ssubscribe = "shards", sunsubscribe = "shards" }

return function(M)
  local I = M.internal
  local C = M.conn
  local Client = M.Client
  local park, unpark = core.park, core.unpark

  -- A subscriber's state: its sets, its messages (mh..mt) and the
  -- coroutine parked in read_reply. Connections of one coroutine to
  -- several nodes (the cluster client) share one.
  local function state(conn)
    local s = conn.sub
    if s == nil then
      s = { channels = {}, patterns = {}, shards = {}, n = { channels = 0, patterns = 0, shards = 0 },
            msgs = {}, mh = 1, mt = 0, paused = {}, total = 0, reader = nil }
      conn.sub = s
    end
    return s
  end

  local function queue(conn, v)
    local s = state(conn)
    s.mt = s.mt + 1
    s.msgs[s.mt] = v
    if s.mt - s.mh + 1 >= conn.cfg.max_messages and not s.paused[conn] and conn.ch then
      s.paused[conn] = true
      conn.ch:option("auto_read", false)
    end
    local co = s.reader
    if co then
      s.reader = nil
      unpark(co)
    end
  end

  -- A confirmation: the subscription sets follow it; the waiter of the
  -- (un)subscribe that asked for it counts it. Unasked ones (a shard
  -- channel whose slot moved) are queued as messages too.
  local function confirm(conn, v)
    local s, kind, name = state(conn), v[1], v[2]
    local set = SETS[kind]
    local on = not kind:find("unsub", 1, true)
    if type(name) == "string" then
      if on and not s[set][name] then
        s[set][name] = true
        s.n[set] = s.n[set] + 1
      elseif not on and s[set][name] then
        s[set][name] = nil
        s.n[set] = s.n[set] - 1
      end
    end
    s.total = math.tointeger(v[3]) or s.total
    local w = C.head(conn)
    if w and w.confirm and w.kind == kind then
      w.seen = w.seen + 1
      w[1] = v
      if w.seen >= w.confirm then
        C.pop(conn)
        C.complete(w)
      end
    else
      queue(conn, v)
    end
  end

  -- A reply that is not pub/sub: the next command's.
  local function reply(conn, v)
    local w = C.head(conn)
    if w and w.confirm and type(v) == "table" and getmetatable(v) == M.Error then
      w.err = v.err                      -- refused (CROSSSLOT, NOPERM, ...)
      C.pop(conn)
      return C.complete(w)
    end
    if w == nil or w.confirm then
      return C.fail_conn(conn, "protocol error: a reply nobody asked for")
    end
    w[1] = v
    C.pop(conn)
    C.complete(w)
  end

  -- The read path of a subscribed connection (redis.lua's dispatch).
  function C.drain_pubsub(conn)
    local codec, t = conn.codec, {}
    while not conn.closed do
      local k, why = codec:take(t, 1, 1)
      local push = why == "push"
      if push then k, why = codec:take(t, 1, 1, true) end
      if k == 0 then
        if why then C.fail_conn(conn, why) end
        return
      end
      local v = t[1]
      t[1] = nil
      local kind = type(v) == "table" and KINDS[v[1]]
      if push or (conn.resp == 2 and kind) then
        if kind == "confirm" then confirm(conn, v) else queue(conn, v) end
      else
        reply(conn, v)                  -- RESP2's PING answers { "pong", "" } here
      end
    end
  end

  local function subscribe(self, kind, ...)
    local n = select("#", ...)
    local pool = I.pool_of(self)
    if pool == nil then
      error("netrun.redis: r:" .. kind:lower() .. " holds a connection for a coroutine: " ..
        "call it inside netrun.spawn on a loop (the main thread is not one)", 3)
    end
    if not coroutine.isyieldable() then I.need_coroutine(3) end
    local conn = C.bind(pool, running(), "pubsub")
    if conn.mode ~= "pubsub" then
      error("netrun.redis: r:" .. kind:lower() .. " inside a transaction (WATCH or MULTI " ..
        "first): finish it with exec or discard", 3)
    end
    if n == 0 and not kind:lower():find("unsub") then
      error("netrun.redis: r:" .. kind:lower() .. ": name at least one channel", 3)
    end
    local last, err = I.subscribe_on(conn, kind, ...)
    if last and kind:lower():find("unsub") and state(conn).total == 0 then
      C.unbind(pool, conn)               -- no subscription left: the connection goes
    end
    return last, err
  end

  -- (Un)subscribe on conn (a pubsub connection) and wait for every
  -- confirmation: the last one, or nil, err.
  function I.subscribe_on(conn, kind, ...)
    local n = select("#", ...)
    local s = state(conn)
    local want = n
    if n == 0 then want = math.max(1, s.n[SETS[kind:lower()]]) end
    conn.codec:cmd(kind, ...)
    local w = { n = 1, seen = 0, confirm = want, kind = kind:lower() }
    if not C.submit(conn, w) then return nil, w.err end
    C.wait(w)
    if w.err then return nil, w.err end
    return w[1]
  end

  local Subscription = {}
  Subscription.__index = Subscription
  M.Subscription = Subscription

  --- A subscription with a callback, made by `client:subscribe(..., fn)`
  -- (and `psubscribe`, `ssubscribe`).
  -- @type subscription

  --- Stop it: its connection closes, and with it its subscriptions.
  -- @function subscription:close
  -- @treturn boolean true
  function Subscription:close()
    self.closed = true
    if self.conn then C.fail_conn(self.conn, "closed") end
    return true
  end

  -- r:subscribe(..., fn): a coroutine of the client's reads the messages
  -- and calls fn(payload, channel, msg) for each (in order; an error in fn
  -- is logged and the next message comes). In a coroutine the call waits
  -- for the subscription (nil, err if it failed); elsewhere on a loop it
  -- returns at once.
  local function with_callback(self, kind, fn, ...)
    if not core.current() then
      error("netrun.redis: r:" .. kind:lower() .. " with a callback runs on a loop: " ..
        "call it on one (the main thread is not one)", 3)
    end
    local sub = setmetatable({ closed = false }, Subscription)
    local started = core.promise()
    core.spawn(function(...)
      local ok, err = subscribe(self, kind, ...)
      sub.conn = I.pool_of(self).bound[running()]
      started:try_success(err or true)
      if not ok then return end
      while not sub.closed do
        local m, e = self:read_reply()
        if not m then
          if e ~= "timeout" then break end
        elseif KINDS[m[1]] == "message" then
          local okc, cerr = xpcall(fn, debug.traceback, m[#m], m[#m - 1], m)
          if not okc then
            core.log(3, "netrun.redis: a subscription callback failed: " .. tostring(cerr))
          end
        end
      end
      sub.closed = true
    end, ...)
    if coroutine.isyieldable() then
      local r = started:await()
      if r ~= true then return nil, r end
    end
    return sub
  end

  local function method(kind)
    return function(self, ...)
      local n = select("#", ...)
      if n > 0 and type((select(n, ...))) == "function" then
        local args = table.pack(...)
        return with_callback(self, kind, args[n], table.unpack(args, 1, n - 1))
      end
      return subscribe(self, kind, ...)
    end
  end
  --- @type client

  --- SUBSCRIBE to channels, on a connection of the coroutine's own: while
  -- subscribed, the coroutine's other commands go on it too (RESP3; in
  -- RESP2 the server allows only (un)subscribe and PING there). Read the
  -- messages with `client:read_reply`; or, with a function as the last
  -- argument, a coroutine of the client's reads them and calls
  -- `fn(payload, channel, msg)` for each, in order (an error in it is
  -- logged), until `subscription:close`.
  -- @function client:subscribe
  -- @string ... the channels, then optionally `fn`
  -- @return[1] the last confirmation, `{ "subscribe", channel, count }`
  -- @treturn[2] subscription with a function: the subscription (in a
  -- coroutine, once subscribed)
  -- @return[3] nil, err
  -- @usage r:subscribe("news")
  -- local msg = r:read_reply(5)   --> { "message", "news", "..." }

  --- PSUBSCRIBE to patterns, as `client:subscribe`; messages come as
  -- `{ "pmessage", pattern, channel, payload }`.
  -- @function client:psubscribe
  -- @string ... the patterns, then optionally `fn`
  -- @return the last confirmation, or a subscription, or nil, err

  --- SSUBSCRIBE to shard channels (Redis 7), as `client:subscribe`;
  -- messages come as `{ "smessage", channel, payload }`.
  -- @function client:ssubscribe
  -- @string ... the channels, then optionally `fn`
  -- @return the last confirmation, or a subscription, or nil, err

  --- UNSUBSCRIBE from channels (none: all); with no subscription left,
  -- the coroutine's connection closes.
  -- @function client:unsubscribe
  -- @string[opt] ... the channels
  -- @return the last confirmation, or nil, err

  --- PUNSUBSCRIBE from patterns (none: all), as `client:unsubscribe`.
  -- @function client:punsubscribe
  -- @string[opt] ... the patterns
  -- @return the last confirmation, or nil, err

  --- SUNSUBSCRIBE from shard channels (none: all), as `client:unsubscribe`.
  -- @function client:sunsubscribe
  -- @string[opt] ... the channels
  -- @return the last confirmation, or nil, err
  for _, kind in ipairs { "SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE", "UNSUBSCRIBE",
                          "PUNSUBSCRIBE", "SUNSUBSCRIBE" } do
    Client[kind:lower()] = method(kind)
  end

  -- The next message of conn's subscriber state (see r:read_reply).
  function I.read_on(conn, timeout)
    local s = state(conn)
    local timer, timed_out
    while true do
      if s.mh <= s.mt then
        local v = s.msgs[s.mh]
        s.msgs[s.mh] = nil
        s.mh = s.mh + 1
        if next(s.paused) and s.mt - s.mh < conn.cfg.max_messages // 2 then
          for c in pairs(s.paused) do
            s.paused[c] = nil
            if not c.closed then c.ch:option("auto_read", true) end
          end
        end
        if timer then timer:cancel() end
        return v
      end
      if conn.closed then
        if timer then timer:cancel() end
        return nil, conn.err or "closed"
      end
      if timed_out then return nil, "timeout" end
      local co = running()
      s.reader = co
      if timeout and not timer then
        timer = conn.loop:schedule(timeout, function()
          timed_out = true
          if s.reader == co then
            s.reader = nil
            unpark(co)
          end
        end)
      end
      park()
      if s.reader == co then s.reader = nil end
    end
  end

  --- The next message of this coroutine's subscriptions, in order:
  -- `{ "message", channel, payload }`, `{ "pmessage", pattern, channel,
  -- payload }`, `{ "smessage", channel, payload }`, or another push (an
  -- unasked `"sunsubscribe"` when a shard channel's slot moved). Past the
  -- client's `max_messages` unread, the connection stops reading from its
  -- socket until the reader catches up.
  -- @function client:read_reply
  -- @number[opt] timeout seconds to wait (none: for ever)
  -- @treturn[1] table the message
  -- @treturn[2] nil
  -- @treturn[2] string `"timeout"` (still subscribed), `"closed"` or `"not subscribed"`
  function Client:read_reply(timeout)
    if timeout ~= nil and (type(timeout) ~= "number" or timeout < 0) then
      error("netrun.redis: r:read_reply: timeout must be a number >= 0, got " .. tostring(timeout), 2)
    end
    local pool = I.pool_of(self)
    local conn = pool and pool.bound[running()]
    if not conn or conn.mode ~= "pubsub" then return nil, "not subscribed" end
    if not coroutine.isyieldable() then I.need_coroutine(2) end
    return I.read_on(conn, timeout)
  end
end
