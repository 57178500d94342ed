-- bench/redis_client.lua -- the load netrun.redis puts through one loop:
-- `--clients` coroutines, each sending pipelines of `--pipeline` commands
-- (SET and GET in turn, on keys of `--keys` distinct names with values of
-- `--size` bytes), for `--seconds` after `--warmup`, over a client of
-- `--pool` connections. Prints "ops N seconds S" for the measured part
-- (bench/run_redis_client.sh reads the process's CPU time around it).
--   netrun bench/redis_client.lua --port 6379 [--clients 50] [--pipeline 16]
--                                 [--pool 1] [--seconds 10] [--warmup 2]
local netrun = require "netrun"
local option = netrun.option
local port, clients, depth = option("port", 6379), option("clients", 50), option("pipeline", 16)
local pool, seconds, warmup = option("pool", 1), option("seconds", 10), option("warmup", 2)
local keys, size = option("keys", 100000), option("size", 3)
local mode = option("mode", "pipeline")       -- or "single": one command per call

local group = netrun.group { threads = 1, name = "bench" }
local out = group:submit(function(port, clients, depth, pool, seconds, warmup, keys, size, mode)
  local netrun = require "netrun"
  local r = netrun.redis.connect { host = "127.0.0.1", port = port, pool = pool }
  local value = string.rep("x", size)
  local names = {}
  for i = 1, keys do names[i] = "key:" .. i end
  local running, counting, ops, total = true, false, 0, 0
  local function worker(id)
    local k = id
    while running do
      if mode == "single" then
        k = k % keys + 1
        assert(r:set(names[k], value))
        assert(r:get(names[k]))
        total = total + 2
        if counting then ops = ops + 2 end
      else
        local res, err = r:pipeline(function(p)
          for i = 1, depth, 2 do
            k = k % keys + 1
            p:set(names[k], value)
            p:get(names[k])
          end
        end)
        assert(res, err)
        total = total + depth
        if counting then ops = ops + depth end
      end
    end
  end
  local done = netrun.promise()
  local left = clients
  for i = 1, clients do
    netrun.spawn(function()
      local ok, err = pcall(worker, i * 7919)
      if not ok then print(err) end
      left = left - 1
      if left == 0 then done:try_success() end
    end)
  end
  return netrun.spawn(function()
    netrun.sleep(warmup)
    counting = true
    local t0 = netrun.now()
    local f = io.open("/proc/self/stat")
    local st0 = f:read("a") f:close()
    netrun.sleep(seconds)
    counting = false
    local f2 = io.open("/proc/self/stat")
    local st1 = f2:read("a") f2:close()
    local t = netrun.now() - t0
    running = false
    done:await()
    local function cpu(s) local f = {} for x in s:gmatch("%S+") do f[#f+1] = x end return tonumber(f[14]) + tonumber(f[15]) end
    return string.format("ops %d seconds %.3f cpu_ticks %d total %d", ops, t, cpu(st1) - cpu(st0), total)
  end)
end, port, clients, depth, pool, seconds, warmup, keys, size, mode):sync():sync()
print(out)
group:shutdown_gracefully(0, 1):sync()
