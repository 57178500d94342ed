-- http2_body_spec.lua -- HTTP/2 request bodies as streams
-- (netrun.codec.http_server { body = "stream" }, DESIGN.md §9.2): the head
-- first (req.streaming, req.body nil), then { type = "body", data, last,
-- stream } pieces, as HTTP/1.1 gives them; flow control is the
-- backpressure (spec/h2/uploads.py drives the frames by hand); curl over
-- h2c and TLS, netrun's own h2 client, and examples/proxy.lua --body
-- stream between an h2 client and an HTTP/1.1 backend (40 uploads at once too).
local H = require "spec.helper"
local netrun = H.netrun
local json = netrun.json

local PY = "/usr/bin/python3"          -- Debian's, with python3-hyperframe and hpack
local APP = H.root .. "/spec/fixtures/h2_upload.lua"
local certs = H.tmpdir()
assert(H.run("bash " .. H.root .. "/spec/fixtures/tls/make_certs.sh " .. certs))
local slow = (H.sanitized or H.faults) and 5 or 1

-- A file of n bytes of a pattern, and what /sum answers for it (the sum
-- of every 997th byte).
local function upload_file(n)
  local unit = {}
  for i = 0, 250 do unit[#unit + 1] = string.char((i * 7) % 251) end
  unit = table.concat(unit)
  local data = unit:rep(n // #unit + 1):sub(1, n)
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
  local sum = 0
  for i = 997, n, 997 do sum = sum + data:byte(i) end
  return path, sum
end

local function curl_json(args)
  local out, st = H.run("curl -s --max-time " .. 15 * slow .. " -w '\\n%{http_version}' " .. args)
  assert.equal(0, st, out)
  local body, version = out:match("^(.*)\n([%d.]+)$")
  return json.decode(body), version
end

-- fn(backend_port, proxy_port) with h2_upload.lua on HTTP/1.1 behind
-- examples/proxy.lua --body stream (the C stream forwarder); both stopped
-- after, whatever fn did
local function through_proxy(fn)
  local bport, pport = H.free_port(), H.free_port()
  local backend = H.start(APP, bport, "--codec '{ h2 = false }'")
  local proxy = H.start(H.root .. "/examples/proxy.lua", pport,
                        "--backend 127.0.0.1:" .. bport .. " --body stream")
  local ok, err = pcall(fn, bport, pport)
  for _, p in ipairs { proxy, backend } do assert.is_true(H.stop(p)) end
  assert(ok, err)
end

describe("HTTP/2 request bodies as streams", function()
  local pid, port, tpid, tport
  setup(function()
    port, tport = H.free_port(), H.free_port()
    pid = H.start(APP, port)
    tpid = H.start(APP, tport, "--tls " .. certs)
  end)
  teardown(function()
    assert.is_true(H.stop(pid))
    assert.is_true(H.stop(tpid))
  end)

  it("hands curl's uploads up in order and intact, h2c and over TLS (ALPN), as HTTP/1.1 does", function()
    local path, sum = upload_file(3 * 1024 * 1024 + 17)
    local r, v = curl_json("--http2-prior-knowledge -T " .. path .. " http://127.0.0.1:" .. port .. "/sum")
    assert.equal("2", v)
    assert.equal(3 * 1024 * 1024 + 17, r.n)
    assert.equal(sum, r.sum)
    assert.equal(1, r.stream)
    assert.is_true(r.pieces > 1 and r.largest <= 65535, r.pieces .. " pieces, largest " .. r.largest)
    r, v = curl_json("--http2 --cacert " .. certs .. "/ca.crt -T " .. path ..
                     " https://localhost:" .. tport .. "/read")
    assert.equal("2", v)
    assert.equal(3 * 1024 * 1024 + 17, r.n)
    assert.equal(sum, r.sum)
    r, v = curl_json("--http1.1 -H 'Expect:' -T " .. path .. " http://127.0.0.1:" .. port .. "/sum")
    assert.equal("1.1", v)                      -- the same handler, HTTP/1.1
    assert.equal(sum, r.sum)
    assert.equal(json.null, r.stream)
    -- requests without a body come whole
    r = curl_json("--http2-prior-knowledge http://127.0.0.1:" .. port .. "/whole")
    assert.is_true(r.whole)
    os.remove(path)
  end)

  it("streams netrun's own h2 client's upload", function()
    local body = ("0123456789abcdef"):rep(96 * 1024)     -- 1.5 MiB: many DATA frames
    local res = assert(netrun.http.client { h2 = true }:request {
      method = "POST", url = "http://127.0.0.1:" .. port .. "/sum", body = body }:sync(15 * slow))
    assert.equal(200, res.status)
    assert.equal("2", res.version)
    local r = json.decode(res.body)
    assert.equal(#body, r.n)
    local sum = 0
    for i = 997, #body, 997 do sum = sum + body:byte(i) end
    assert.equal(sum, r.sum)
  end)

  it("takes a Node http2 client's upload, written in pieces, with its trailers", function()
    local path = os.tmpname() .. ".js"
    local f = assert(io.open(path, "w"))
    f:write(([[
      const http2 = require('http2');
      const c = http2.connect('http://127.0.0.1:%d');
      const r = c.request({':method': 'POST', ':path': '/sum'}, {waitForTrailers: true});
      r.on('wantTrailers', () => r.sendTrailers({'x-sum': 'node'}));
      let b = '';
      r.on('data', d => b += d);
      r.on('end', () => { console.log(b); c.close(); });
      const piece = Buffer.alloc(100000, 'n');
      let left = 20;
      (function more() {
        while (left > 0) { left--; if (!r.write(piece)) return r.once('drain', more); }
        r.end();
      })();
    ]]):format(port))
    f:close()
    local out, st = H.run("timeout " .. 20 * slow .. " node " .. path)
    os.remove(path)
    assert.equal(0, st, out)
    local r = json.decode(out)
    assert.equal(2000000, r.n)
    assert.equal(("n"):byte() * (2000000 // 997), r.sum)
    assert.equal("node", r.trailers["x-sum"])
  end)

  it("gives window only as bodies are read: stalled, sunk, reset, interleaved, answered early", function()
    local out, st = H.run(("NETRUN_TIMEOUT_SCALE=%d timeout %d %s %s/spec/h2/uploads.py --bin %s")
                          :format(slow, 60 * slow, PY, H.root, H.BIN))
    assert.equal(0, st, out)
    local r = json.decode(out:match("({.*})%s*$"))
    assert.is_true(r.alive)
    for name, c in pairs(r) do
      if type(c) == "table" then assert.is_nil(c.fail, name .. ": " .. tostring(c.fail)) end
    end
    -- a body nobody reads: the stream's window and not a byte more, no
    -- WINDOW_UPDATE for it; other streams go on
    assert.equal(r.stall.window, r.stall.sent)
    assert.equal(0, r.stall.updates1)
    assert.equal(200, r.stall.other)
    assert.is_true(r.stall.other_body.whole)
    assert.is_true(r.stall.upload_ok)
    -- a body whose sink reads nothing: the client stalls once the buffers
    -- on the way are full (the kernel's, the sink's 64 KiB, the window),
    -- then the whole body arrives intact once it drains
    assert.is_true(r.sink.stalled_at < 12 * 1024 * 1024, "sent " .. r.sink.stalled_at .. " before stalling")
    assert.is_true(r.sink.stalled_at < r.sink.total)
    assert.equal(200, r.sink.status)
    assert.is_true(r.sink.intact)
    -- RST_STREAM mid-upload: the handler hears it; 300 more cut short
    -- leave no record behind (new streams are not refused)
    assert.equal(1, #r.reset.events)
    assert.matches("reset before its request body ended", r.reset.events[1], 1, true)
    assert.equal(200, r.reset.after)
    assert.is_true(r.reset.after_ok)
    -- two at once, interleaved: each intact, trailers with the last piece
    assert.is_true(r.interleave.a)
    assert.is_true(r.interleave.b)
    assert.equal(1, r.interleave.a_stream)
    assert.equal(3, r.interleave.b_stream)
    assert.is_string(r.interleave.trailers["x-sum"])
    -- answered before its body was read: RST_STREAM NO_ERROR after it
    assert.equal(200, r.early.status)
    assert.equal(0, r.early.rst)
    assert.equal(200, r.early.after)
  end)

  it("resets a body read but not sent for body_timeout, that stream only", function()
    local out, st = H.run(("NETRUN_TIMEOUT_SCALE=%d timeout %d %s %s/spec/h2/uploads.py --bin %s --case slow --codec '{ body_timeout = 0.5 }'")
                          :format(slow, 30 * slow, PY, H.root, H.BIN))
    assert.equal(0, st, out)
    local r = json.decode(out:match("({.*})%s*$")).slow
    assert.is_nil(r.fail, r.fail)
    assert.equal(8, r.rst)                      -- CANCEL
    assert.is_true(r.after >= 0.45, "after " .. r.after .. " s")
    assert.equal(200, r.other)                  -- the other stream was answered
    assert.equal(1, #r.events)
    assert.matches("body_timeout", r.events[1], 1, true)
  end)

  it("keeps max_body over streamed bodies: RST_STREAM and the handler told", function()
    local lport = H.free_port()
    local lpid = H.start(APP, lport, "--codec '{ max_body = 100000 }'")
    local ok, err = pcall(function()
      local path = upload_file(300000)
      local out = H.run("curl -s --max-time " .. 10 * slow .. " --http2-prior-knowledge -T " .. path ..
                        " http://127.0.0.1:" .. lport .. "/sum")
      assert.is_nil(out:match('"n":300000'))
      os.remove(path)
      local r = curl_json("--http2-prior-knowledge http://127.0.0.1:" .. lport .. "/events")
      -- (curl may also reset the connection once its upload is refused)
      local told = 0
      for _, e in ipairs(r.events) do
        if e:find("larger than max_body", 1, true) then told = told + 1
        else assert.matches("ECONNRESET", e, 1, true) end
      end
      assert.equal(1, told, table.concat(r.events, " | "))
    end)
    assert.is_true(H.stop(lpid))
    assert(ok, err)
  end)

  it("examples/proxy.lua --body stream streams an h2 client's upload to an HTTP/1.1 backend", function()
    through_proxy(function(_, pport)
      local path, sum = upload_file(2 * 1024 * 1024 + 5)
      local r, v = curl_json("--http2-prior-knowledge -T " .. path .. " http://127.0.0.1:" .. pport .. "/sum")
      assert.equal("2", v)
      assert.equal(2 * 1024 * 1024 + 5, r.n)
      assert.equal(sum, r.sum)
      assert.equal(json.null, r.stream)       -- the backend heard HTTP/1.1
      os.remove(path)
      -- 40 uploads at once on one connection (more than --in-flight, 16):
      -- they go one at a time, the others' bodies waiting in their windows
      path = upload_file(100000)
      local out = H.run(("timeout %d h2load -n 40 -c 1 -m 40 -d %s http://127.0.0.1:%d/sum")
                        :format(20 * slow, path, pport))
      assert.matches("40 succeeded", out, 1, true)
      os.remove(path)
    end)
  end)
  it("examples/proxy.lua --body stream: an h2 client's reset mid-upload closes that backend connection, the next stream goes on", function()
    through_proxy(function(bport, pport)
      local out, st = H.run(("NETRUN_TIMEOUT_SCALE=%d timeout %d %s %s/spec/h2/proxy_uploads.py --port %d")
                            :format(slow, 60 * slow, PY, H.root, pport))
      assert.equal(0, st, out)
      local r = json.decode(out:match("({.*})%s*$"))
      assert.is_nil(r.fail, r.fail)
      assert.equal(200, r.status)                -- the next stream, on the same connection
      assert.equal(300000, r.n)
      assert.is_true(r.intact)
      -- a stream reset for a body shorter than its content-length while
      -- it waits its turn: that stream only, the others come whole
      assert.matches("PROTOCOL_ERROR", r.short)
      assert.is_true(r.beside_short)
      assert.is_true(r.after_short)
      -- the backend connection that had part of the reset body was closed
      -- (not pooled: the next upload came whole on another)
      local ev = curl_json("http://127.0.0.1:" .. bport .. "/events").events
      local cut = 0
      for _, e in ipairs(ev) do
        if e:find("closed in the middle of a request body", 1, true) then cut = cut + 1 end
      end
      -- (the short body's too, if its head reached the backend first)
      assert.is_true(cut >= 1 and cut <= 2, table.concat(ev, " | "))
    end)
  end)
end)
