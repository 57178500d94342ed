-- bench/stream_instr.lua MODE N -- a deterministic stream workload for
-- instruction counts (bench/stream_instr.sh runs it under callgrind at two
-- sizes and divides the difference):
--   echo N: a netrun stream client sends a line and reads the answer, N
--           times, from a stream server that answers each line (both on one
--           loop, so both sides are counted);
--   line N: one line of N bytes reaches a stream in 256-byte frames
--           (fixed_length below it): one receive("*l") over N / 256 wakes.
--   connect N: N connections one after another, each netrun.tcp.connect
--           (with a timeout and channel options), one line echoed by the
--           stream server, closed: a new connection's cost, both sides.
--   channel N: the same with plain channels: netrun.connect with options
--           and an init adding a line codec (made per connection, as an
--           init that builds its codec does) and a handler, a server whose
--           init does the same.
--   websocket N: N WebSocket connections one after another, each
--           netrun.websocket.connect with options, upgraded by the server
--           with options (a table made per request, as a handler that
--           writes them in place does), one text message echoed, closed.
local netrun = require "netrun"
local mode, n = arg[1], tonumber(arg[2])
local g = netrun.group { threads = 1, name = "bench" }

-- channel: the server side answers each line with its length.
local Echo = {}
function Echo:channel_read(ctx, line) ctx:write_and_flush(#line .. "\n") end

-- websocket: the server side upgrades and echoes.
local WsEcho = {}
function WsEcho:channel_read(ctx, msg)
  if msg.method == nil then
    ctx:write_and_flush(msg.data)
  else
    netrun.websocket.upgrade(ctx, msg, { max_message = 65536, protocols = { "echo" } })
  end
end

local server
if mode == "websocket" then
  local http = netrun.codec.http_server()
  server = netrun.server {
    group = g, host = "127.0.0.1", port = 0,
    init = function(ch) ch:pipeline():add_last("http", http):add_last("echo", WsEcho) end,
  }:sync()
elseif mode == "channel" then
  server = netrun.server {
    group = g, host = "127.0.0.1", port = 0,
    child_options = { tcp_nodelay = true },
    init = function(ch)
      ch:pipeline():add_last("line", netrun.codec.line { max_length = 1024 })
        :add_last("echo", Echo)
    end,
  }:sync()
else
  server = netrun.server {
    group = g, host = "127.0.0.1", port = 0,
    init = mode == "line" and function(ch)
      ch:pipeline():add_last("split", netrun.codec.fixed_length { length = 256 })
    end or nil,
    stream = function(s)
      while true do
        local line = s:receive("*l")
        if not line then return end
        s:send(#line .. "\n")
      end
    end,
  }:sync()
end
local _, port = server:local_address()

-- One plain channel: connect, a line out, its answer in, closed.
local function one_channel(p)
  local got = netrun.promise()
  local ch = netrun.connect {
    group = netrun.current(), host = "127.0.0.1", port = p, timeout = 5,
    options = { tcp_nodelay = true },
    init = function(ch)
      ch:pipeline():add_last("line", netrun.codec.line { max_length = 1024 })
        :add_last("client", {
          channel_read = function(_, ctx, line) got:try_success(line) end,
        })
    end,
  }:await()
  ch:write_and_flush("hello\n")
  local line = got:await()
  ch:close():await()
  return #line
end

-- One WebSocket: connect, a message out, its echo in, closed.
local function one_websocket(p)
  local got = netrun.promise()
  local ch = netrun.websocket.connect {
    url = "ws://127.0.0.1:" .. p .. "/", timeout = 5, max_message = 65536,
    protocols = { "echo" },
    init = function(ch)
      ch:pipeline():add_last("client", {
        channel_read = function(_, ctx, m) got:try_success(m.data) end,
      })
    end,
  }:await()
  ch:write_and_flush("hello")
  local m = got:await()
  ch:close():await()
  return #m
end

local done = g:next():submit(function(p, mode, n)
  return netrun.spawn(function()
    local total = 0
    if mode == "connect" then
      for _ = 1, n do
        local s = netrun.tcp.connect("127.0.0.1", p, { timeout = 5,
          options = { tcp_nodelay = true } }):await()
        s:send("hello\n")
        total = total + #s:receive("*l")
        s:close()
      end
      return total
    elseif mode == "channel" then
      for _ = 1, n do total = total + one_channel(p) end
      return total
    elseif mode == "websocket" then
      for _ = 1, n do total = total + one_websocket(p) end
      return total
    end
    local s = netrun.tcp.connect("127.0.0.1", p):await()
    if mode == "echo" then
      for i = 1, n do
        s:send("request " .. i .. "\n")
        total = total + #s:receive("*l")
      end
    else
      s:send(string.rep("x", n - 1) .. "\n")
      total = tonumber(s:receive("*l"))
    end
    s:close()
    return total
  end)
end, port, mode, n):sync():sync()
print(mode, n, done)
server:close():sync()
g:shutdown_gracefully(0, 5):sync()
