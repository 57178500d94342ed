-- proxy_stream_spec.lua -- examples/proxy.lua as users run it (bodies
-- streamed both ways by client:forwarder { stream = true }, the default)
-- in front of backends that misbehave on purpose
-- (spec/fixtures/fwd_backend.py): a backend slower than the client, one
-- that answers before reading the body, bodies cut short either way, a
-- client gone mid-download, a 101 nobody asked for; and a WebSocket
-- tunnelled through, Node's `ws` at both ends.
local H = require "spec.helper"
local socket = H.socket

local function spawn(cmd)
  local f = assert(io.popen(cmd .. " > /dev/null 2>&1 & echo $!"))
  local pid = tonumber(f:read("l"))
  f:close()
  return pid
end

local function listening(port)
  return H.eventually(function()
    local c = socket.tcp()
    local ok = c:connect("127.0.0.1", port)
    c:close()
    return ok
  end, 10)
end

describe("examples/proxy.lua, bodies streamed", function()
  local bpid, pid, port, bport
  setup(function()
    bport = H.free_port()
    bpid = spawn(string.format("python3 %s/spec/fixtures/fwd_backend.py %d", H.root, bport))
    assert(listening(bport), "fwd_backend.py did not start")
    port = H.free_port()
    pid = H.start(H.root .. "/examples/proxy.lua", port,
      "--backend 127.0.0.1:" .. bport .. " --max-body 0 --buffer 65536 --timeout 2")
  end)
  teardown(function()
    if pid then H.stop(pid) end
    if bpid then os.execute("kill " .. bpid) end
  end)

  -- the backend's counters, asked of it directly
  local function stats()
    local out = H.run(string.format("curl -s -m 5 http://127.0.0.1:%d/stats", bport))
    local c, k, a = out:match("conns=(%d+) cut=(%d+) aborted=(%d+)")
    return { conns = tonumber(c), cut = tonumber(k), aborted = tonumber(a) }
  end

  it("paces a client that sends faster than the backend reads: the body intact, the proxy's memory bounded", function()
    local n = (H.faults and 8 or 24) * 1024 * 1024
    local path = os.tmpname()
    assert(os.execute(string.format("head -c %d /dev/urandom > %s", n, path)))
    local want = H.run("sha256sum " .. path):match("^%x+")
    local rss0 = H.rss(pid)
    local out, st = H.run(string.format("curl -s -m 30 -T %s http://127.0.0.1:%d/slowread", path, port))
    assert.equal(0, st, out)
    assert.equal(n .. " " .. want, out:match("^%d+ %x+"))
    local grown = H.rss(pid) - rss0
    print(string.format("\n  %d MiB to a backend reading 64 KiB per 2 ms: proxy RSS %+d KiB", n >> 20, grown))
    if not H.sanitized then assert.is_true(grown < 8 * 1024, "RSS grew " .. grown .. " KiB") end
    os.remove(path)
  end)

  it("delivers an answer given before the body was read, then closes the client's connection (the rest unread)", function()
    local before = stats().conns
    local c = H.client(port)
    c:settimeout(5)
    assert(c:send("PUT /early HTTP/1.1\r\nHost: x\r\nContent-Length: 8388608\r\n\r\n" ..
      string.rep("e", 256 * 1024)))
    local status, h, body = H.read_response(c)
    assert.equal(200, status)
    assert.equal("early\n", body)
    assert.equal("close", h.connection)
    -- the proxy closes after the answer: the socket ends (EOF or reset)
    local ended = H.eventually(function()
      local _, err = c:receive(1)
      return err == "closed" or err == "connection reset by peer"
    end, 5)
    assert.is_true(ended, "the client's connection stayed open")
    c:close()
    -- the backend's connection, which may hold body bytes, is not reused
    local out = H.run(string.format("curl -s -m 5 -T /dev/null http://127.0.0.1:%d/x", port))
    assert.matches("^0 e3b0c442", out)
    assert.is_true(stats().conns >= before + 2, "a new backend connection for the next request")
  end)

  it("closes the backend's connection, never pooled, when the client cuts its body short", function()
    local cut = stats().cut
    local c = H.client(port)
    assert(c:send("PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n" ..
      string.rep("c", 100 * 1024)))
    -- (the backend has some of it before the client goes)
    H.eventually(function() return false end, 0.2)
    c:close()
    assert.is_truthy(H.eventually(function() return stats().cut == cut + 1 end, 5),
      "the backend never saw its connection end")
    local out = H.run(string.format("curl -s -m 5 --data-binary abc http://127.0.0.1:%d/x", port))
    assert.matches("^3 ba7816bf", out)                 -- (and the proxy serves on)
  end)

  it("closes the client's connection when the backend cuts its response short", function()
    local out, st = H.run(string.format("curl -s -m 5 -o /dev/null -w '%%{size_download}' " ..
      "http://127.0.0.1:%d/cut/1000000", port))
    assert.equal(18, st, out)                          -- curl: partial file
    assert.equal("500000", out)
  end)

  it("lets go of the backend when a client is killed mid-download, and serves on", function()
    local aborted = stats().aborted
    local rss0 = H.rss(pid)
    local c = H.client(port)
    c:settimeout(5)
    assert(c:send("GET /big/268435456 HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert(c:receive(1024 * 1024))
    c:close()
    assert.is_truthy(H.eventually(function() return stats().aborted == aborted + 1 end, 5),
      "the backend's connection was never closed")
    local grown = H.rss(pid) - rss0
    if not H.sanitized then assert.is_true(grown < 8 * 1024, "RSS grew " .. grown .. " KiB") end
    local out = H.run(string.format("curl -s -m 5 http://127.0.0.1:%d/big/3 | od -An -tx1", port))
    assert.matches("00 01 02", out)
  end)

  it("bounds each wait by --timeout, not the exchange: a slow upload passes, a stalled answer ends", function()
    local n = 16 * 1024 * 1024                        -- (read over ~2.6 s: 64 KiB per 10 ms)
    local t0 = socket.gettime()
    local path = os.tmpname()
    assert(os.execute(string.format("head -c %d /dev/zero > %s", n, path)))
    local out, st = H.run(string.format("curl -s -m 20 -T %s http://127.0.0.1:%d/crawl", path, port))
    os.remove(path)
    assert.equal(0, st, out)
    assert.matches("^" .. n .. " ", out)
    local took = socket.gettime() - t0
    t0 = socket.gettime()
    out, st = H.run(string.format("curl -s -m 20 -o /dev/null -w '%%{size_download}' http://127.0.0.1:%d/stall/1000000", port))
    local stalled = socket.gettime() - t0
    assert.equal(18, st, out)                          -- (partial: closed after --timeout)
    assert.equal("500000", out)
    assert.is_true(stalled < 10, "the stalled answer lasted " .. stalled .. " s")
    print(string.format("\n  a %.1f s upload passed a 2 s timeout; a stalled answer ended after %.1f s", took, stalled))
  end)

  it("keeps the backend's Content-Length on a streamed answer (no chunks), over one kept-alive connection", function()
    local out, st = H.run(string.format("curl -s -i http://127.0.0.1:%d/big/10 http://127.0.0.1:%d/big/20 -w '[%%{num_connects}]'",
      port, port))
    assert.equal(0, st, out)
    assert.matches("\r\n[Cc]ontent%-[Ll]ength: 10\r\n", out)
    assert.matches("\r\n[Cc]ontent%-[Ll]ength: 20\r\n", out)
    assert.is_nil(out:lower():find("transfer-encoding", 1, true))
    assert.matches("%[1%].*%[0%]$", out)                  -- (the second reused it)
  end)

  it("answers 502 to a 101 the backend gave though the request did not ask to switch", function()
    local out = H.run(string.format("curl -s -i -m 5 http://127.0.0.1:%d/switch", port))
    assert.matches("^HTTP/1.1 502 ", out)
  end)
end)

describe("examples/proxy.lua tunnelling a WebSocket", function()
  local nm = H.root .. "/bench/node/node_modules"
  local have_ws = io.open(nm .. "/ws/package.json") ~= nil
  local bpid, pid, port
  setup(function()
    if not have_ws then return end
    local bport = H.free_port()
    bpid = spawn(string.format("NODE_PATH=%s node %s/spec/fixtures/ws_backend.js %d", nm, H.root, bport))
    assert(listening(bport), "ws_backend.js did not start")
    port = H.free_port()
    pid = H.start(H.root .. "/examples/proxy.lua", port, "--backend 127.0.0.1:" .. bport .. " --buffer 65536")
  end)
  teardown(function()
    if pid then H.stop(pid) end
    if bpid then os.execute("kill " .. bpid) end
  end)

  local it_ws = have_ws and it or pending   -- (bench/node: npm install)
  it_ws("passes messages (1 MiB intact) and close codes both ways, Node's ws at each end", function()
    local out, st = H.run(string.format("NODE_PATH=%s timeout 20 node %s/spec/fixtures/ws_through.js " ..
      "ws://127.0.0.1:%d/chat", nm, H.root, port))
    assert.equal(0, st, out)
    assert.matches("^ok", out)
  end)
end)
