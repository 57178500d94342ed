-- redis_client.lua -- netrun.redis in straight-line code: a few commands,
-- a pipelined batch (every command in one write, the replies in order),
-- a transaction and a script, each reply printed. Against redis-server:
--   netrun examples/redis_client.lua [--url redis://127.0.0.1:6379/0]
--                                    [--port 6379] [--batch 100] [--key netrun:demo]
-- The commands run in a coroutine on a loop (netrun.spawn), where each
-- wait for a reply yields instead of blocking; from the main thread, as
-- here for the last one, a call blocks until done.
local netrun = require "netrun"

local option = netrun.option
local url = option("url", "redis://127.0.0.1:" .. option("port", 6379))
local batch, key = option("batch", 100), option("key", "netrun:demo")

local r = netrun.redis.connect { url = url, timeout = 2 }

local function show(v, err)
  if v == nil then return err and "(error) " .. err or "(nil)" end
  if v == netrun.redis.null then return "(nil)" end
  if netrun.redis.is_error(v) then return "(error) " .. v.err end
  if type(v) == "table" then
    local parts = {}
    for i = 1, v.n or #v do parts[i] = show(v[i]) end
    return "[" .. table.concat(parts, ", ") .. "]"
  end
  return type(v) == "string" and string.format("%q", v) or tostring(v)
end

local group = netrun.group { threads = 1, name = "redis-client" }
local done = group:submit(function()
  return netrun.spawn(function()
    local ok, err = r:await()
    if not ok then error("cannot reach Redis at " .. url .. ": " .. err, 0) end
    print("PING ->", show(r:ping()))
    print("SET ->", show(r:set(key, "hello from netrun")))
    print("GET ->", show(r:get(key)))
    print("DEL ->", show(r:del(key .. ":n")))
    print("INCRBY ->", show(r:incrby(key .. ":n", 41)))
    print("INCR ->", show(r:incr(key .. ":n")))
    print("NOSUCH ->", show(r:call("NOSUCHCOMMAND")))
    -- a pipelined batch: every command in one write, then every reply
    local replies = r:pipeline(function(p)
      for _ = 1, batch do p:incr(key .. ":n") end
    end)
    local last = replies[replies.n]
    print(string.format("pipelined %d INCR -> last %s", batch, show(last)))
    print("MGET ->", show(r:mget(key, key .. ":n", key .. ":none")))
    print("MULTI/EXEC ->", show(r:transaction(function(t)
      t:incr(key .. ":tx")
      t:expire(key .. ":tx", 60)
    end)))
    print("EVAL ->", show(r:eval("return redis.call('STRLEN', KEYS[1])", 1, key)))
    r:del(key, key .. ":n", key .. ":tx")
    return last
  end)
end):sync():sync()
print(string.format("done: counter=%s", tostring(done)))
print("from the main thread: PING ->", show(r:ping()))
group:shutdown_gracefully(0, 1):sync()
