-- bench/stream_instr.lua MODE N -- a deterministic stream workload for
-- instruction counts (bench/stream_instr.sh runs it under callgrind at two
-- sizes and divides the difference):
--   echo N: a netrun stream client sends a line and reads the answer, N
--           times, from a stream server that answers each line (both on one
--           loop, so both sides are counted);
--   line N: one line of N bytes reaches a stream in 256-byte frames
--           (fixed_length below it): one receive("*l") over N / 256 wakes.
local netrun = require "netrun"
local mode, n = arg[1], tonumber(arg[2])
local g = netrun.group { threads = 1, name = "bench" }
local server = netrun.server {
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
local _, port = server:local_address()
local done = g:next():submit(function(p, mode, n)
  return netrun.spawn(function()
    local s = netrun.tcp.connect("127.0.0.1", p):await()
    local total = 0
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
