-- bench/sim_day.lua -- time compression of netrun.sim (DESIGN.md §9.8): a
-- simulated day of 1,000 keep-alive HTTP clients going through
-- examples/proxy.lua to a backend, with the proxy cut from the backend for
-- a minute every simulated hour, run on one core in virtual time.
--
--   netrun bench/sim_day.lua [--hours 24] [--clients 1000] [--think 1800]
--                            [--burst 5] [--gap 2] [--seed 1] [--cut 60]
--
-- Hosts: "clients" (one loop: every client a timer and a callback with
-- its own netrun.http.client, one keep-alive connection each), "proxy"
-- (examples/proxy.lua: its server codec closes connections idle for 75 s,
-- nginx's keepalive_timeout; its pool to the backend keeps idle ones 60 s)
-- and "backend" (a Lua HTTP handler). Each client visits the site: --burst
-- requests (5) on its keep-alive connection, --gap seconds apart on average
-- (2), then it is idle for --think seconds on average (1800: 48 visits a
-- day), long past the proxy's idle timeout, which closes the connection:
-- the next visit connects again. Think times and gaps are exponentially
-- distributed; each request is a GET of a page through the proxy (timeout
-- 30 s).
-- In the middle of every hour the proxy and the backend are partitioned for
-- --cut seconds: requests then time out (504 from the proxy's 30 s
-- timeout, or the client's own) and recover after the heal.
--
-- Prints the simulated and wall-clock times, the requests and their
-- outcomes, connections made, the scheduler's steps, and the trace hash.
local netrun = require "netrun"
local sim = require "netrun.sim"

local option = netrun.option
local HOURS = option("hours", 24)
local CLIENTS = math.tointeger(option("clients", 1000))
local THINK = option("think", 1800)
local BURST = math.tointeger(option("burst", 5))
local GAP = option("gap", 2)
local CUT = option("cut", 60)
local SEED = math.tointeger(option("seed", 1))
local root = debug.getinfo(1, "S").source:match("^@(.*)/bench/sim_day%.lua$") or "."

local wall0 = os.clock()                 -- (the real one: outside the world)
local t0 = require("socket").gettime()
local r = sim.run({ seed = SEED }, function(world)
  local clients, proxy, backend = world:host "clients", world:host "proxy", world:host "backend"
  backend:run(function()
    local netrun = require "netrun"
    local codec = netrun.codec.http_server {}
    netrun.server { group = netrun.group { threads = 1, name = "backend" }, port = 8080,
      init = function(ch)
        ch:pipeline():add_last("http", codec)
        ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
          ctx:write_and_flush { status = 200, headers = { ["content-type"] = "text/plain" },
                                body = "page " .. req.path }
        end })
      end }:sync()
  end):await()
  proxy:run(root .. "/examples/proxy.lua", { port = 80, backend = "backend:8080" }):await()

  -- Each client is a timer and a callback (no coroutine): think, request,
  -- count the answer, think again, until the end of the day.
  local stop = netrun.now() + HOURS * 3600
  local done = clients:run(function(n, think, burst, gap, stop)
    local netrun = require "netrun"
    local loop = netrun.current()
    local stats = { requests = 0, ok = 0, status = {}, errors = 0 }
    local left = n
    local all = netrun.promise()
    local function exp(mean) return -mean * math.log(1 - math.random()) end
    for i = 1, n do
      local client = netrun.http.client { pool = 1, keepalive = 3600, timeout = 30 }
      local req = { url = "http://proxy/item/" .. i }
      local go
      local k = 0                     -- requests in this visit so far
      local function answered(res, err)
        if res then
          stats.status[res.status] = (stats.status[res.status] or 0) + 1
          if res.status == 200 then stats.ok = stats.ok + 1 end
        else
          stats.errors = stats.errors + 1
        end
        k = (k + 1) % burst           -- a visit: `burst` requests `gap` apart
        loop:schedule(k == 0 and exp(think) or exp(gap), go)
      end
      function go()
        if netrun.now() >= stop then
          left = left - 1
          if left == 0 then all:set_success(stats) end
          return
        end
        stats.requests = stats.requests + 1
        client:request(req, answered)
      end
      loop:schedule(exp(think), go)
    end
    loop:schedule(stop - netrun.now(), function() all:try_success(stats) end)
    return all:await()
  end, CLIENTS, THINK, BURST, GAP, stop)

  -- a partition in the middle of every hour
  local start = stop - HOURS * 3600
  for h = 1, HOURS do
    world:sleep(start + (h - 0.5) * 3600 - netrun.now())
    world:partition(proxy, backend)
    world:sleep(CUT)
    world:heal()
  end
  local stats = done:await()
  if os.getenv("SIM_DAY_MEMORY") then
    for _, g in ipairs(require("netrun.core").groups()) do
      for _, st in ipairs(g:stats()) do
        io.stderr:write(("%s: lua_memory %d KiB, tasks %d\n"):format(st.name, st.lua_memory // 1024, st.tasks_run))
      end
    end
  end
  stats.hours = world:elapsed() / 3600
  stats.connections = world:stats().connections
  stats.steps = world:stats().steps
  stats.trace = world:trace_hash()
  return stats
end)

local wall = require("socket").gettime() - t0
local codes = {}
for k, v in pairs(r.status) do codes[#codes + 1] = k .. ": " .. v end
table.sort(codes)
print(("simulated %.2f h in %.1f s of wall time (%.1f s CPU): %.0fx"):format(
  r.hours, wall, os.clock() - wall0, r.hours * 3600 / wall))
print(("%d clients, %d requests: %d ok, %d failed (%s); %d connections; %d steps; trace %s")
  :format(CLIENTS, r.requests, r.ok, r.errors, table.concat(codes, ", "), r.connections,
          r.steps, r.trace))
