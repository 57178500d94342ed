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

local concat, find, sub = table.concat, string.find, string.sub

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

local function closed(self)
  self.closed = true
  wake(self, "reader")
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
  local n = self.npend + 1
  self.pend[n] = msg
  self.npend = n
  self.size = self.size + #msg
  if self.size > M.buffer_limit and self.reader == nil then
    set_reading(self, false)
  end
  wake(self, "reader")
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
    ch = ch, loop = ch:loop(), buf = "", pos = 1, pend = {}, npend = 0, size = 0,
    timeout = timeout == nil and M.timeout or timeout or nil,
    paused = not ch:option("auto_read"),     -- child_options may start it off
    closed = false, fn = fn,
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

-- Move the pending chunks into buf, so buf[pos..] is every byte buffered.
local function join(st)
  if st.npend > 0 then
    local rest = st.pos > 1 and sub(st.buf, st.pos) or st.buf
    st.buf = rest .. concat(st.pend, "", 1, st.npend)
    st.pend, st.npend, st.pos = {}, 0, 1
  end
end

-- Take n bytes (n <= st.size).
local function take(st, n)
  join(st)
  local s = sub(st.buf, st.pos, st.pos + n - 1)
  st.pos = st.pos + n
  st.size = st.size - n
  if st.size == 0 then st.buf, st.pos = "", 1 end
  if st.paused and st.size <= M.buffer_limit then set_reading(st, true) end
  return s
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
  local why = p:await()
  if timer then timer:cancel() end
  if st[field] == p then st[field] = nil end
  return why
end

local function deadline_of(st)
  return st.timeout and core.now() + st.timeout or nil
end

-- What a failed receive returns: nil, err, and the bytes left as partial.
local function fail(st, err)
  return nil, err, take(st, st.size)
end

