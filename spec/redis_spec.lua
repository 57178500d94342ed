-- redis_spec.lua -- examples/redis.lua as real Redis clients see it:
-- redis-cli for the commands and their errors, LuaSocket for raw RESP
-- (pipelining, inline commands, split and large requests, protocol
-- errors), and a short bounded redis-benchmark run.
local H = require "spec.helper"
local socket = H.socket

local free_port, run = H.free_port, H.run
local function start(port) return H.start("examples/redis.lua", port) end

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- One redis-cli command; returns its output without the final newline.
local port, pid, log
local function cli(...)
  local args = {}
  for i, a in ipairs { ... } do args[i] = shell_quote(a) end
  local out, st = run("timeout 10 redis-cli -p " .. port .. " " .. table.concat(args, " "))
  assert.equal(0, st, out)
  return (out:gsub("\n+$", ""))
end

-- RESP encoding of a command, for the raw-socket tests.
local function resp(...)
  local t = { "*" .. select("#", ...) .. "\r\n" }
  for _, a in ipairs { ... } do t[#t + 1] = "$" .. #a .. "\r\n" .. a .. "\r\n" end
  return table.concat(t)
end

describe("examples/redis.lua", function()
  setup(function()
    port = free_port()
    pid, log = start(port)
  end)
  teardown(function()
    if pid then os.execute("kill -KILL " .. pid .. " 2>/dev/null") end
    os.remove(log)
  end)

  it("answers PING, ECHO, SET, GET, DEL, INCR and EXPIRE through redis-cli", function()
    assert.equal("PONG", cli("PING"))
    assert.equal("hello world", cli("ping", "hello world"))
    assert.equal("a b\tc", cli("ECHO", "a b\tc"))
    assert.equal("OK", cli("SET", "spec:k", "v1"))
    assert.equal("v1", cli("GET", "spec:k"))
    assert.equal("", cli("GET", "spec:missing"))          -- nil prints nothing when piped
    assert.equal("OK", cli("set", "spec:n", "41"))
    assert.equal("42", cli("INCR", "spec:n"))
    assert.equal("42", cli("GET", "spec:n"))
    assert.equal("1", cli("INCR", "spec:fresh"))
    assert.equal("2", cli("DEL", "spec:k", "spec:n", "spec:nothing"))
    assert.equal("", cli("GET", "spec:k"))
    assert.equal("0", cli("EXPIRE", "spec:nothing", "10"))
    assert.equal("1", cli("EXPIRE", "spec:fresh", "100"))
    assert.equal("1", cli("GET", "spec:fresh"))           -- still there, with a TTL
    assert.equal("1", cli("EXPIRE", "spec:fresh", "0"))   -- 0 s: gone at once
    assert.equal("", cli("GET", "spec:fresh"))
  end)

  it("answers unknown commands, wrong arity and bad values with errors", function()
    assert.equal("ERR unknown command 'NOPE', with args beginning with: 'x' 'y' ",
      cli("NOPE", "x", "y"))
    -- the handler sees the name as the client sent it, case and all
    assert.equal("ERR unknown command 'nOpE', with args beginning with: ", cli("nOpE"))
    assert.equal("ERR unknown command 'nope', with args beginning with: ", cli("nope"))
    assert.equal("ERR wrong number of arguments for 'get' command", cli("GET"))
    assert.equal("ERR wrong number of arguments for 'set' command", cli("SET", "k"))
    assert.equal("ERR wrong number of arguments for 'incr' command", cli("INCR"))
    assert.equal("ERR wrong number of arguments for 'expire' command", cli("EXPIRE", "k"))
    assert.equal("OK", cli("SET", "spec:s", "abc"))
    assert.equal("ERR value is not an integer or out of range", cli("INCR", "spec:s"))
    assert.equal("ERR syntax error", cli("SET", "spec:s", "v", "BOGUS"))
    assert.equal("OK", cli("SET", "spec:max", "9223372036854775807"))
    assert.equal("ERR increment or decrement would overflow", cli("INCR", "spec:max"))
    assert.equal("9223372036854775807", cli("GET", "spec:max"))
  end)

  it("stores SET's canonical integers as integers, other values as strings", function()
    assert.equal("OK", cli("SET", "spec:neg", "-5"))      -- INCR works on integers only
    assert.equal("-4", cli("INCR", "spec:neg"))
    assert.equal("OK", cli("SET", "spec:zero", "0"))
    assert.equal("1", cli("INCR", "spec:zero"))
    assert.equal("OK", cli("SET", "spec:nine", "9"))
    assert.equal("10", cli("INCR", "spec:nine"))
    for _, v in ipairs { "012", "1e3", "-", "+1", " 1", "x1", "" } do
      assert.equal("OK", cli("SET", "spec:str", v))
      assert.equal("ERR value is not an integer or out of range", cli("INCR", "spec:str"))
      assert.equal(v, cli("GET", "spec:str"))
    end
  end)

  it("honours SET EX/PX/NX/XX", function()
    assert.equal("", cli("SET", "spec:x", "1", "XX"))
    assert.equal("OK", cli("SET", "spec:x", "1", "NX"))
    assert.equal("", cli("SET", "spec:x", "2", "NX"))
    assert.equal("OK", cli("SET", "spec:x", "3", "XX", "EX", "100"))
    assert.equal("3", cli("GET", "spec:x"))
    assert.equal("ERR invalid expire time in 'set' command", cli("SET", "spec:x", "1", "EX", "0"))
    -- PX: present right after (same request batch), gone once it expires.
    local c = H.client(port)
    c:send(resp("SET", "spec:px", "soon", "PX", "200") .. resp("GET", "spec:px"))
    assert.equal("+OK", c:receive("*l"))
    assert.equal("$4", c:receive("*l"))
    assert.equal("soon", c:receive("*l"))
    local deadline, gone = socket.gettime() + 5, false
    while not gone and socket.gettime() < deadline do
      socket.sleep(0.05)
      c:send(resp("GET", "spec:px"))
      gone = c:receive("*l") == "$-1"
    end
    assert.is_true(gone, "spec:px never expired")
    c:close()
  end)

  it("serves pipelined, inline, split and large requests on one connection", function()
    local c = H.client(port)
    -- 100 pipelined commands in one send, answered in order.
    local batch = {}
    for i = 1, 100 do batch[i] = resp("SET", "spec:p" .. i, tostring(i)) .. resp("GET", "spec:p" .. i) end
    c:send(table.concat(batch))
    for i = 1, 100 do
      assert.equal("+OK", c:receive("*l"))
      assert.equal("$" .. #tostring(i), c:receive("*l"))
      assert.equal(tostring(i), c:receive("*l"))
    end
    -- Inline commands, as telnet users and redis-benchmark's PING_INLINE send them.
    c:send("PING\r\nECHO inline\r\n")
    assert.equal("+PONG", c:receive("*l"))
    assert.equal("$6", c:receive("*l"))
    assert.equal("inline", c:receive("*l"))
    -- A request dribbled a few bytes at a time.
    local req = resp("ECHO", "split")
    for i = 1, #req, 3 do
      c:send(req:sub(i, i + 2))
      socket.sleep(0.001)
    end
    assert.equal("$5", c:receive("*l"))
    assert.equal("split", c:receive("*l"))
    -- A 200 KiB value round trip (cumulated in, gathered out).
    local big = string.rep("0123456789abcdef", 200 * 64)
    c:send(resp("SET", "spec:big", big) .. resp("GET", "spec:big"))
    assert.equal("+OK", c:receive("*l"))
    assert.equal("$" .. #big, c:receive("*l"))
    assert.equal(big, H.recv(c, #big))
    assert.equal("", c:receive("*l"))
    c:close()
  end)

  it("serves every worker loop from the one dict (--threads 3, a connection per loop and more)", function()
    -- Each loop state finds the dict's methods for itself (redis.lua's
    -- `dict`): every loop must store, read and count in the same dict.
    local p3 = free_port()
    local pid3, log3 = H.start("examples/redis.lua", p3, "--threads 3")
    local ok, err = pcall(function()
      local cs = {}
      for i = 1, 6 do                      -- handed to the loops in turn
        cs[i] = H.client(p3)
        cs[i]:send(resp("SET", "spec:t" .. i, "v" .. i) .. resp("INCR", "spec:t:count"))
        assert.equal("+OK", cs[i]:receive("*l"))
        assert.equal(":" .. i, cs[i]:receive("*l"))
      end
      for i = 1, 6 do                      -- each reads its neighbour's key
        local j = i % 6 + 1
        cs[i]:send(resp("GET", "spec:t" .. j))
        assert.equal("$" .. #("v" .. j), cs[i]:receive("*l"))
        assert.equal("v" .. j, cs[i]:receive("*l"))
      end
      for i = 1, 6 do                      -- a SET with options, an integer
        cs[i]:send(resp("set", "spec:t" .. i, "-" .. i, "EX", "100") .. resp("DECR", "spec:t" .. i))
        assert.equal("+OK", cs[i]:receive("*l"))
        assert.equal(":" .. (-i - 1), cs[i]:receive("*l"))
      end
      for i = 1, 6 do cs[i]:close() end
    end)
    os.execute("kill -KILL " .. pid3 .. " 2>/dev/null")
    os.remove(log3)
    assert(ok, err)
  end)

  it("holds no pile of replies for a client that pipelines and reads nothing", function()
    local function rss()
      local f = assert(io.open("/proc/" .. pid .. "/status"))
      local kb = tonumber(f:read("a"):match("VmRSS:%s*(%d+)"))
      f:close()
      return kb
    end
    local value = string.rep("v", 16384)
    local c = H.client(port)
    c:send(resp("SET", "spec:unread", value))
    assert.equal("+OK", c:receive("*l"))
    local before = rss()
    local N = 4000                              -- 100 KB of commands, 64 MB of replies
    local one = resp("GET", "spec:unread")
    assert(c:send(string.rep(one, N)))
    -- Another client's round trip: the server has read the burst by then.
    local other = H.client(port)
    for _ = 1, 3 do
      other:send("PING\r\n")
      assert.equal("+PONG", other:receive("*l"))
    end
    other:close()
    local grown = rss() - before
    assert.is_true(grown < 16 * 1024, "server RSS grew by " .. grown .. " KiB")
    -- Reading drains it: every reply comes, in order.
    for _ = 1, N do
      assert.equal("$16384", c:receive("*l"))
      assert.equal(value, H.recv(c, 16384))
      assert.equal("", c:receive("*l"))
    end
    c:close()
  end)

  it("answers a protocol error like Redis, then closes", function()
    local c = H.client(port)
    c:send(resp("PING") .. "*1\r\n$x\r\n" .. resp("PING"))
    assert.equal("+PONG", c:receive("*l"))
    assert.equal("-ERR Protocol error: invalid bulk length", c:receive("*l"))
    local data, err = c:receive("*l")
    assert.is_nil(data)
    assert.equal("closed", err)
    c:close()
    -- A bulk over the 1 MiB default limit is refused before its data comes.
    c = H.client(port)
    c:send("*2\r\n$4\r\nECHO\r\n$2000000\r\n")
    assert.equal("-ERR Protocol error: bulk length over the limit", c:receive("*l"))
    c:close()
    -- The server is still up.
    assert.equal("PONG", cli("PING"))
  end)

  it("refuses a request over max_request (64 MiB) before its data comes, then closes", function()
    local before = H.rss(pid)
    local c = H.client(port)
    local MiB, LIMIT = 1 << 20, 64 << 20
    local bulk = string.rep("b", MiB)
    local head = "$" .. MiB .. "\r\n"
    -- 100 arguments of 1 MiB, each under max_bulk; sent up to the header
    -- that takes the request past 64 MiB (the server reads all of it).
    local sent = 6
    assert(c:send("*100\r\n"))
    while sent + #head + MiB + 2 <= LIMIT do
      assert(c:send(head .. bulk .. "\r\n"))
      sent = sent + #head + MiB + 2
    end
    assert(c:send(head))
    assert.equal("-ERR Protocol error: request size over the limit", c:receive("*l"))
    local data, err = c:receive("*l")
    assert.is_nil(data)
    assert.equal("closed", err)
    c:close()
    local grown = H.rss(pid) - before
    if not H.sanitized then
      assert.is_true(grown < 96 * 1024, "server RSS grew by " .. grown .. " KiB")
    end
    assert.equal("PONG", cli("PING"))
  end)

  it("completes a short redis-benchmark run", function()
    local out, st = run("timeout 120 redis-benchmark -p " .. port
      .. " -t ping,set,get -n 2000 -c 10 -q")
    assert.equal(0, st, out)
    for _, test in ipairs { "PING_INLINE", "PING_MBULK", "SET", "GET" } do
      assert.matches(test .. ": [%d.]+ requests per second", out)
    end
    -- With pipelining too.
    out, st = run("timeout 120 redis-benchmark -p " .. port .. " -t get -n 2000 -c 4 -P 16 -q")
    assert.equal(0, st, out)
    assert.matches("GET: [%d.]+ requests per second", out)
  end)

  it("shuts down on SIGTERM, cleanly (no sanitizer report in its log)", function()
    os.execute("kill -TERM " .. pid)
    local _, st = run("timeout 20 tail --pid=" .. pid .. " -f /dev/null")
    assert.equal(0, st, "the server did not exit within 20 s")
    pid = nil
    local f = assert(io.open(log))
    local text = f:read("a")
    f:close()
    assert.not_matches("Sanitizer", text)
    assert.not_matches("runtime error", text)
    assert.matches("shutting down", text)
  end)
end)
