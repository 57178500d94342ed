-- bench/stalled_loop.lua -- new connections while one of two loops is
-- stuck (bench/RESULTS.md, "A stalled loop").
--   netrun bench/stalled_loop.lua MODE N
-- MODE boss (a boss group and two child loops) or reuseport (two loops);
-- one child loop is held in a handler until a shared dict says stop; N new
-- connections, made once the stall is reported: how many are answered
-- within 2 s, and how many once the loop runs again.
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."
package.path = here .. "/../spec/fixtures/?.lua;" .. package.path   -- hold.lua
local netrun = require "netrun"
local socket = require "socket"
local mode, N = arg[1] or "boss", tonumber(arg[2]) or 6
local dict = netrun.shared.dict("stalled_loop"); dict:flush_all()
local g = netrun.group { threads = 2, name = "stall", stall_threshold = 0.1 }
local boss = mode == "boss" and netrun.group { threads = 1, name = "stallboss" } or nil
local server = netrun.server { group = boss or g, child_group = g, reuseport = mode == "reuseport",
  host = "127.0.0.1", port = 0, init = function(ch) ch:pipeline():add_last("hold", require("hold")("stalled_loop")) end }:sync()
local _, port = server:local_address()
local held = socket.tcp(); held:settimeout(30); assert(held:connect("127.0.0.1", port)); held:send("hold\n")
local t0 = socket.gettime()
repeat
  local stalls = 0
  for _, st in ipairs(g:stats()) do stalls = stalls + st.stalls end
  if stalls == 0 then socket.select(nil, nil, 0.01) end
until stalls > 0 or socket.gettime() - t0 > 10
local cs = {}
for i = 1, N do cs[i] = socket.tcp(); cs[i]:settimeout(2); assert(cs[i]:connect("127.0.0.1", port)); cs[i]:send("ping\n") end
local at_once, later = 0, 0
t0 = socket.gettime()
for i = 1, N do
  cs[i]:settimeout(math.max(0.01, 2 - (socket.gettime() - t0)))
  if cs[i]:receive("*l") == "pong" then at_once = at_once + 1; cs[i] = nil end
end
dict:set("stop", true)
held:receive("*l")
for i = 1, N do if cs[i] then cs[i]:settimeout(5); if cs[i]:receive("*l") == "pong" then later = later + 1 end end end
print(string.format("%s: %d of %d new connections served at once while one of two loops is stuck; %d more once it ran again", mode, at_once, N, later))
server:close():sync()
os.exit(0)
