-- bench/submit.lua -- loop:submit of a Lua function from the main state to
-- one loop, with the compiled-function cache warm: submits N tasks in
-- batches, waits for every result. Reports tasks per wall second and per
-- process CPU-second (both threads).
--   netrun bench/submit.lua [N=1000000] [batch=1000]
local netrun = require "netrun"
local N = tonumber(arg[1]) or 1000000
local BATCH = tonumber(arg[2]) or 1000

local g = netrun.group { threads = 1, name = "bench" }
local loop = g:next()
local function task(i) return i + 1 end

local function run(n)
  local futures, done = {}, 0
  while done < n do
    local k = math.min(BATCH, n - done)
    for i = 1, k do futures[i] = loop:submit(task, i) end
    for i = 1, k do assert(futures[i]:sync() == i + 1) end
    done = done + k
  end
end

run(BATCH * 10)                                   -- warm the function cache
local wall, cpu = netrun.now(), os.clock()
run(N)
wall, cpu = netrun.now() - wall, os.clock() - cpu
print(string.format("loop:submit, cache warm: %d tasks in %.2f s wall, %.2f s CPU (both threads): "
  .. "%.0f tasks/s, %.0f tasks per CPU-second", N, wall, cpu, N / wall, N / cpu))
g:shutdown_gracefully(0, 1):sync()
