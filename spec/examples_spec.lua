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

  it("echo.lua stops reading from a client that does not read its echoes", function()
    local port = free_port()
    local pid = start("examples/echo.lua", port)
    local c = H.client(port)
    c:settimeout(1)
    local before = H.rss(pid)
    local LIMIT = 256 << 20
    local sent = H.flood(c, string.rep("x", 65536), LIMIT)
    local grown = H.rss(pid) - before
    -- The kernel's buffers hold a few MiB; the server holds little more.
    assert.is_true(sent < LIMIT, "the server took all " .. sent .. " bytes")
    assert.is_true(grown < 32 * 1024, "server RSS grew by " .. grown .. " KiB")
    -- Reading drains it: every byte comes back, then it reads again.
    local got = 0
    while got < sent do
      local data, err, partial = c:receive(math.min(65536, sent - got))
      data = data or partial
      assert(err == nil or #data > 0, "receive failed: " .. tostring(err))
      got = got + #data
    end
    c:settimeout(5)
    c:send("ping\n")
    assert.equal("ping", c:receive("*l"))
    c:close()
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

  it("https_hello.lua answers curl over TLS; echo.lua and client.lua talk TLS", function()
    local port = free_port()
    local pid, log = start("examples/https_hello.lua", port)
    local f = assert(io.open(log))
    local cert = f:read("a"):match("self%-signed certificate (%S+%.crt)")
    f:close()
    assert.truthy(cert)
    local out, st = run("curl -sS --max-time 10 --cacert " .. cert .. " https://localhost:" .. port .. "/")
    assert.equal(0, st, out)
    assert.equal("Hello, World!", out)
    stop(pid)
    local key = cert:gsub("%.crt$", ".key")
    port = free_port()
    pid = start("examples/echo.lua", port, "--cert " .. cert .. " --key " .. key)
    out, st = run(BIN .. " examples/client.lua --port " .. port .. " --message 'over tls' --tls " .. cert)
    assert.equal(0, st, out)
    assert.equal("over tls", out)
    out, st = run(BIN .. " examples/client.lua --port " .. port .. " --message x --tls system")
    assert.equal(1, st, out)
    assert.matches("certificate verify failed", out)
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
