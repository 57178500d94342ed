-- redis.lua -- a Redis-compatible server (RESP2) for redis-cli and
-- redis-benchmark: PING, ECHO, SET (EX/PX/NX/XX), GET, DEL, EXISTS, INCR,
-- INCRBY, DECR, DECRBY, EXPIRE, DBSIZE, FLUSHALL/FLUSHDB, SELECT, QUIT, and
-- harmless answers to CONFIG GET and COMMAND.
--   netrun examples/redis.lua [--port N] [--threads N] [--capacity N]
--   (or PORT=N THREADS=N)
-- The native decoder (netrun.codec.resp) turns each request into an array
-- of strings; dispatch and replies are Lua. Keys live in one shared dict,
-- so every worker loop sees the same data. Integers are stored as Lua
-- integers, which makes INCR one atomic dict operation.
local netrun = require "netrun"

local option = netrun.option

local port = option("port", 6379)
local threads = option("threads", 1)
local capacity = option("capacity", 1000000)

local db = netrun.shared.dict("redis", { capacity = capacity })

-- db's methods as plain functions, each found once per loop state:
-- dict.set(db, k, v) reads a field of a plain table, where db:set(k, v)
-- looks the method up through db's metatable on every call. (Each loop
-- state gets its own copy of this table, empty -- a C function is not
-- copied between states -- and fills it on first use.)
local dict = setmetatable({}, { __index = function(t, name)
  local f = db[name]
  t[name] = f
  return f
end })

local OK, PONG, NIL = "+OK\r\n", "+PONG\r\n", "$-1\r\n"
local tostring, tointeger, upper, concat, type = tostring, math.tointeger, string.upper, table.concat, type
local mininteger = math.mininteger

