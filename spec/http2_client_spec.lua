-- http2_client_spec.lua -- netrun.http.client { h2 = "auto" | true | false }
-- (DESIGN.md §9.1) against real HTTP/2 servers: netrun's own
-- (spec/fixtures/h2_app.lua), nghttpd, nginx (http2 on), h2o and Node's
-- http2 server; requests to an origin multiplexed on one connection up to
-- the server's MAX_CONCURRENT_STREAMS; examples/fetch.lua --h2; and
-- examples/proxy.lua between HTTP/2 and HTTP/1.1, both ways.
local H = require "spec.helper"
local netrun = H.netrun
local json = netrun.json

local certs = H.tmpdir()
assert(H.run("bash " .. H.root .. "/spec/fixtures/tls/make_certs.sh " .. certs))
local CA = certs .. "/ca.crt"
local APP = H.root .. "/spec/fixtures/h2_app.lua"

local group = netrun.group { threads = 1, name = "h2client" }

describe("HTTP/2 client", function()
teardown(function() group:shutdown_gracefully(0, 2):sync() end)

-- On the group's loop: n requests to url (path i for each, from paths),
-- all sent at once through one client of options opts; returns the
-- responses (or error strings) in order and the pool's stats as the
-- requests were sent.
local function fetch(opts, base, paths)
  return group:submit(function(opts, base, paths, ca)
    local netrun = require "netrun"
    return netrun.spawn(function()
      if ca then
        opts.tls = netrun.tls.client { ca = ca, alpn = opts.h2 == false and { "http/1.1" }
                                       or opts.h2 == true and { "h2" } or { "h2", "http/1.1" } }
      end
      local client = netrun.http.client(opts)
      local fs = {}
      for i, p in ipairs(paths) do fs[i] = client:request { url = base .. p, timeout = 10 } end
      local stats = { require("netrun.http").stats()[client.id] }   -- this client's
      local out = {}
      for i = 1, #fs do
        local ok, r = pcall(function() return fs[i]:await() end)
        out[i] = ok and { status = r.status, version = r.version, body = r.body,
                          headers = r.headers } or tostring(r)
      end
      return { out = out, stats = stats }
    end)
  end, opts, base, paths, base:match("^https") and CA or nil):sync():sync()
end

local function assert_ok(r, version)
  assert.equal("table", type(r), tostring(r))
  assert.equal(200, r.status)
  assert.equal(version, r.version)
end

local function repeat_paths(p, n)
  local t = {}
  for i = 1, n do t[i] = p end
  return t
end

describe("netrun.http.client over HTTP/2", function()
  local pid, port, tpid, tport, lpid, lport
  setup(function()
    port, tport, lport = H.free_port(), H.free_port(), H.free_port()
    pid = H.start(APP, port)
    tpid = H.start(APP, tport, "--tls " .. certs)
    lpid = H.start(APP, lport, "--codec '{ h2_max_streams = 4 }'")
  end)
  teardown(function()
    for _, p in ipairs { pid, tpid, lpid } do assert.is_true(H.stop(p)) end
  end)

  it("h2 = \"auto\" (the default) speaks HTTP/2 where TLS agrees it: one connection for all", function()
    local r = fetch({}, "https://localhost:" .. tport, repeat_paths("/slow?ms=300", 8))
    local conns, streams = {}, {}
    for _, res in ipairs(r.out) do
      assert_ok(res, "2")
      conns[res.headers["x-conn"]] = true
      streams[res.headers["x-stream"]] = true
    end
    assert.equal(1, #(function() local t = {} for k in pairs(conns) do t[#t + 1] = k end return t end)())
    local n = 0
    for _ in pairs(streams) do n = n + 1 end
    assert.equal(8, n)                                 -- 8 streams, not 8 connections
    for _, s in pairs(r.stats) do
      for _, pool in pairs(s) do assert.equal(1, pool.total) end
    end
  end)

  it("h2 = \"auto\" stays on HTTP/1.1 over plain http, and h2 = false over TLS", function()
    local r = fetch({}, "http://127.0.0.1:" .. port, { "/a", "/b" })
    for _, res in ipairs(r.out) do assert_ok(res, "HTTP/1.1") end
    r = fetch({ h2 = false }, "https://localhost:" .. tport, { "/a", "/b" })
    for _, res in ipairs(r.out) do assert_ok(res, "HTTP/1.1") end
  end)

  it("h2 = true speaks h2c by prior knowledge; bodies and headers come whole", function()
    local r = fetch({ h2 = true }, "http://127.0.0.1:" .. port,
                    { "/big?n=300000", "/prepared", "/stream?n=5&size=1000", "/d?q=1" })
    for _, res in ipairs(r.out) do assert_ok(res, "2") end
    assert.equal(("b"):rep(300000), r.out[1].body)
    assert.equal("prepared", r.out[2].headers["x-kind"])
    assert.equal(5000, #r.out[3].body)
    local d = json.decode(r.out[4].body)
    assert.equal("2", d.version)
    assert.equal("q=1", d.query)
    assert.equal("127.0.0.1:" .. port, d.headers.host)   -- :authority from Host
  end)

  it("keeps within the server's MAX_CONCURRENT_STREAMS (4 here): 12 slow requests in 3 waves, one connection", function()
    local t0 = netrun.now()
    local r = fetch({ h2 = true }, "http://127.0.0.1:" .. lport, repeat_paths("/slow?ms=300", 12))
    local took = netrun.now() - t0
    local conns = {}
    for _, res in ipairs(r.out) do
      assert_ok(res, "2")
      conns[res.headers["x-conn"]] = true
    end
    assert.equal(1, #(function() local t = {} for k in pairs(conns) do t[#t + 1] = k end return t end)())
    assert.is_true(took >= 0.85, "took " .. took .. " s")  -- 3 x 0.3 s
  end)

  it("a request past its timeout resets its stream; the connection serves the next", function()
    local r = group:submit(function(base)
      local netrun = require "netrun"
      return netrun.spawn(function()
        local client = netrun.http.client { h2 = true }
        local ok, err = pcall(function()
          return client:request { url = base .. "/hold", timeout = 0.2 }:await()
        end)
        local res = client:request { url = base .. "/after", timeout = 5 }:await()
        return { ok = ok, err = tostring(err), status = res.status, version = res.version,
                 stats = { require("netrun.http").stats()[client.id] } }
      end)
    end, "http://127.0.0.1:" .. port):sync():sync()
    assert.is_false(r.ok)
    assert.matches("timeout after 0.2 s", r.err, 1, true)
    assert.equal(200, r.status)
    assert.equal("2", r.version)
    for _, s in pairs(r.stats) do
      for _, pool in pairs(s) do assert.equal(1, pool.total) end   -- not closed
    end
  end)
end)

describe("netrun.http.client against other HTTP/2 servers", function()
  local dir
  setup(function() dir = H.tmpdir() end)

  local function spawn(cmd, port)
    local f = assert(io.popen(cmd .. " > " .. dir .. "/log." .. port .. " 2>&1 & echo $!"))
    local pid = tonumber(f:read("l"))
    f:close()
    assert(H.eventually(function()
      local s = H.socket.connect("127.0.0.1", port)
      if s then s:close() end
      return s ~= nil
    end, 10), cmd .. " did not start: " .. H.read_file(dir .. "/log." .. port))
    return pid
  end
  local function kill(pid) os.execute("kill " .. pid .. " 2>/dev/null") end
  -- fn's peers killed whatever fn does
  local function with(pids, fn)
    local ok, err = pcall(fn)
    for _, p in ipairs(pids) do kill(p) end
    assert(ok, err)
  end

  it("nghttpd, TLS (auto) and h2c (true)", function()
    local f = assert(io.open(dir .. "/hello", "w"))
    f:write("hello from nghttpd")
    f:close()
    local p1, p2 = H.free_port(), H.free_port()
    local a = spawn(("nghttpd %d %s/server.key %s/server.crt -d %s"):format(p1, certs, certs, dir), p1)
    local b = spawn(("nghttpd --no-tls %d -d %s"):format(p2, dir), p2)
    with({ a, b }, function()
      local r1 = fetch({}, "https://localhost:" .. p1, { "/hello", "/hello" })
      local r2 = fetch({ h2 = true }, "http://127.0.0.1:" .. p2, { "/hello", "/hello" })
      for _, res in ipairs(r1.out) do assert_ok(res, "2"); assert.equal("hello from nghttpd", res.body) end
      for _, res in ipairs(r2.out) do assert_ok(res, "2"); assert.equal("hello from nghttpd", res.body) end
    end)
  end)

  it("nginx with http2 on (TLS)", function()
    local p = H.free_port()
    local f = assert(io.open(dir .. "/nginx.conf", "w"))
    f:write((([[
daemon off; worker_processes 1; error_log stderr error; pid DIR/nginx.pid;
events { worker_connections 64; }
http { access_log off;
  server { listen 127.0.0.1:PORT ssl http2;
           ssl_certificate CERTS/server.crt; ssl_certificate_key CERTS/server.key;
           location / { default_type text/plain; return 200 "nginx $server_protocol $connection"; } } }
]]):gsub("DIR", dir):gsub("PORT", p):gsub("CERTS", certs)))
    f:close()
    os.execute("mkdir -p " .. dir .. "/logs")
    local pid = spawn(("nginx -p %s -c %s/nginx.conf"):format(dir, dir), p)
    local r
    with({ pid }, function() r = fetch({}, "https://localhost:" .. p, repeat_paths("/", 6)) end)
    local conns = {}
    for _, res in ipairs(r.out) do
      assert_ok(res, "2")
      local proto, conn = res.body:match("^nginx (%S+) (%d+)$")
      assert.equal("HTTP/2.0", proto)
      conns[conn] = true
    end
    local n = 0
    for _ in pairs(conns) do n = n + 1 end
    assert.equal(1, n)                                 -- multiplexed
  end)

  it("h2o, TLS (auto) and h2c (true)", function()
    local p1, p2 = H.free_port(), H.free_port()
    local f = assert(io.open(dir .. "/h2o.txt", "w"))
    f:write("hello from h2o")
    f:close()
    f = assert(io.open(dir .. "/h2o.conf", "w"))
    f:write((([[
num-threads: 1
user: USER
pid-file: DIR/h2o.pid
listen:
  host: 127.0.0.1
  port: P1
  ssl:
    certificate-file: CERTS/server.crt
    key-file: CERTS/server.key
listen:
  host: 127.0.0.1
  port: P2
hosts:
  default:
    paths:
      /:
        file.file: DIR/h2o.txt
]]):gsub("USER", os.getenv("USER") or "root"):gsub("DIR", dir):gsub("CERTS", certs)
       :gsub("P1", p1):gsub("P2", p2)))
    f:close()
    local pid = spawn(("h2o -m worker -c %s/h2o.conf"):format(dir), p1)
    with({ pid }, function()
      assert(H.eventually(function()
        local s = H.socket.connect("127.0.0.1", p2)
        if s then s:close() end
        return s ~= nil
      end, 10))
      local r1 = fetch({}, "https://localhost:" .. p1, { "/", "/" })
      local r2 = fetch({ h2 = true }, "http://127.0.0.1:" .. p2, { "/", "/" })
      for _, res in ipairs(r1.out) do assert_ok(res, "2"); assert.equal("hello from h2o", res.body) end
      for _, res in ipairs(r2.out) do assert_ok(res, "2"); assert.equal("hello from h2o", res.body) end
    end)
  end)

  it("Node's http2 server (h2c and TLS)", function()
    local p1, p2 = H.free_port(), H.free_port()
    local f = assert(io.open(dir .. "/server.js", "w"))
    f:write((([[
const http2 = require('http2'), fs = require('fs');
const answer = (req, res) => {
  let body = '';
  req.on('data', d => body += d);
  req.on('end', () => res.end('node ' + req.httpVersion + ' ' + req.method + ' ' + req.url + ' ' + body));
};
http2.createServer(answer).listen(P2, '127.0.0.1');
http2.createSecureServer({ key: fs.readFileSync('CERTS/server.key'),
                           cert: fs.readFileSync('CERTS/server.crt') }, answer).listen(P1, '127.0.0.1');
]]):gsub("CERTS", certs):gsub("P1", p1):gsub("P2", p2)))
    f:close()
    local pid = spawn("node " .. dir .. "/server.js", p1)
    with({ pid }, function()
      local r1 = fetch({}, "https://localhost:" .. p1, { "/x?y=1", "/z" })
      local r2 = fetch({ h2 = true }, "http://127.0.0.1:" .. p2, { "/x", "/z" })
      assert_ok(r1.out[1], "2")
      assert.equal("node 2.0 GET /x?y=1 ", r1.out[1].body)
      assert_ok(r2.out[2], "2")
      assert.equal("node 2.0 GET /z ", r2.out[2].body)
    end)
  end)
end)

describe("examples over HTTP/2", function()
  it("fetch.lua --h2 multiplexes its requests on one connection", function()
    local port = H.free_port()
    local pid = H.start(APP, port)
    local out = H.run(("%s %s/examples/fetch.lua --url http://127.0.0.1:%d/x --requests 200 " ..
                       "--concurrency 16 --h2"):format(H.BIN, H.root, port))
    local one = H.run(("%s %s/examples/fetch.lua --url http://127.0.0.1:%d/x --h2"):format(
      H.BIN, H.root, port))
    assert.is_true(H.stop(pid))
    assert.matches("requests=200 seconds=[%d.]+ errors=0", out)
    assert.matches("^2 200 OK", one)
  end)

  it("proxy.lua serves HTTP/2 clients from an HTTP/1.1 backend, and HTTP/1.1 clients from an HTTP/2 one", function()
    local bport, pport, p2port = H.free_port(), H.free_port(), H.free_port()
    local backend = H.start(APP, bport, "--codec '{ h2 = true }'")
    local proxy = H.start(H.root .. "/examples/proxy.lua", pport,
                          "--backend 127.0.0.1:" .. bport)
    local proxy2 = H.start(H.root .. "/examples/proxy.lua", p2port,
                           "--backend 127.0.0.1:" .. bport .. " --backend-h2 yes")
    local ok, err = pcall(function()
      -- an h2 client, the proxy, an h1 backend (proxy.lua's client: h1 to http://)
      local out = H.run("curl -s --http2-prior-knowledge -w '\\n%{http_version}' -H 'x-a: 1' " ..
                        "http://127.0.0.1:" .. pport .. "/p?q=2")
      local body, version = out:match("^(.*)\n([%d.]+)$")
      assert.equal("2", version)
      local r = json.decode(body)
      assert.equal("HTTP/1.1", r.version)     -- as the backend saw it
      assert.equal("/p", r.path)
      assert.equal("q=2", r.query)
      assert.equal("1", r.headers["x-a"])
      assert.equal("127.0.0.1", r.headers["x-forwarded-for"])
      -- an h1 client, the proxy, an h2 backend (h2c by prior knowledge)
      out = H.run("curl -s --http1.1 -w '\\n%{http_version}' -d 'posted' http://127.0.0.1:" ..
                  p2port .. "/q")
      body, version = out:match("^(.*)\n([%d.]+)$")
      assert.equal("1.1", version)
      r = json.decode(body)
      assert.equal("2", r.version)            -- as the backend saw it
      assert.equal("POST", r.method)
      assert.equal(6, r.body_len)
      -- h2 both ways, several streams at once (nghttp)
      out = H.run("nghttp -n -s http://127.0.0.1:" .. p2port .. "/a http://127.0.0.1:" .. p2port ..
                  "/b http://127.0.0.1:" .. p2port .. "/c")
      local n = 0
      for _ in out:gmatch("\n%s*%d+%s+%S+%s+%S+%s+%S+%s+200") do n = n + 1 end
      assert.equal(3, n, out)
    end)
    for _, p in ipairs { proxy, proxy2, backend } do assert.is_true(H.stop(p)) end
    assert(ok, err)
  end)
end)
end)
