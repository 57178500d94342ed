-- proxy_spec.lua -- examples/proxy.lua run as users run it, in front of a
-- netrun backend in this process: curl end to end, the keep-alive pool to
-- the backend (connections counted by the backend), 502 and 504, and a
-- client that reads nothing (backpressure: the proxy stops asking the
-- backend, and its memory stays bounded).
local H = require "spec.helper"
local netrun = H.netrun
local socket = H.socket

local counters = netrun.shared.dict("proxy_spec")

-- The backend: counts connections and requests; /big answers 256 KiB,
-- /slow after 2 s, anything else echoes what it got.
local function backend(group)
  counters:set("conns", 0)
  counters:set("reqs", 0)
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0,
    init = function(ch)
      local netrun = require "netrun"
      local d = netrun.shared.dict("proxy_spec")
      d:incr("conns", 1, 0)
      ch:pipeline():add_last("http", netrun.codec.http_server {})
      ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
        d:incr("reqs", 1, 0)
        if req.path == "/big" then
          ctx:write_and_flush { status = 200, body = string.rep(string.char(65 + d:get("reqs") % 26), 256 * 1024) }
        elseif req.path:find("^/delay/") then   -- /delay/<ms>/<n>: answers n after ms
          local ms, n = req.path:match("^/delay/(%d+)/(%d+)$")
          ctx:loop():schedule(tonumber(ms) / 1000, function()
            if ctx.channel:is_open() then ctx:write_and_flush { status = 200, body = n } end
          end)
        elseif req.path == "/slow" then
          -- (only while open: the last case below covers a late write)
          ctx:loop():schedule(2, function()
            if ctx.channel:is_open() then ctx:write_and_flush { status = 200, body = "late" } end
          end)
        else
          ctx:write_and_flush { status = 200, headers = { ["x-seen-xff"] = tostring(req.headers["x-forwarded-for"]),
            ["x-conn-hdr"] = tostring(req.headers.connection),
            ["x-seen-target"] = req.target, ["x-seen-host"] = tostring(req.headers.host) },
            body = req.method .. " " .. req.path .. "?" .. tostring(req.query) .. " " .. req.body }
        end
      end })
    end,
  }:sync()
  local _, port = server:local_address()
  return server, port
end