local function bulk(s)
  if #s > 4096 then   -- large values go out gathered, not copied
    return { "$" .. #s .. "\r\n", s, "\r\n" }
  end
  return "$" .. #s .. "\r\n" .. s .. "\r\n"
end

local function int(n) return ":" .. n .. "\r\n" end

local function arity(name)
  return "-ERR wrong number of arguments for '" .. name .. "' command\r\n"
end

local NOT_INT = "-ERR value is not an integer or out of range\r\n"
local SYNTAX = "-ERR syntax error\r\n"

-- A canonical decimal integer in range ("12", "-3", not "012" or "1e3"),
-- else nil: such values are stored as integers so that INCR is atomic and
-- GET gives back the very same string.
local byte, find = string.byte, string.find
local NUM_START = { [45] = true }   -- the bytes an integer starts with: -, 0-9
for b = 48, 57 do NUM_START[b] = true end
local function as_integer(s)
  if not NUM_START[byte(s) or 0] or #s > 20 then return nil end
  if s == "0" or find(s, "^%-?[1-9]%d*$") then
    local n = tointeger(s)
    if n and tostring(n) == s then return n end
  end
  return nil
end

local C = {}

function C.PING(cmd, n)
  if n == 1 then return PONG end
  if n == 2 then return bulk(cmd[2]) end
  return arity("ping")
end

function C.ECHO(cmd, n)
  if n ~= 2 then return arity("echo") end
  return bulk(cmd[2])
end

function C.GET(cmd, n)
  if n ~= 2 then return arity("get") end
  local v = dict.get(db, cmd[2])
  if v == nil then return NIL end
  if type(v) ~= "string" then v = tostring(v) end
  return bulk(v)
end

-- SET key value [EX seconds | PX milliseconds] [NX | XX]
function C.SET(cmd, n)
  if n < 3 then return arity("set") end
  local k, v = cmd[2], cmd[3]
  -- Integers are stored as such (see above). An integer starts with one
  -- of "-0123456789", so a value whose first byte is not in "-" .. "9"
  -- is none: `<` orders strings byte by byte in the C locale, which
  -- netrun keeps (it never calls setlocale), so these two compares, made
  -- without a call, let most values by before as_integer.
  if v < ":" and v >= "-" then v = as_integer(v) or v end
  if n == 3 then          -- no options: the usual SET, made short
    dict.set(db, k, v)
    return OK
  end
  local ttl, nx, xx
  local i = 4
  while i <= n do
    local o = upper(cmd[i])
    if (o == "EX" or o == "PX") and i < n and ttl == nil then
      local t = as_integer(cmd[i + 1])
      if t == nil then return NOT_INT end
      if t <= 0 then return "-ERR invalid expire time in 'set' command\r\n" end
      ttl = o == "EX" and t or t / 1000
      i = i + 2
    elseif o == "NX" and not xx then
      nx, i = true, i + 1
    elseif o == "XX" and not nx then
      xx, i = true, i + 1
    else
      return SYNTAX
    end
  end
  if nx then
    return dict.add(db, k, v, ttl) and OK or NIL
  end
  if xx and dict.get(db, k) == nil then return NIL end
  dict.set(db, k, v, ttl)
  return OK
end

function C.DEL(cmd, n)
  if n < 2 then return arity("del") end
  local count = 0
  for i = 2, n do
    if dict.get(db, cmd[i]) ~= nil then
      dict.delete(db, cmd[i])
      count = count + 1
    end
  end
  return int(count)
end

function C.EXISTS(cmd, n)
  if n < 2 then return arity("exists") end
  local count = 0
  for i = 2, n do
    if dict.get(db, cmd[i]) ~= nil then count = count + 1 end
  end
  return int(count)
end

local function incr_by(k, by)
  local v, err = dict.incr(db, k, by, 0)
  if v == nil then
    return err == "not a number" and NOT_INT or "-ERR " .. tostring(err) .. "\r\n"
  end
  local old = v - by                      -- wraps exactly as the dict did
  if (by > 0 and v < old) or (by < 0 and v > old) then
    dict.incr(db, k, -by)
    return "-ERR increment or decrement would overflow\r\n"
  end
  return int(v)
end

function C.INCR(cmd, n)
  if n ~= 2 then return arity("incr") end
  return incr_by(cmd[2], 1)
end

function C.DECR(cmd, n)
  if n ~= 2 then return arity("decr") end
  return incr_by(cmd[2], -1)
end

function C.INCRBY(cmd, n)
  if n ~= 3 then return arity("incrby") end
  local by = as_integer(cmd[3])
  if by == nil then return NOT_INT end
  return incr_by(cmd[2], by)
end

function C.DECRBY(cmd, n)
  if n ~= 3 then return arity("decrby") end
  local by = as_integer(cmd[3])
  if by == nil or by == mininteger then return NOT_INT end
  return incr_by(cmd[2], -by)
end

-- EXPIRE key seconds: 1 if the key exists (and now expires), else 0. The
-- dict has no "touch", so the value is stored again with the TTL.
function C.EXPIRE(cmd, n)
  if n ~= 3 then return arity("expire") end
  local secs = as_integer(cmd[3])
  if secs == nil then return NOT_INT end
  local k = cmd[2]
  local v = dict.get(db, k)
  if v == nil then return ":0\r\n" end
  if secs <= 0 then
    dict.delete(db, k)
  else
    dict.set(db, k, v, secs)
  end
  return ":1\r\n"
end

function C.DBSIZE(_, n)
  if n ~= 1 then return arity("dbsize") end
  return int(#db)
end

function C.FLUSHALL() dict.flush_all(db) return OK end
C.FLUSHDB = C.FLUSHALL

function C.SELECT(cmd, n)
  if n ~= 2 then return arity("select") end
  if cmd[2] ~= "0" then return "-ERR DB index is out of range\r\n" end
  return OK
end

-- CONFIG GET param...: redis-benchmark asks for "save" and "appendonly".
local CONFIG = { save = "", appendonly = "no", databases = "1" }
function C.CONFIG(cmd, n)
  if n >= 3 and upper(cmd[2]) == "GET" then
    local out, m = {}, 0
    for i = 3, n do
      local v = CONFIG[cmd[i]:lower()]
      if v then
        out[#out + 1] = bulk(cmd[i]:lower()) .. bulk(v)
        m = m + 2
      end
    end
    return "*" .. m .. "\r\n" .. concat(out)
  end
  if n >= 2 and upper(cmd[2]) == "SET" then return OK end
  return "-ERR unsupported CONFIG subcommand\r\n"
end

-- redis-cli asks for command docs to show hints: an empty answer is fine.
function C.COMMAND() return "*0\r\n" end

local function unknown(cmd)
  local args = {}
  for i = 2, math.min(#cmd, 4) do args[#args + 1] = "'" .. cmd[i] .. "' " end
  return "-ERR unknown command '" .. cmd[1] .. "', with args beginning with: "
    .. concat(args) .. "\r\n"
end

-- Each reply is written at once into the channel's outbound buffer (a
-- copy, no system call) and the burst is flushed once, in
-- channel_read_complete: one send per burst, which is what pipelining
-- clients need. Nobody looks at a write's future, so the writes take the
-- void promise and make none; a failed write still reaches
-- exception_caught. A reply is a string or, for a large value, an array
-- of strings written gathered. A client that pipelines and reads nothing
-- turns the channel unwritable: the handler then gets the rest of the
-- burst only once the replies have drained (read batches, docs/guide/handlers-and-pipelines.md), and
-- the RESP codec reads nothing meanwhile.
local VOID = netrun.void_promise()

local function reply(ctx, r)
  ctx:write(r, VOID)
end

-- QUIT: +OK after the replies before it, then close.
function C.QUIT(_, _, ctx)
  reply(ctx, OK)
  ctx:flush()
  ctx:close()
end

local Redis = {}

function Redis:channel_read(ctx, cmd)
  local name = cmd[1]
  local f = C[name]
  if f == nil then
    f = C[upper(name)]
    if f == nil then
      reply(ctx, unknown(cmd))
      return
    end
  end
  local r = f(cmd, #cmd, ctx)
  if r then ctx:write(r, VOID) end   -- reply(), inlined: every command
end

function Redis:channel_read_complete(ctx)
  ctx:flush()
end

-- A protocol error from the decoder: send the replies to the requests
-- before it; the decoder then answers "-ERR Protocol error" and closes.
-- Anything else (a bug in a command) is logged and closes the connection.
function Redis:exception_caught(ctx, err)
  ctx:flush()
  if not tostring(err):find("^RESP: Protocol error") then
    -- a peer that resets its connection is routine, not a warning
    local reset = tostring(err):find("ECONNRESET") or tostring(err):find("EPIPE")
    netrun.log[reset and "debug" or "warn"]("channel %d: %s", ctx.channel:id(), err)
    ctx:close()
  end
end

local resp = netrun.codec.resp()   -- one configuration, made once

local workers = netrun.group { threads = threads, name = "redis" }
local server = netrun.server {
  group = workers,
  host = option("host", "127.0.0.1"),
  port = port,
  init = function(ch)
    ch:pipeline():add_last("resp", resp):add_last("redis", Redis)
  end,
}:sync()

netrun.log.info("redis server listening on %s:%d", server:local_address())
