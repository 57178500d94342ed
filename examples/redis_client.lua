-- redis_client.lua -- a Redis client in straight-line code: a stream
-- (netrun.tcp.connect) in a coroutine on a loop, RESP written and read
-- with send/receive; every wait yields, nothing blocks the loop. It runs a
-- few commands, then a pipelined batch (all commands in one send, then
-- all replies), and prints each reply. Against redis-server (or
-- examples/redis.lua):
--   netrun examples/redis_client.lua [--host 127.0.0.1] [--port 6379]
--                                    [--batch 100] [--key netrun:demo]
local netrun = require "netrun"

local option = netrun.option
local host, port = option("host", "127.0.0.1"), option("port", 6379)
local batch, key = option("batch", 100), option("key", "netrun:demo")

-- A command as a RESP array of bulk strings.
local function command(...)
  local n = select("#", ...)
  local out = { "*" .. n .. "\r\n" }
  for i = 1, n do
    local a = tostring((select(i, ...)))
    out[#out + 1] = "$" .. #a .. "\r\n" .. a .. "\r\n"
  end
  return table.concat(out)
end

-- One reply: a string, an integer, nil, an array, or nil and the error
-- ("-ERR ..." replies come back as { err = "..." }).
local function reply(s)
  local line, err = s:receive("*l")
  if not line then return nil, err end
  local kind, rest = line:sub(1, 1), line:sub(2)
  if kind == "+" then return rest end
  if kind == "-" then return { err = rest } end
  if kind == ":" then return math.tointeger(tonumber(rest)) end
  if kind == "$" then
    local n = tonumber(rest)
    if n < 0 then return nil end
    local data, e = s:receive(n + 2)           -- the value and its CRLF
    if not data then return nil, e end
    return data:sub(1, n)
  end
  if kind == "*" then
    local n, arr = tonumber(rest), {}
    for i = 1, n do arr[i] = reply(s) end
    arr.n = n                                    -- nil elements included
    return arr
  end
  return nil, "bad reply: " .. line
end

local function call(s, ...)
  assert(s:send(command(...)))
  return reply(s)
end

local function show(v)
  if type(v) == "table" then
    if v.err then return "(error) " .. v.err end
    local parts = {}
    for i = 1, v.n or #v do parts[i] = show(v[i]) end
    return "[" .. table.concat(parts, ", ") .. "]"
  end
  return v == nil and "(nil)" or (type(v) == "string" and string.format("%q", v) or tostring(v))
end

local group = netrun.group { threads = 1, name = "redis-client" }
local done = group:submit(function()
  return netrun.spawn(function()
    local s = assert(netrun.tcp.connect(host, port, { timeout = 2 }):await())
    print("PING ->", show(call(s, "PING")))
    print("SET ->", show(call(s, "SET", key, "hello from netrun")))
    print("GET ->", show(call(s, "GET", key)))
    print("DEL ->", show(call(s, "DEL", key .. ":n")))
    print("INCRBY ->", show(call(s, "INCRBY", key .. ":n", 41)))
    print("INCR ->", show(call(s, "INCR", key .. ":n")))
    print("NOSUCH ->", show(call(s, "NOSUCHCOMMAND")))
    -- A pipelined batch: every command in one write, then every reply.
    local cmds = {}
    for i = 1, batch do cmds[i] = command("INCR", key .. ":n") end
    assert(s:send(table.concat(cmds)))
    local last
    for _ = 1, batch do last = reply(s) end
    print(string.format("pipelined %d INCR -> last %s", batch, show(last)))
    print("MGET ->", show(call(s, "MGET", key, key .. ":n", key .. ":none")))
    call(s, "DEL", key, key .. ":n")
    s:close()
    return last
  end)
end):sync():sync()
print(string.format("done: counter=%s", tostring(done)))
group:shutdown_gracefully(0, 1):sync()