describe("examples/proxy.lua", function()
  local group, server, bport, pid, port
  setup(function()
    group = netrun.group { threads = 1, name = "backend" }
    server, bport = backend(group)
    port = H.free_port()
    pid = H.start(H.root .. "/examples/proxy.lua", port,
      "--backend 127.0.0.1:" .. bport .. " --timeout 1.5")   -- /slow takes 2 s
  end)
  teardown(function()
    H.stop(pid)
    server:close():sync()
    H.shutdown(group)
  end)

  it("proxies curl's requests over one keep-alive connection to the backend", function()
    counters:set("conns", 0)
    for i = 1, 10 do
      local out, status = H.run(string.format("curl -s -i -d 'body%d' 'http://127.0.0.1:%d/p/%d?q=%d'", i, port, i, i))
      assert.equal(0, status)
      assert.matches("^HTTP/1.1 200 OK\r\n", out)
      assert.matches("x%-seen%-xff: 127%.0%.0%.1", out)
      assert.matches("x%-conn%-hdr: nil", out)     -- hop-by-hop fields stay on their hop
      assert.matches("\r\n\r\nPOST /p/" .. i .. "%?q=" .. i .. " body" .. i .. "$", out)
    end
    assert.equal(1, counters:get("conns"))
  end)

  it("answers pipelined requests in their order, whatever order the backend answers in", function()
    -- 40 requests: more than --in-flight (16), so the ring of slots goes
    -- round more than twice; the backend answers each after 0-29 ms
    local c = H.client(port)
    local reqs = {}
    for i = 1, 40 do
      reqs[i] = string.format("GET /delay/%d/%d HTTP/1.1\r\nHost: x\r\n\r\n", (i * 7919) % 30, i)
    end
    assert(c:send(table.concat(reqs)))
    c:settimeout(10)
    for i = 1, 40 do
      local status, _, body = H.read_response(c)
      assert.equal(200, status)
      assert.equal(tostring(i), body)
    end
    c:close()
  end)

  it("sends origin-form on with the host the proxy saw: an absolute-form target does not reach the backend", function()
    -- The backend would take an absolute-form target's host over Host
    -- (RFC 9112 3.2.2): it gets the path the proxy's rules saw, and that
    -- host as Host.
    local c = H.client(port)
    c:send("GET http://evil.example/admin?k=1 HTTP/1.1\r\nHost: public.example\r\n\r\n" ..
           "GET /pub/../admin//x HTTP/1.1\r\nHost: public.example\r\n\r\n")
    local status, headers, body = H.read_response(c)
    assert.equal(200, status, body)
    assert.equal("/admin?k=1", headers["x-seen-target"])
    assert.equal("evil.example", headers["x-seen-host"])
    assert.equal("GET /admin?k=1 ", body)
    status, headers, body = H.read_response(c)
    assert.equal(200, status)
    assert.equal("/admin/x", headers["x-seen-target"])
    assert.equal("public.example", headers["x-seen-host"])
    c:close()
  end)

  it("answers 502 when the backend fails and 504 past its timeout", function()
    local out = H.run(string.format("curl -s -i 'http://127.0.0.1:%d/slow'", port))
    assert.matches("^HTTP/1.1 504 ", out)
    local port2 = H.free_port()
    local pid2 = H.start(H.root .. "/examples/proxy.lua", port2, "--backend 127.0.0.1:" .. H.free_port())
    out = H.run(string.format("curl -s -i 'http://127.0.0.1:%d/x'", port2))
    assert.is_true(H.stop(pid2))
    assert.matches("^HTTP/1.1 502 ", out)
  end)

  it("stops asking the backend while a client reads nothing, then delivers every answer", function()
    counters:set("reqs", 0)
    local c = H.client(port)
    local n = 60                      -- within the server codec's 64 unanswered
    local reqs = {}
    for i = 1, n do reqs[i] = "GET /big HTTP/1.1\r\nHost: x\r\n\r\n" end
    assert(c:send(table.concat(reqs)))
    local rss0 = H.rss(pid)
    -- the proxy stalls: the backend's request count stops growing
    local asked = H.eventually(function()
      local a = counters:get("reqs")
      socket.select(nil, nil, 0.3)
      return a > 0 and a == counters:get("reqs") and a
    end, 20)
    local grew = H.rss(pid) - rss0
    assert.is_true(asked < n, "the backend was asked " .. tostring(asked) .. " times")
    if not H.sanitized then
      assert.is_true(grew < 16 * 1024, "the proxy grew by " .. grew .. " KiB")
    end
    -- now read everything: every response, whole and in order
    c:settimeout(20)
    for i = 1, n do
      local status, _, body = H.read_response(c)
      assert.equal(200, status)
      assert.equal(256 * 1024, #body)
    end
    c:close()
    assert.equal(n, counters:get("reqs"))
    print(string.format("\n  slow reader: backend asked %d of %d while stalled; proxy RSS +%d KiB", asked, n, grew))
  end)

  it("answers HEAD with the backend's Content-Length and no body", function()
    local out, status = H.run(string.format("curl -s -I 'http://127.0.0.1:%d/p/1'", port))
    assert.equal(0, status, out)
    assert.matches("^HTTP/1.1 200 OK\r\n", out)
    -- the backend's GET would answer "HEAD /p/1?nil " (14 bytes)
    assert.matches("\r\n[Cc]ontent%-[Ll]ength: 14\r\n", out)
    local c = H.client(port)              -- and nothing follows the head
    c:send("HEAD /p/2 HTTP/1.1\r\nHost: x\r\n\r\nGET /p/3 HTTP/1.1\r\nHost: x\r\n\r\n")
    local st, h = H.read_response(c, true)
    assert.equal(200, st)
    assert.equal("14", h["content-length"])
    local st2, _, body = H.read_response(c)
    assert.equal(200, st2)
    assert.equal("GET /p/3?nil ", body)
    c:close()
  end)

  it("holds request bodies within its budget, whatever the number of clients posting to a silent backend", function()
    -- A backend that never reads: a socket listening and never accepting
    -- (the kernel completes the connects). 12 clients each pipeline 4
    -- POSTs of 8 MiB (384 MiB offered); the proxy's defaults (a body
    -- budget of 32 MiB per loop, 16 MiB per connection) keep its RSS
    -- within 128 MiB (docs/guide/http-client.md: 3 x the budget and 64 KiB per client).
    local silent = assert(socket.bind("127.0.0.1", 0, 128))
    local _, sport = silent:getsockname()
    local port2 = H.free_port()
    local pid2 = H.start(H.root .. "/examples/proxy.lua", port2,
      "--backend 127.0.0.1:" .. sport .. " --timeout 60")
    -- (a graceful stop would wait for the writes to the silent backend:
    -- its 15 s; killed whatever the test's outcome)
    finally(function() os.execute("kill -KILL " .. pid2); silent:close() end)
    local rss0 = H.rss(pid2)
    local body = string.rep("x", 8 * 1024 * 1024)
    local head = "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: " .. #body .. "\r\n\r\n"
    local data = head .. body
    local clients, left = {}, {}
    for i = 1, 12 do
      clients[i] = H.client(port2)
      clients[i]:settimeout(0)
      left[i] = { n = 4, at = 1 }
    end
    local sent, peak, quiet = 0, 0, 0
    local deadline = socket.gettime() + 20
    while socket.gettime() < deadline and quiet < 20 do   -- until 2 s with nothing taken
      local moved = 0
      for i, c in ipairs(clients) do
        local l = left[i]
        if l.n > 0 then
          local n, err, partial = c:send(data, l.at, math.min(#data, l.at + 256 * 1024 - 1))
          local upto = n or partial or (l.at - 1)
          assert(n or err == "timeout", "send failed: " .. tostring(err))
          moved = moved + (upto - l.at + 1)
          l.at = upto + 1
          if l.at > #data then l.n, l.at = l.n - 1, 1 end
        end
      end
      sent = sent + moved
      peak = math.max(peak, H.rss(pid2) - rss0)
      if moved == 0 then
        quiet = quiet + 1
        socket.select(nil, nil, 0.1)
      else
        quiet = 0
      end
    end
    peak = math.max(peak, H.rss(pid2) - rss0)
    print(string.format("\n  12 clients posting 4 x 8 MiB to a silent backend: %d MiB taken, proxy RSS +%d MiB",
      sent // (1024 * 1024), peak // 1024))
    assert.is_true(sent >= 32 * 1024 * 1024, "only " .. sent .. " bytes taken")   -- it did read
    assert.is_true(sent < 384 * 1024 * 1024, "everything was taken")              -- and stopped
    if not H.sanitized then
      assert.is_true(peak < 128 * 1024, "the proxy grew by " .. peak .. " KiB")
    end
    for _, c in ipairs(clients) do c:close() end
  end)

  it("a handler's late write to a client that left fails, and touches no freed codec", function()
    -- what a proxy does when the backend answers after its client closed
    local done = netrun.promise()
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("http", require("netrun").codec.http_server {})
        ch:pipeline():add_last("app", { channel_read = function(_, ctx)
          ctx:loop():schedule(0.2, function()      -- the client has gone by then
            local ok, f = pcall(ctx.write_and_flush, ctx, { status = 200, body = "late" })
            done:set_success(ok and (f:is_done() and not f:is_success()) and "failed" or tostring(f))
          end)
        end })
      end,
    }:sync()
    local _, sport = server:local_address()
    local c = H.client(sport)
    c:send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    c:close()
    assert.equal("failed", H.sync(done))
    server:close():sync()
  end)
end)

-- A forwarder sends only origin-form: a handler that makes the path an
-- absolute URL gets the request refused, not sent to another host.
describe("client:forwarder and request targets", function()
  it("refuses a path that is not origin-form", function()
    local group = netrun.group { threads = 1, name = "fwd-target" }
    local backend = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("http", netrun.codec.http_server {})
        ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
          ctx:write_and_flush { status = 200, body = req.target }
        end })
      end,
    }:sync()
    local base = "http://127.0.0.1:" .. select(2, backend:local_address())
    local front = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        local forward = netrun.http.client {}:forwarder { url = base }
        ch:pipeline():add_last("http", netrun.codec.http_server {})
        ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
          if req.path == "/to-evil" then req.path = "http://evil.example/admin" end
          forward(req, function(res, err)
            if res then return ctx:write_and_flush(res) end
            ctx:write_and_flush { status = 502, body = err }
          end)
        end })
      end,
    }:sync()
    local c = H.client(select(2, front:local_address()))
    c:send("GET /ok?a=1 HTTP/1.1\r\nHost: x\r\n\r\n")
    local status, _, body = H.read_response(c)
    assert.equal(200, status, body)
    assert.equal("/ok?a=1", body)
    c:send("GET /to-evil HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, body = H.read_response(c)
    assert.equal(502, status)
    assert.matches("the forwarded request's path cannot be sent: it must begin with '/'", body, 1, true)
    c:close()
    front:close():sync()
    backend:close():sync()
    H.shutdown(group)
  end)
