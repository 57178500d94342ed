-- nats_bench.lua -- the netrun side of bench/run_nats.sh (its twin is
-- bench/node/nats_bench.js, on Node's `nats`; the two do the same work).
--   netrun bench/nats_bench.lua --mode pub|req|serve --url nats://127.0.0.1:4222
--                               [--warmup 2] [--duration 10] [--size 16] [--inflight 1]
-- pub: publish SIZE-byte messages to bench.pub, 4096 at a time, each
--      batch followed by a flush (a PING/PONG round trip);
-- req: requests to bench.req, INFLIGHT at a time (coroutines sharing one
--      connection), each waiting for its reply;
-- serve: answer bench.req with the request's data.
-- pub and req run WARMUP seconds, then DURATION seconds measured, and
-- print "ops=N ticks=T hz=H secs=S p99_us=P": T is this process's
-- utime+stime over the measured part, from /proc/self/stat (every
-- thread's), in clock ticks of H a second.
local netrun = require "netrun"

local option = netrun.option
local mode = option("mode", "pub")
local url = option("url", "nats://127.0.0.1:4222")
local warmup, duration = option("warmup", 2), option("duration", 10)
local size, inflight = option("size", 16), option("inflight", 1)
local hz = tonumber(io.popen("getconf CLK_TCK"):read("l")) or 100

local function ticks()
  local f = assert(io.open("/proc/self/stat"))
  local stat = f:read("a")
  f:close()
  local rest = stat:match("%) (.*)$")
  local fields = {}
  for x in rest:gmatch("%S+") do fields[#fields + 1] = x end
  return tonumber(fields[12]) + tonumber(fields[13])   -- fields 14, 15
end

local function run()
  -- no reconnecting: once run_nats.sh stops the server, the responder's
  -- connection closes and the process ends (a reconnecting one lingered)
  local nc = assert(netrun.nats.connect { url = url, name = "bench-" .. mode,
                                          reconnect = false })
  local data = string.rep("x", size)
  if mode == "serve" then
    nc:subscribe("bench.req", function(m) m:respond(m.data) end)
    assert(nc:flush())
    print("serving")
    io.stdout:flush()
    return nc:closed():await()
  end
  local lat, nlat = {}, 0
  local function pub_for(secs)
    local n, stop = 0, netrun.now() + secs
    while netrun.now() < stop do
      for _ = 1, 4096 do nc:publish("bench.pub", data) end
      n = n + 4096
      assert(nc:flush())
    end
    return n
  end
  local function req_for(secs, record)
    local stop, n = netrun.now() + secs, 0
    local workers = {}
    for w = 1, inflight do
      workers[w] = netrun.spawn(function()
        while netrun.now() < stop do
          local t0 = netrun.now()
          assert(nc:request("bench.req", data, { timeout = 5 }))
          n = n + 1
          if record then
            nlat = nlat + 1
            lat[nlat] = netrun.now() - t0
          end
        end
      end)
    end
    netrun.all(workers):await()
    return n
  end
  local work = mode == "pub" and pub_for or req_for
  work(warmup, false)
  local t0, w0 = ticks(), netrun.now()
  local n = work(duration, true)
  local t1, w1 = ticks(), netrun.now()
  nc:close()
  local p99 = 0
  if nlat > 0 then
    table.sort(lat)
    p99 = lat[math.max(1, math.floor(nlat * 0.99))] * 1e6
  end
  return string.format("ops=%d ticks=%d hz=%d secs=%.3f p99_us=%.0f", n, t1 - t0, hz,
    w1 - w0, p99)
end

local group = netrun.group { threads = 1, name = "bench" }
local out = group:next():submit(function() return netrun.spawn(run) end):sync():sync()
print(out)
group:shutdown_gracefully(0, 2):sync()
