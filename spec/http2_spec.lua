-- http2_spec.lua -- HTTP/2 in the HTTP server codec (DESIGN.md §9.1)
-- against real clients: curl (--http2-prior-knowledge, --http2 by
-- Upgrade and by ALPN), nghttp, h2load and Node's http2 client, each
-- talking to spec/fixtures/h2_app.lua as a user runs it; the examples
-- http_hello.lua and https_hello.lua serve HTTP/2 unchanged. The protocol
-- edges (frames by hand) are spec/h2/conformance.py's; the limits under
-- attack spec/http2_limits_spec.lua's.
local H = require "spec.helper"
local netrun = H.netrun
local json = netrun.json

local certs = H.tmpdir()
assert(H.run("bash " .. H.root .. "/spec/fixtures/tls/make_certs.sh " .. certs))
local CA = certs .. "/ca.crt"
local APP = H.root .. "/spec/fixtures/h2_app.lua"

local function curl(args)
  local out, status = H.run("curl -s --max-time 10 " .. args)
  assert.equal(0, status, out)
  return out
end

-- curl's answer and the HTTP version it used (`-w`).
local function fetch(args)
  local out = curl(args .. " -w '\\n%{http_version}'")
  local body, version = out:match("^(.*)\n([%d.]+)$")
  return body, version
end

local function node(script)
  local path = os.tmpname() .. ".js"
  local f = assert(io.open(path, "w"))
  f:write(script)
  f:close()
  local out, status = H.run("timeout 20 node " .. path)
  os.remove(path)
  assert.equal(0, status, out)
  return out
end

