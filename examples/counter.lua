-- counter.lua -- shared state for many processes: counters kept in Redis,
-- reached through a stream (netrun.tcp.connect) in straight-line code.
-- Run as many of these as you like, on one host (--reuseport yes: they
-- share one port and the kernel spreads connections over them) or on
-- several behind any L4 load balancer: every one sees the same counts.
--   netrun examples/counter.lua [--port 7100] [--threads 1] [--reuseport yes]
--                               [--redis-host 127.0.0.1] [--redis-port 6379]
--                               [--name counter]
-- A line protocol: "incr KEY" answers the new count, "get KEY" the count
-- (0 when absent), "name" this process's --name; anything else "ERR ...".
local netrun = require "netrun"

local option = netrun.option
local redis_host = option("redis-host", "127.0.0.1")
local redis_port = option("redis-port", 6379)
local name = option("name", "counter")

-- One command in RESP (the Redis protocol): send it, read its reply.
-- Integers, simple strings and bulk strings are all this needs; a Redis
-- error comes back as nil, message.
local function command(r, ...)
  local args = { ... }
  local out = { "*" .. #args .. "\r\n" }
  for _, a in ipairs(args) do
    a = tostring(a)
    out[#out + 1] = "$" .. #a .. "\r\n" .. a .. "\r\n"
  end
  local ok, err = r:send(out)
  if not ok then return nil, err end
  local line, rerr = r:receive("*l")
  if not line then return nil, rerr end
  local kind, rest = line:sub(1, 1), line:sub(2)
  if kind == ":" then return math.tointeger(rest) end
  if kind == "+" then return rest end
  if kind == "-" then return nil, rest end
  if kind == "$" then
    local n = tonumber(rest)
    if n < 0 then return false end             -- no such key
    local data, derr = r:receive(n + 2)
    return data and data:sub(1, n), derr
  end
  return nil, "unexpected reply: " .. line
end

-- Each client connection gets its own coroutine (stream = ...) and opens
-- its own Redis connection on first use: the code reads top to bottom,
-- and each wait yields to the loop instead of blocking it.
local function serve(s)
  local redis
  while true do
    local line = s:receive("*l")
    if not line then break end                  -- the client went away
    local cmd, key = line:match("^(%a+)%s*(%S*)$")
    local reply, err
    if cmd == "name" then
      reply = name
    elseif (cmd == "incr" or cmd == "get") and key ~= "" then
      if not redis then                         -- await raises if it fails
        local ok, r = pcall(function()
          return netrun.tcp.connect(redis_host, redis_port, { timeout = 2 }):await()
        end)
        redis, err = ok and r or nil, not ok and tostring(r):gsub("^[^:]*:%d+: ", "") or nil
      end
      if redis then
        if cmd == "incr" then
          reply, err = command(redis, "INCR", key)
        else
          reply, err = command(redis, "GET", key)
          if reply == false then reply = 0 end
        end
        if reply == nil then redis:close(); redis = nil end   -- reconnect next time
      end
    else
      err = "usage: incr KEY | get KEY | name"
    end
    s:send(reply ~= nil and tostring(reply) .. "\n" or "ERR " .. tostring(err) .. "\n")
  end
  if redis then redis:close() end
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
                redis_host, redis_port)