end)

describe("examples/proxy.lua --body stream", function()
  local bpid, pid, port
  local BIG = (H.faults and 16 or 32) * 1024 * 1024
  local function sha_of_pattern(n)
    local out = H.run(string.format("python3 -c \"import hashlib,sys;P=bytes(range(256))*4096;" ..
      "n=%d;h=hashlib.sha256()\nwhile n: k=min(n,len(P));h.update(P[:k]);n-=k\nprint(h.hexdigest())\"", n))
    return out:match("%x+")
  end
  setup(function()
    local bport = H.free_port()
    local f = assert(io.popen(string.format("python3 %s/spec/fixtures/stream_backend.py %d > /dev/null 2>&1 & echo $!",
      H.root, bport)))
    bpid = tonumber(f:read("l"))
    f:close()
    H.eventually(function()
      local c = socket.tcp()
      local ok = c:connect("127.0.0.1", bport)
      c:close()
      return ok
    end, 10)
    port = H.free_port()
    pid = H.start(H.root .. "/examples/proxy.lua", port,
      "--backend 127.0.0.1:" .. bport .. " --body stream --max-body 0 --buffer 65536")
  end)
  teardown(function()
    if pid then H.stop(pid) end
    if bpid then os.execute("kill " .. bpid) end
  end)

  it("streams uploads (Content-Length and chunked) and downloads both ways, intact, in bounded memory", function()
    local path = os.tmpname()
    assert(os.execute(string.format("head -c %d /dev/urandom > %s", BIG, path)))
    local want = H.run("sha256sum " .. path):match("^%x+")
    local rss0 = H.rss(pid)
    local out, st = H.run(string.format("curl -s -T %s http://127.0.0.1:%d/up", path, port))
    assert.equal(0, st, out)
    assert.equal(BIG .. " " .. want, out:match("^%d+ %x+"))
    out, st = H.run(string.format("curl -s -T - http://127.0.0.1:%d/up < %s", port, path))
    assert.equal(0, st, out)
    assert.equal(BIG .. " " .. want, out:match("^%d+ %x+"))      -- (chunked: curl reads stdin)
    out, st = H.run(string.format("curl -s http://127.0.0.1:%d/big/%d | sha256sum", port, BIG))
    assert.equal(0, st, out)
    assert.equal(sha_of_pattern(BIG), out:match("^%x+"))
    -- and small requests over one connection, kept alive
    out, st = H.run(string.format("curl -s http://127.0.0.1:%d/big/3 -o /dev/null " ..
      "http://127.0.0.1:%d/up --data-binary abc", port, port))
    assert.equal(0, st, out)
    assert.matches("3 ba7816bf", out)           -- (sha256 of "abc")
    local grown = H.rss(pid) - rss0
    print(string.format("\n  %d MiB up twice and down once: proxy RSS %+d KiB", BIG >> 20, grown))
    if not H.sanitized then assert.is_true(grown < 8 * 1024, "RSS grew " .. grown .. " KiB") end
    os.remove(path)
  end)

  it("takes no more of an upload than a backend that reads nothing does", function()
    local rss0 = H.rss(pid)
    local c = H.client(port)
    local total = 256 * 1024 * 1024
    assert(c:send("PUT /silent HTTP/1.1\r\nHost: x\r\nContent-Length: " .. total .. "\r\n\r\n"))
    c:settimeout(1)                                 -- until 1 s with nothing taken
    local sent = H.flood(c, string.rep("s", 256 * 1024), total)
    local grown = H.rss(pid) - rss0
    print(string.format("\n  a backend that reads nothing: the proxy took %d KiB of 256 MiB, RSS %+d KiB",
      sent // 1024, grown))
    assert.is_true(sent < 32 * 1024 * 1024, "the proxy took " .. sent)
    if not H.sanitized then assert.is_true(grown < 8 * 1024, "RSS grew " .. grown .. " KiB") end
    c:close()
  end)
end)
