-- counter.lua -- shared state for many processes: counters kept in Redis
-- with netrun.redis, in straight-line code. Run as many of these as you
-- like, on one host (--reuseport yes: they share one port and the kernel
-- spreads connections over them) or on several behind any L4 load
-- balancer: every one sees the same counts.
--   netrun examples/counter.lua [--port 7100] [--threads 1] [--reuseport yes]
--                               [--redis-host 127.0.0.1] [--redis-port 6379]
--                               [--redis-url redis://...] [--name counter]
-- A line protocol: "incr KEY" answers the new count, "get KEY" the count
-- (0 when absent), "name" this process's --name; anything else "ERR ...".
local netrun = require "netrun"

local option = netrun.option
local name = option("name", "counter")

-- One client for the whole process: each loop that uses it keeps its own
-- connection to Redis (opened on first use, opened again after a failure),
-- and the commands of all the connections a loop serves share it.
local redis = netrun.redis.connect {
  url = option("redis-url", nil) or string.format("redis://%s:%d",
    option("redis-host", "127.0.0.1"), option("redis-port", 6379)),
  timeout = 2,
}

-- Each client connection gets its own coroutine (stream = ...): the code
-- reads top to bottom, and each wait -- for the client's line, for
-- Redis's reply -- yields to the loop instead of blocking it.
local function serve(s)
  while true do
    local line = s:receive("*l")
    if not line then break end                  -- the client went away
    local cmd, key = line:match("^(%a+)%s*(%S*)$")
    local reply, err
    if cmd == "name" then
      reply = name
    elseif cmd == "incr" and key ~= "" then
      reply, err = redis:incr(key)
    elseif cmd == "get" and key ~= "" then
      reply, err = redis:get(key)
      if reply == nil and err == nil then reply = 0 end   -- no such key
    else
      err = "usage: incr KEY | get KEY | name"
    end
    s:send(reply ~= nil and tostring(reply) .. "\n" or "ERR " .. tostring(err) .. "\n")
  end
end

local workers = netrun.group { threads = option("threads", 1), name = "counter" }
local server = netrun.server {
  group = workers,
  host = option("host", "127.0.0.1"),
  port = option("port", 7100),
  reuseport = option("reuseport", "no") == "yes",
  stream = serve,
}:sync()

local host, port = server:local_address()
netrun.log.info("counter %s listening on %s:%d (Redis at %s:%d)", name, host, port,
                redis.host, redis.port)