describe("HTTP/2 server", function()
  local pid, port, tpid, tport, npid, nport
  setup(function()
    port, tport, nport = H.free_port(), H.free_port(), H.free_port()
    pid = H.start(APP, port)
    tpid = H.start(APP, tport, "--tls " .. certs)
    npid = H.start(APP, nport, "--tls " .. certs .. " --codec '{ h2 = false }'")
  end)
  teardown(function()
    for _, p in ipairs { pid, tpid, npid } do
      assert.is_true(H.stop(p))
    end
  end)

  local base = function() return "http://127.0.0.1:" .. port end
  local tbase = function() return "https://localhost:" .. tport end

  it("speaks h2c by prior knowledge: the same request, version \"2\" and its stream", function()
    local body, version = fetch("--http2-prior-knowledge '" .. base() .. "/a/b?x=1&y=2' -H 'x-one: 1'")
    assert.equal("2", version)
    local r = json.decode(body)
    assert.equal("GET", r.method)
    assert.equal("/a/b", r.path)
    assert.equal("x=1&y=2", r.query)
    assert.equal("2", r.version)
    assert.equal(1, r.stream)
    assert.equal("1", r.headers["x-one"])
    assert.equal("127.0.0.1:" .. port, r.headers.host)   -- from :authority
    assert.is_true(r.keep_alive)
  end)

  it("speaks h2c after Upgrade: h2c (the upgrading request is stream 1)", function()
    local out = curl("-v --http2 '" .. base() .. "/up' 2>&1")
    assert.matches("HTTP/1.1 101 Switching Protocols", out, 1, true)
    assert.matches("< HTTP/2 200", out, 1, true)
    local r = json.decode(out:match('\n({"[^\n]*})'))
    assert.equal("2", r.version)
    assert.equal(1, r.stream)
  end)

  it("keeps HTTP/1.1 on the same port", function()
    local body, version = fetch("--http1.1 '" .. base() .. "/one'")
    assert.equal("1.1", version)
    local r = json.decode(body)
    assert.equal("HTTP/1.1", r.version)
    assert.equal(json.null, r.stream)         -- req.stream is nil
  end)

  it("agrees h2 over TLS by ALPN, and http/1.1 with a client that has no h2", function()
    local body, version = fetch("--cacert " .. CA .. " --http2 '" .. tbase() .. "/t'")
    assert.equal("2", version)
    assert.equal("2", json.decode(body).version)
    body, version = fetch("--cacert " .. CA .. " --http1.1 '" .. tbase() .. "/t'")
    assert.equal("1.1", version)
    assert.equal("HTTP/1.1", json.decode(body).version)
  end)

  it("does not agree h2 over TLS when the codec after TLS has h2 off", function()
    local port2 = nport
    local body, version = fetch("--cacert " .. CA .. " --http2 'https://localhost:" .. port2 .. "/t'")
    assert.equal("1.1", version)               -- not "Empty reply from server"
    assert.equal("HTTP/1.1", json.decode(body).version)
  end)

  it("takes request bodies, joins cookies, and answers prepared, table and streamed responses", function()
    local file = os.tmpname()
    local f = assert(io.open(file, "wb"))
    local data = {}
    for i = 1, 100000 do data[i] = string.char(i % 251) end
    data = table.concat(data)
    f:write(data)
    f:close()
    local r = json.decode((fetch("--http2-prior-knowledge --data-binary @" .. file .. " -H 'cookie: a=1' -H 'cookie: b=2' " .. base() .. "/post")))
    os.remove(file)
    assert.equal("POST", r.method)
    assert.equal(#data, r.body_len)
    local n = 0
    for i = 1, #data do n = (n + data:byte(i)) % 65536 end
    assert.equal(n, r.body_sum)
    assert.equal("a=1; b=2", r.headers.cookie)  -- RFC 9113 8.2.3
    assert.equal("prepared body", (fetch("--http2-prior-knowledge " .. base() .. "/prepared")))
    assert.equal(("b"):rep(200000), (fetch("--http2-prior-knowledge '" .. base() .. "/big?n=200000'")))
    assert.equal(("x"):rep(4 * 5000), (fetch("--http2-prior-knowledge '" .. base() .. "/stream?n=4&size=5000'")))
    local out = curl("-i --http2-prior-knowledge " .. base() .. "/prepared")
    assert.matches("x-kind: prepared", out, 1, true)
    assert.not_matches("\nConnection", out)
  end)

  it("answers 500 on the stream whose handler raised, and goes on", function()
    -- (nghttp: curl 7.88 cannot reuse an h2c connection, against nghttpd too)
    local out = H.run("nghttp -v " .. base() .. "/raise " .. base() .. "/after")
    assert.matches(":status: 500", out, 1, true)
    assert.matches(":status: 200", out, 1, true)
    assert.matches('"path":"/after"', out, 1, true)
  end)

  it("refuses a body over max_body with 413 on its stream", function()
    local file = os.tmpname()
    assert(os.execute("head -c 2000000 /dev/zero > " .. file))
    -- (curl may report the upload it could not finish: exit 55)
    local out = H.run("curl -s -i --http2-prior-knowledge --data-binary @" .. file .. " " .. base() .. "/up")
    os.remove(file)
    assert.matches("HTTP/2 413", out, 1, true)
  end)

  it("serves nghttp: streams answered independently (a slow one holds none)", function()
    local out = H.run("nghttp -n -s '" .. base() .. "/slow?ms=400' " .. base() .. "/a " .. base() .. "/b")
    -- sorted by completion: the two fast ones before the slow one
    local order = {}
    for path in out:gmatch("200%s+%d+%s+(/%S+)") do order[#order + 1] = path end
    assert.same({ "/a", "/b", "/slow?ms=400" }, order)
  end)

  it("serves h2load, h2c and TLS, every request answered", function()
    local out = H.run("h2load -n 2000 -c 4 -m 16 " .. base() .. "/")
    assert.matches("2000 succeeded, 0 failed, 0 errored", out, 1, true)
    out = H.run("h2load -n 2000 -c 4 -m 16 " .. tbase() .. "/")
    assert.matches("2000 succeeded, 0 failed, 0 errored", out, 1, true)
    assert.matches("Protocol: TLSv1.3", out, 1, true)
  end)

  it("serves Node's http2 client: requests multiplexed on one session", function()
    local out = node(([[
      const http2 = require('http2');
      const c = http2.connect('%s');
      const paths = ['/slow?ms=300', '/a', '/stream?n=5&size=2', '/prepared'];
      const got = [];
      for (const p of paths) {
        const r = c.request({':path': p});
        let b = '';
        r.on('response', h => b += h[':status'] + ' ');
        r.on('data', d => b += d);
        r.on('end', () => { got.push(p + ' ' + b.slice(0, 20)); if (got.length == paths.length) { console.log(got.join('\n')); c.close(); } });
      }
    ]]):format(base()))
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal(4, #lines)
    assert.equal("/slow?ms=300 200 slow ms=300", lines[4])  -- answered last
    assert.matches("/stream%?n=5&size=2 200 xxxxxxxxxx", out)
    assert.matches("/prepared 200 prepared body", out, 1, true)
  end)
end)

describe("the HTTP examples", function()
  it("http_hello.lua serves h2c and https_hello.lua serves h2 by ALPN, unchanged", function()
    local port = H.free_port()
    local pid = H.start(H.root .. "/examples/http_hello.lua", port)
    local ok, err = pcall(function()
      local body, version = fetch("--http2-prior-knowledge http://127.0.0.1:" .. port .. "/")
      assert.equal("Hello, World!", body)
      assert.equal("2", version)
      body, version = fetch("--http2 http://127.0.0.1:" .. port .. "/")
      assert.equal("Hello, World!", body)
      assert.equal("2", version)
    end)
    assert.is_true(H.stop(pid))
    assert(ok, err)
    port = H.free_port()
    pid = H.start(H.root .. "/examples/https_hello.lua", port,
                  "--cert " .. certs .. "/server.crt --key " .. certs .. "/server.key")
    ok, err = pcall(function()
      local body, version = fetch("--cacert " .. CA .. " --http2 https://localhost:" .. port .. "/")
      assert.equal("Hello, World!", body)
      assert.equal("2", version)
      body, version = fetch("--cacert " .. CA .. " --http1.1 https://localhost:" .. port .. "/")
      assert.equal("Hello, World!", body)
      assert.equal("1.1", version)
    end)
    assert.is_true(H.stop(pid))
    assert(ok, err)
  end)
end)
