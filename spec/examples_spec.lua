-- examples_spec.lua -- every example runs with `netrun examples/X.lua`.
local H = require "spec.helper"
local socket = H.socket
local BIN = os.getenv("NETRUN_BIN") or (H.build .. "/bin/netrun")

local function free_port()
  local s = assert(socket.bind("127.0.0.1", 0))
  local _, port = s:getsockname()
  s:close()
  return tonumber(port)
end

-- Start an example in the background; wait (bounded) until it logs that
-- it listens (probing with a connection would disturb the chat room).
local function start(script, port)
  local log = os.tmpname()
  local f = assert(io.popen(string.format("%s %s --port %d > %s 2>&1 & echo $!", BIN, script, port, log)))
  local pid = tonumber(f:read("l"))
  f:close()
  local deadline = socket.gettime() + 10
  repeat
    local lf = io.open(log)
    local text = lf and lf:read("a") or ""
    if lf then lf:close() end
    if text:find(":" .. port, 1, true) then return pid end
    socket.sleep(0.02)
  until socket.gettime() > deadline
  error(script .. " never listened on " .. port)
end

local function stop(pid) os.execute("kill -TERM " .. pid) end

local function run(cmd)
  local f = assert(io.popen(cmd .. " 2>&1; echo \"::status=$?\""))
  local out = f:read("a")
  f:close()
  return out:gsub("::status=%d+%s*$", ""), tonumber(out:match("::status=(%d+)%s*$"))
end

describe("examples", function()
  it("echo.lua echoes, and client.lua talks to it", function()
    local port = free_port()
    local pid = start("examples/echo.lua", port)
    local c = H.client(port)
    c:send("ping\n")
    assert.equal("ping", c:receive("*l"))
    c:close()
    local out, st = run(BIN .. " examples/client.lua --port " .. port .. " --message 'round trip'")
    assert.equal(0, st)
    assert.equal("round trip", out)
    stop(pid)
  end)

  it("client.lua reports a refused connection and exits 1", function()
    local out, st = run(BIN .. " examples/client.lua --port " .. free_port())
    assert.equal(1, st)
    assert.matches("ECONNREFUSED", out)
  end)

  it("chat.lua broadcasts each line to every member", function()
    local port = free_port()
    local pid = start("examples/chat.lua", port)
    local a = H.client(port)
    assert.matches("^welcome", a:receive("*l"))
    local b = H.client(port)
    assert.matches("^%* user %d+ joined", a:receive("*l"))
    assert.matches("^welcome, user %d+; 2 here", b:receive("*l"))
    a:send("hello room\n")
    assert.matches("^<user %d+> hello room$", a:receive("*l"))
    assert.matches("^<user %d+> hello room$", b:receive("*l"))
    b:close()
    assert.equal("* a user left", a:receive("*l"))
    a:close()
    stop(pid)
  end)

  it("timers.lua runs its timers and exits by itself", function()
    local out, st = run(BIN .. " examples/timers.lua")
    assert.equal(0, st)
    assert.matches("cancelled a 10 s timer:\ttrue", out)
    assert.matches("one%-shot after 0%.25 s on timers%-1", out)
    assert.matches("coroutine woke up, 3", out)
    assert.not_matches("never printed", out)
    assert.matches("done\n$", out)
  end)
end)
