-- examples_spec.lua -- every example runs with `netrun examples/X.lua`.
local H = require "spec.helper"
local socket = H.socket
local BIN = H.BIN

local free_port, start, stop, run = H.free_port, H.start, H.stop, H.run

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
