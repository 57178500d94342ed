--- Streams: sequential code in coroutines over TCP (as
-- OpenResty's cosockets): `netrun.tcp`, loaded on first use, and
-- `netrun.server { stream = fn }`. Every wait yields the coroutine, never
-- the loop; calls must run in a coroutine that `netrun.spawn` (or a stream
-- server) started, on the stream's loop. Results are LuaSocket's: data, or
-- nil, err, partial, with err "timeout" (the stream stays usable),
-- "closed" (the peer closed or the channel failed; partial is what was
-- left) or "busy" (another coroutine is receiving, or sending). Bounds
-- (fields of `require "netrun.stream"`, per state): `buffer_limit` (64 KiB
-- held that no receive asked for; past it reading pauses), `max_line`
-- (1 MiB: "line too long"), `max_receive` (16 MiB: "too long"), `timeout`
-- (60 s per operation). A stream is a channel with a pipeline underneath:
-- codecs and TLS may sit below it.
-- @module netrun.tcp

-- netrun.stream: sequential code over a channel (DESIGN.md §8.2, OpenResty's
-- cosockets). netrun.tcp.connect and netrun.server { stream = fn }.
--
-- A stream is a channel whose last handler ("stream", a Lua handler of
-- this file) buffers the bytes that reach it and wakes the coroutine
-- waiting on them. Codecs (and TLS) may sit below it; whatever they pass
-- up must be strings, and a stream is a byte stream: frames are joined
-- (a line codec with strip = false below it hands it whole lines, which
-- receive("*l") splits again; with strip = true their ends are gone).
-- Anything but a string reaching it is logged as an error and closes the
-- channel.
--
-- Waiting: receive, receive_until and send park the coroutine on a
-- promise (future:await) that the handler completes when bytes arrive,
-- the channel turns writable or closes, or a loop timer when the
-- operation's timeout passes. Nothing ever blocks the loop. They must run
-- in a coroutine that netrun.spawn (or a stream server) started, on the
-- stream's own loop; elsewhere they raise.
--
-- Flow control: bytes nobody asked for yet are buffered up to
-- M.buffer_limit (64 KiB); past it the channel stops reading (auto_read
-- off) until a receive takes them. A receive waiting for more than that
-- (receive(n) with a large n, "*a") reads on: what it asked for is what it
-- holds. A line ("*l") or receive_until that finds no delimiter within
-- M.max_line bytes (1 MiB) returns nil, "line too long" and leaves the
-- bytes buffered. A receive(n) past M.max_receive (16 MiB), or a "*a"
-- whose bytes pass it, returns nil, "too long" (the bytes stay buffered,
-- to be taken in smaller receives): a length the peer chose cannot make
-- a stream hold more than that.
--
-- Results (LuaSocket's and OpenResty's): data, or nil, err, partial where
-- err is "timeout" (the stream stays usable), "closed" (the peer closed,
-- or the channel failed; partial is what was left; after s:close() every
-- operation returns nil, "closed") or "busy" (another
-- coroutine is already receiving, or sending, on this stream).
--
-- The end of the input: the peer's FIN (streams set allow_half_closure
-- unless their options say false), a TLS close_notify below, or the
-- channel closing. A receive then returns what is buffered as far as its
-- pattern allows ("*a": all of it), and once nothing is left every
-- receive returns nil, "closed", "" -- so LuaSocket's `repeat ... until
-- not data` ends -- while send still works until the channel closes (the
-- peer may be waiting for an answer: `nc -N`, shutdown(SHUT_WR)).
--
-- No call returns forever without yielding: one that fails without having
-- waited (closed, busy, a zero timeout) yields a turn of the loop first,
-- and a send that never met backpressure yields a turn every buffer_limit
-- bytes. A loop that ignores what its calls return burns its own time,
-- not its loop's.
--
-- Each stream's state lives in its loop's Lua state (a weak table keyed
-- by the channel's handle); the stream object itself is { ch = channel }
-- with a module metatable, so it may travel through a future's result.
local core = require "netrun.core"

local M = {
  buffer_limit = 64 * 1024,
  max_line = 1024 * 1024,
  max_receive = 16 * 1024 * 1024,
  timeout = 60,                   -- each operation's default, seconds
}

local live = setmetatable({}, { __mode = "k" })   -- channel -> handler state

local Stream = {}
Stream.__index = Stream
-- No __name "netrun.*": transfer.c keeps such objects on their loop, and
-- a stream travels through its connect future's result (a stream sent to
-- another loop raises there when used).
M.Stream = Stream

local Handler = {}
Handler.__index = Handler
M.Handler = Handler

local concat, find, sub, max = table.concat, string.find, string.sub, math.max

-- ---- the handler: buffering and waking ------------------------------------

local function wake(st, field)
  local p = st[field]
  if p then
    st[field] = nil
    p:try_success()
  end
end

local function set_reading(st, on)
  if st.paused == on then          -- paused is the opposite of reading
    st.paused = not on
    st.ch:option("auto_read", on)
  end
end

-- ---- the buffer: chunks as they arrived -----------------------------------
-- q[qh .. qt] are the chunks not taken yet, q[qh] from byte qpos on; size
-- counts their bytes. Bytes are appended as they arrive and a take copies
-- only what it returns: nothing rebuilds the buffer, so a receive costs
-- time linear in the bytes it waited for, however finely they came.

local function push(st, s)
  local t = st.qt + 1
  st.q[t], st.qt, st.size = s, t, st.size + #s
end

-- After n bytes were taken.
local function taken(st, n)
  st.size = st.size - n
  if st.size == 0 then st.qh, st.qt, st.qpos = 1, 0, 1 end
  if st.paused and not st.eof and st.size <= M.buffer_limit then set_reading(st, true) end
end

-- The first n bytes of several chunks (n > what the first one holds).
local function gather(st, n)
  local q, h, pos = st.q, st.qh, st.qpos
  local parts, k, need = {}, 0, n
  while need > 0 do
    local c = q[h]
    local avail = #c - pos + 1
    k = k + 1
    if avail <= need then                   -- the rest of c
      parts[k] = pos == 1 and c or sub(c, pos)
      q[h], h, pos, need = nil, h + 1, 1, need - avail
    else
      parts[k] = sub(c, pos, pos + need - 1)
      pos, need = pos + need, 0
    end
  end
  st.qh, st.qpos = h, pos
  return concat(parts, "", 1, k)
end

-- Remove the first n bytes (n <= st.size) and return them.
local function take(st, n)
  if n == 0 then return "" end
  local q, h, pos = st.q, st.qh, st.qpos
  local c = q[h]
  local avail, s = #c - pos + 1, nil
  if n < avail then                         -- within the first chunk
    s, st.qpos = sub(c, pos, pos + n - 1), pos + n
  elseif n == avail then                    -- the rest of it
    s, q[h], st.qh, st.qpos = pos == 1 and c or sub(c, pos), nil, h + 1, 1
  else
    s = gather(st, n)
  end
  taken(st, n)
  return s
end

-- Remove the first n bytes (n <= st.size), making no string of them.
local function drop(st, n)
  local q, h, pos, left = st.q, st.qh, st.qpos, n
  while left > 0 do
    local avail = #q[h] - pos + 1
    if left < avail then
      pos, left = pos + left, 0
    else
      q[h], h, pos, left = nil, h + 1, 1, left - avail
    end
  end
  st.qh, st.qpos = h, pos
  taken(st, n)
end

-- No more input will come (the peer's FIN or close_notify, a close).
local function input_over(st)
  st.eof = true
  wake(st, "reader")
end

local function closed(self)
  self.closed = true
  input_over(self)
  wake(self, "writer")
end

function Handler:channel_read(ctx, msg)
  if type(msg) ~= "string" then         -- a misconfigured pipeline: say so loudly
    core.log(3, "stream on channel " .. tostring(self.ch:id()) .. ": the handler below " ..
      "passed a " .. type(msg) .. " up; a stream takes strings (bytes): closing it")
    closed(self)
    ctx:close()
    return
  end
  if msg == "" then return end
  push(self, msg)
  if self.size > M.buffer_limit and self.reader == nil then
    set_reading(self, false)
  end
  wake(self, "reader")
end

-- The peer finished sending but may still read: its FIN (the channel
-- allows half-closure, as streams ask for) or a TLS close_notify. Reading
-- stops too: what a peer sends after its close_notify is dropped, and not
-- reading it leaves one that goes on to TCP's flow control.
function Handler:user_event_triggered(ctx, evt)
  if evt == "input_shutdown" or type(evt) == "table" and evt.tls == "close_notify" then
    input_over(self)
    set_reading(self, false)
  end
  ctx:fire_user_event_triggered(evt)
end

function Handler:channel_writability_changed(ctx)
  if self.ch:is_writable() then wake(self, "writer") end
end

function Handler:channel_inactive(ctx)
  closed(self)
end

function Handler:handler_removed(ctx)
  closed(self)
end

function Handler:exception_caught(ctx, err)
  self.err = err
  core.log(0, "stream on channel " .. tostring(self.ch:id()) .. ": " .. tostring(err))
  closed(self)
  ctx:close()
end

-- The stream coroutine of a server: started once the channel is active.
local function serve(s, fn)
  local ok, err = xpcall(fn, debug.traceback, s)
  if not ok then
    core.log(3, "stream function failed on channel " .. tostring(s.ch:id()) ..
      ", closing it: " .. tostring(err))
  end
  s:close()
end

function Handler:channel_active(ctx)
  if self.fn and not self.started then
    self.started = true
    local fn = self.fn
    self.fn = nil
    require("netrun").spawn(serve, setmetatable({ ch = self.ch }, Stream), fn)
  end
end

-- Put a stream handler last in ch's pipeline (on ch's loop, in its init);
-- with fn, run fn(stream) in a coroutine once the channel is active.
function M.attach(ch, fn, timeout)
  local st = setmetatable({
    ch = ch, loop = ch:loop(), q = {}, qh = 1, qt = 0, qpos = 1, size = 0,
    timeout = timeout == nil and M.timeout or timeout or nil,
    paused = not ch:option("auto_read"),     -- child_options may start it off
    closed = false, eof = false, fn = fn,
    parks = 0,                     -- times a call of this stream yielded
    sent = 0, sent_parks = 0,      -- bytes sent since parks was sent_parks
  }, Handler)
  live[ch] = st
  ch:pipeline():add_last("stream", st)
  if fn and ch:is_active() then st:channel_active() end
  return st
end

-- ---- the stream's side: consuming and waiting -----------------------------

local function state(s, what)
  local st = type(s) == "table" and s.ch and live[s.ch]
  if not st then
    error("netrun stream: " .. what .. ": " .. (type(s) == "table" and s.ch and
      "this stream lives on another loop (its channel's, " .. tostring(s.ch:loop():name()) .. ")"
      or "not a stream (call it as s:" .. what .. "(...))"), 3)
  end
  return st
end

local function in_coroutine(what)
  if not coroutine.isyieldable() then
    error("netrun stream: " .. what .. " waits, so it must run inside netrun.spawn " ..
      "or a stream server's coroutine", 3)
  end
end

-- Park until the handler or a timer wakes the coroutine (field: "reader"
-- or "writer"). Returns "timeout" once the deadline passed.
local function wait(st, field, deadline)
  local p = core.promise()
  st[field] = p
  local timer
  if deadline then
    local left = deadline - core.now()
    if left <= 0 then
      st[field] = nil
      return "timeout"
    end
    timer = st.loop:schedule(left, function() p:try_success("timeout") end)
  end
  st.parks = st.parks + 1
  local why = p:await()
  if timer then timer:cancel() end
  if st[field] == p then st[field] = nil end
  return why
end

-- Yield for one turn of the loop: a timer of 0 s, so the loop polls its
-- sockets and runs what is due before the coroutine goes on. Timers end
-- when a shutdown begins, so a coroutine paused then stays parked and
-- holds nothing up.
local function pause(st)
  local p = core.promise()
  st.loop:schedule(0, function() p:try_success() end)
  st.parks = st.parks + 1
  p:await()
end

-- What a call returns. One that fails without having waited (a stream
-- already closed, "busy", a zero timeout) yields a turn first: a loop
-- that retries it forever -- LuaSocket's `repeat ... until not data`
-- written with another test, a retry on "busy" -- then costs a turn of
-- the loop per try, and the loop serves its other channels meanwhile.
local function settle(st, parks, data, ...)
  if data == nil and st.parks == parks then pause(st) end
  return data, ...
end

local function deadline_of(st)
  return st.timeout and core.now() + st.timeout or nil
end

-- What a failed receive returns: nil, err, and the bytes left as partial.
local function fail(st, err)
  return nil, err, take(st, st.size)
end

-- The n bytes before a delimiter of d bytes, both consumed.
local function line_of(st, n, d, is_line)
  local s = take(st, n)
  drop(st, d)
  if is_line and sub(s, -1) == "\r" then s = sub(s, 1, -2) end
  return s
end

-- Wait for a delimiter; returns the bytes before it (consumed with it).
-- The search goes on where it stopped at each wake, so every byte is
-- looked at once: i is the chunk to search next, before the bytes
-- buffered ahead of it, tail the last #delim - 1 bytes searched (for a
-- delimiter split between two chunks).
local function until_delim(st, delim, is_line)
  local deadline = deadline_of(st)
  local q, d = st.q, #delim
  local i, before, tail = st.qh, 0, ""
  while true do
    while i <= st.qt do
      local c = q[i]
      local first = i == st.qh and st.qpos or 1
      local j = d > 1 and tail ~= "" and find(tail .. sub(c, first, first + d - 2), delim, 1, true)
      if j then return line_of(st, before - #tail + j - 1, d, is_line) end
      j = find(c, delim, first, true)
      if j then return line_of(st, before + j - first, d, is_line) end
      if d > 1 then tail = sub(tail .. sub(c, max(first, #c - d + 2)), 1 - d) end
      before, i = before + #c - first + 1, i + 1
    end
    if st.size > M.max_line then return nil, "line too long" end
    if st.eof then return fail(st, "closed") end
    set_reading(st, true)
    if wait(st, "reader", deadline) == "timeout" then return fail(st, "timeout") end
  end
end

local function receive_n(st, n)
  if n > M.max_receive then return nil, "too long" end
  local deadline = deadline_of(st)
  while st.size < n do
    if st.eof then return fail(st, "closed") end
    set_reading(st, true)
    if wait(st, "reader", deadline) == "timeout" then return fail(st, "timeout") end
  end
  return take(st, n)
end

-- Everything until the peer closes: its bytes, or (none came) nil,
-- "closed", as LuaSocket 3's "*a".
local function receive_all(st)
  local deadline = deadline_of(st)
  while not st.eof do
    if st.size > M.max_receive then return nil, "too long" end
    set_reading(st, true)
    if wait(st, "reader", deadline) == "timeout" then return fail(st, "timeout") end
  end
  if st.size == 0 then return nil, "closed", "" end
  return take(st, st.size)
end

local RECEIVERS = { ["*l"] = "line", l = "line", ["*a"] = "all", a = "all" }

-- Start a receive: the stream's state, or nil and why not. Once the
-- input is over and its bytes taken (EOF delivered), every receive is
-- nil, "closed" (after s:close() too, whatever was left).
local function receiving(st)
  if st.shut or st.eof and st.size == 0 then return nil, "closed", "" end
  if st.reader then return nil, "busy" end
  return st
end

--- A TCP stream, from `connect` or a stream server (`netrun.server { stream = fn }`).
-- @type stream

--- Receive: a line, a byte count, or everything until the peer closes.
-- @function stream:receive
-- @param[opt="*l"] pattern `"*l"` (a line without its LF or CRLF), a number of bytes, or `"*a"`
-- @treturn[1] string the data
-- @treturn[2] nil
-- @treturn[2] string "timeout", "closed", "busy", "line too long" or "too long"
-- @treturn[2] string what was received before the failure
function Stream:receive(pattern)
  local st = state(self, "receive")
  in_coroutine("s:receive")
  local how = pattern == nil and "line" or RECEIVERS[pattern]
  if not how and not (math.type(pattern) == "integer" and pattern >= 0) then
    error("netrun stream: s:receive: pattern must be \"*l\", \"*a\" or a byte count, got " ..
      tostring(pattern), 2)
  end
  local parks = st.parks
  local ok, err, partial = receiving(st)
  if not ok then return settle(st, parks, nil, err, partial) end
  if how == "line" then
    return settle(st, parks, until_delim(st, "\n", true))
  elseif how == "all" then
    return settle(st, parks, receive_all(st))
  end
  return settle(st, parks, receive_n(st, pattern))
end

--- Receive the bytes up to a delimiter (consumed, not returned).
-- @function stream:receive_until
-- @string delim the delimiter
-- @treturn[1] string the data
-- @treturn[2] nil
-- @treturn[2] string the error
-- @treturn[2] string what was received
function Stream:receive_until(delim)
  local st = state(self, "receive_until")
  in_coroutine("s:receive_until")
  if type(delim) ~= "string" or delim == "" then
    error("netrun stream: s:receive_until: delimiter must be a non-empty string, got " ..
      (delim == "" and "an empty string" or type(delim)), 2)
  end
  local parks = st.parks
  local ok, err, partial = receiving(st)
  if not ok then return settle(st, parks, nil, err, partial) end
  return settle(st, parks, until_delim(st, delim, false))
end

local function size_of(data)
  if type(data) == "string" then return #data end
  local n = 0
  for _, v in ipairs(data) do n = n + (type(v) == "string" and #v or 0) end
  return n
end

--- Send bytes. Waits first while the channel is unwritable (its
-- outbound buffer above `write_buffer_high`); past `buffer_limit` bytes
-- sent without a wait, yields a turn of the loop.
-- @function stream:send
-- @param data a string, or an array of strings (one gathered write)
-- @treturn[1] bool true once the channel took the bytes
-- @treturn[2] nil
-- @treturn[2] string "timeout", "closed" or "busy"
function Stream:send(data)
  local st = state(self, "send")
  in_coroutine("s:send")
  local t = type(data)
  if t ~= "string" and t ~= "table" then
    error("netrun stream: s:send: data must be a string or an array of strings, got " .. t, 2)
  end
  local parks = st.parks
  if st.writer then return settle(st, parks, nil, "busy") end
  local deadline = deadline_of(st)
  while not st.closed and not st.ch:is_writable() do
    if wait(st, "writer", deadline) == "timeout" then return settle(st, parks, nil, "timeout") end
  end
  if st.closed or not st.ch:is_active() then return settle(st, parks, nil, "closed") end
  st.ch:write_and_flush(data)
  if st.sent_parks ~= st.parks then st.sent, st.sent_parks = 0, st.parks end
  st.sent = st.sent + size_of(data)
  if st.sent > M.buffer_limit then pause(st) end
  return true
end

--- The timeout of each following operation.
-- @function stream:settimeout
-- @number[opt] seconds the timeout (nil: none)
-- @treturn bool true
function Stream:settimeout(seconds)
  local st = state(self, "settimeout")
  if seconds ~= nil and (type(seconds) ~= "number" or seconds < 0 or seconds ~= seconds) then
    error("netrun stream: s:settimeout: seconds must be a number >= 0 or nil, got " ..
      tostring(seconds), 2)
  end
  st.timeout = seconds
  return true
end

--- Close the stream (and its channel); every operation then returns nil, "closed".
-- @function stream:close
-- @treturn[1] bool true
-- @treturn[2] nil
-- @treturn[2] string "closed" when it was closed already
function Stream:close()
  local st = state(self, "close")
  if st.closed and not st.ch:is_open() then return nil, "closed" end
  st.closed, st.shut, st.eof = true, true, true     -- shut: closed by this side
  st.ch:close()
  wake(st, "reader")
  wake(st, "writer")
  return true
end

--- The channel underneath.
-- @function stream:channel
-- @treturn channel
function Stream:channel()
  return self.ch
end

function Stream:__tostring()
  return "netrun.stream(channel " .. tostring(self.ch:id()) .. ")"
end

-- ---- constructors ----------------------------------------------------------

local tcp = {}
M.tcp = tcp

-- A stream's channel options: allow_half_closure unless they say false,
-- so the peer's FIN ends the input (receive: nil, "closed") while the
-- stream may still send its answers, as OpenResty's cosockets do.
local function half_closing(options)
  if options ~= nil and type(options) ~= "table" then return options end  -- refused later
  if options and options.allow_half_closure ~= nil then return options end
  local o = { allow_half_closure = true }
  for k, v in pairs(options or {}) do o[k] = v end
  return o
end

-- Its options, checked by lopts.c's readers (core.options); the channel
-- options by netrun.connect's.
local check_connect = core.options("netrun.tcp.connect",
  { timeout = "seconds", options = "table", tls = "tls.client" })
local option_error = core.option_error

--- @section end

--- Connect a stream, on the caller's loop (inside `netrun.spawn`).
-- @function connect
-- @string host a host name or address
-- @int port the port
-- @tparam[opt] table opts
-- @number[opt] opts.timeout seconds for the connect (and the lookup), then each operation's timeout (default: `timeout`, 60)
-- @tparam[opt] table opts.options channel options (`allow_half_closure` is true unless false here)
-- @param[opt] opts.tls a `netrun.tls.client` config
-- @treturn future of the stream
-- @usage netrun.spawn(function()
--   local s = netrun.tcp.connect("127.0.0.1", 6379, { timeout = 2 }):await()
--   s:send("PING\r\n")
--   print(s:receive("*l"))
-- end)
function tcp.connect(host, port, opts)
  if type(host) ~= "string" then
    option_error("netrun.tcp.connect", "host", host, "a string")
  end
  local n = math.tointeger(port)       -- (as lua_tointegerx: "8080" too)
  if n == nil or n < 1 or n > 65535 then
    option_error("netrun.tcp.connect", "port", port, "an integer from 1 to 65535")
  end
  port = n
  opts = check_connect(opts) or {}
  local loop = core.current()
  if loop == nil then
    core.raise("netrun.tcp.connect: a stream lives on a loop: call it inside netrun.spawn " ..
      "on one (the main thread is not a loop)")
  end
  local timeout = opts.timeout
  local p = core.promise()
  require("netrun").connect {
    group = loop, host = host, port = port, timeout = timeout,
    options = half_closing(opts.options),
    tls = opts.tls,                    -- the future waits for its handshake
    init = function(ch) require("netrun.stream").attach(ch, nil, timeout) end,
  }:add_listener(function(f)
    if f:is_success() then
      p:try_success(setmetatable({ ch = f:result() }, Stream))
    else
      local cause = tostring(f:cause())
      if not cause:find("^netrun%.connect") then
        cause = string.format("%s:%d: %s", host, port, cause)
      end
      p:try_failure("netrun.tcp.connect: " .. cause:gsub("^netrun%.connect: ", ""))
    end
  end)
  return p
end

-- netrun.server { stream = fn, ... }: lchannel.c hands the options here;
-- the result has init composed of the user's init (if any) and the
-- stream's handler, which runs fn(stream) per connection.
function M.server_options(opts)
  local fn, init = opts.stream, opts.init
  if type(fn) ~= "function" then option_error("netrun.server", "stream", fn, "a function") end
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.stream = nil
  o.child_options = half_closing(opts.child_options)
  o.init = function(ch)
    if init then init(ch) end
    require("netrun.stream").attach(ch, fn)
  end
  return o
end

return M