-- Wait for a delimiter; returns the bytes before it (consumed with it).
local function until_delim(st, delim, what, is_line)
  local deadline = deadline_of(st)
  local from = 1                             -- where in buf[pos..] to search
  while true do
    join(st)
    local i = find(st.buf, delim, st.pos + from - 1, true)
    if i then
      local n = i - st.pos
      local s = take(st, n + #delim)
      s = sub(s, 1, n)
      if is_line and sub(s, -1) == "\r" then s = sub(s, 1, -2) end
      return s
    end
    if st.size > M.max_line then return nil, "line too long" end
    if st.closed then return fail(st, "closed") end
    from = math.max(1, st.size - #delim + 2)
    set_reading(st, true)
    if wait(st, "reader", deadline) == "timeout" then return fail(st, "timeout") end
  end
end

local function receive_n(st, n)
  if n > M.max_receive then return nil, "too long" end
  local deadline = deadline_of(st)
  while st.size < n do
    if st.closed then return fail(st, "closed") end
    set_reading(st, true)
    if wait(st, "reader", deadline) == "timeout" then return fail(st, "timeout") end
  end
  return take(st, n)
end

local function receive_all(st)
  local deadline = deadline_of(st)
  while not st.closed do
    if st.size > M.max_receive then return nil, "too long" end
    set_reading(st, true)
    if wait(st, "reader", deadline) == "timeout" then return fail(st, "timeout") end
  end
  return take(st, st.size)
end

local function receiving(s, what)
  local st = state(s, what)
  in_coroutine("s:" .. what)
  if st.reader or st.shut then return nil end
  return st
end

-- s:receive([pattern]): "*l" (default; a line without its LF or CRLF), a
-- byte count, or "*a" (everything until the peer closes).
function Stream:receive(pattern)
  local st = receiving(self, "receive")
  if not st then return nil, live[self.ch].shut and "closed" or "busy" end
  if pattern == nil or pattern == "*l" or pattern == "l" then
    return until_delim(st, "\n", "receive", true)
  elseif pattern == "*a" or pattern == "a" then
    return receive_all(st)
  elseif math.type(pattern) == "integer" and pattern >= 0 then
    return receive_n(st, pattern)
  end
  error("netrun stream: s:receive: pattern must be \"*l\", \"*a\" or a byte count, got " ..
    tostring(pattern), 2)
end

-- s:receive_until(delimiter): the bytes up to delimiter (which is
-- consumed, not returned).
function Stream:receive_until(delim)
  local st = receiving(self, "receive_until")
  if not st then return nil, live[self.ch].shut and "closed" or "busy" end
  if type(delim) ~= "string" or delim == "" then
    error("netrun stream: s:receive_until: delimiter must be a non-empty string, got " ..
      (delim == "" and "an empty string" or type(delim)), 2)
  end
  return until_delim(st, delim, "receive_until", false)
end

-- s:send(data): data is a string or an array of strings (one gathered
-- write). Waits first while the channel is unwritable (its outbound
-- buffer above write_buffer_high); true once the channel took the bytes.
function Stream:send(data)
  local st = state(self, "send")
  in_coroutine("s:send")
  local t = type(data)
  if t ~= "string" and t ~= "table" then
    error("netrun stream: s:send: data must be a string or an array of strings, got " .. t, 2)
  end
  if st.writer then return nil, "busy" end
  local deadline = deadline_of(st)
  while not st.closed and not st.ch:is_writable() do
    if wait(st, "writer", deadline) == "timeout" then return nil, "timeout" end
  end
  if st.closed or not st.ch:is_active() then return nil, "closed" end
  st.ch:write_and_flush(data)
  return true
end

-- s:settimeout(seconds): the timeout of each following operation; nil:
-- none (wait as long as it takes).
function Stream:settimeout(seconds)
  local st = state(self, "settimeout")
  if seconds ~= nil and (type(seconds) ~= "number" or seconds < 0 or seconds ~= seconds) then
    error("netrun stream: s:settimeout: seconds must be a number >= 0 or nil, got " ..
      tostring(seconds), 2)
  end
  st.timeout = seconds
  return true
end

function Stream:close()
  local st = state(self, "close")
  if st.closed and not st.ch:is_open() then return nil, "closed" end
  st.closed, st.shut = true, true     -- shut: closed by this side
  st.ch:close()
  wake(st, "reader")
  wake(st, "writer")
  return true
end

function Stream:channel()
  return self.ch
end

function Stream:__tostring()
  return "netrun.stream(channel " .. tostring(self.ch:id()) .. ")"
end

-- ---- constructors ----------------------------------------------------------

local tcp = {}
M.tcp = tcp

local CONNECT_KEYS = { timeout = true, options = true, tls = true }

-- netrun.tcp.connect(host, port [, { timeout = seconds, options = {...},
--                                    tls = netrun.tls.client {...} }])
-- --> future of a stream on the caller's loop. timeout bounds the connect
-- (and the lookup of a host name) and is the stream's first operation
-- timeout (default M.timeout).
function tcp.connect(host, port, opts)
  if type(host) ~= "string" then
    error("netrun.tcp.connect: host must be a string, got " .. type(host), 2)
  end
  if math.type(port) ~= "integer" then
    error("netrun.tcp.connect: port must be an integer, got " ..
      (type(port) == "number" and "a float" or type(port)), 2)
  end
  if opts ~= nil and type(opts) ~= "table" then
    error("netrun.tcp.connect: options must be a table, got " .. type(opts), 2)
  end
  opts = opts or {}
  for k in pairs(opts) do
    if not CONNECT_KEYS[k] then
      error("netrun.tcp.connect: unknown option '" .. tostring(k) .. "'", 2)
    end
  end
  local loop = core.current()
  if loop == nil then
    error("netrun.tcp.connect: a stream lives on a loop: call it inside netrun.spawn " ..
      "on one (the main thread is not a loop)", 2)
  end
  local timeout = opts.timeout
  local p = core.promise()
  require("netrun").connect {
    group = loop, host = host, port = port, timeout = timeout, options = opts.options,
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
  if type(fn) ~= "function" then
    error("netrun.server: stream must be a function, got " .. type(fn), 0)
  end
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.stream = nil
  o.init = function(ch)
    if init then init(ch) end
    require("netrun.stream").attach(ch, fn)
  end
  return o
end

return M
