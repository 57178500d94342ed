-- tls_peers_spec.lua -- netrun's TLS (DESIGN §8.1) against Node's https,
-- client and server; what goes over the wire; a 10 MiB transfer. The
-- certificates are made fresh by spec/fixtures/tls/make_certs.sh.
local H = require "spec.helper"
local netrun = H.netrun

local dir = H.tmpdir()
assert(H.run("bash " .. H.root .. "/spec/fixtures/tls/make_certs.sh " .. dir))
local function P(name) return dir .. "/" .. name end

local NODE = "/usr/bin/node"
local seen = netrun.shared.dict("tls_peers_spec")

-- HTTPS: the native codec behind TLS; POST /echo answers with the body,
-- anything else with "hello <path>".
local Hello = {}
function Hello:channel_read(ctx, req)
  local body = req.path == "/echo" and req.body or "hello " .. req.path
  local res = { status = 200, headers = { ["content-type"] = "text/plain" }, body = body }
  if req.path:find("^/later") then          -- answered 0.1 s later: owed meanwhile
    ctx:loop():schedule(0.1, function() ctx:write_and_flush(res) end)
    return
  end
  ctx:write(res)
end
function Hello:channel_read_complete(ctx) ctx:flush() end
function Hello:exception_caught(ctx, err)
  seen:set("exception", tostring(err))
  ctx:close()
end

local group
local function https_server(opts)
  local tls = netrun.tls.server(opts or { cert = P("server.crt"), key = P("server.key"),
                                          alpn = { "http/1.1" } })
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0, tls = tls,
    init = function(ch)
      ch:pipeline():add_last("http", netrun.codec.http_server { max_body = 16 << 20 })
      ch:pipeline():add_last("hello", Hello)
    end,
  }:sync()
  local _, port = server:local_address()
  return port
end

-- A netrun TLS client collecting what it reads under `key`.
local function tls_client(port, cfg, key)
  local Collect = {}
  function Collect:channel_read(ctx, msg) seen:set(key, (seen:get(key) or "") .. msg) end
  function Collect:user_event_triggered(ctx, e)
    if e.tls == "handshake" then seen:set(key .. ":cipher", e.cipher) end
    if e.tls == "close_notify" then seen:set(key .. ":close_notify", true) end
  end
  function Collect:channel_inactive(ctx) seen:set(key .. ":inactive", true) end
  function Collect:exception_caught(ctx, err) seen:set(key .. ":exception", tostring(err)) end
  return netrun.connect {
    group = group, host = "127.0.0.1", port = port, tls = cfg,
    init = function(ch) ch:pipeline():add_last("collect", Collect) end,
  }
end

-- A Node script in a file; the command that runs it (bounded).
local scripts = 0
local function node_cmd(script)
  scripts = scripts + 1
  local path = P("peer" .. scripts .. ".js")
  local f = assert(io.open(path, "w"))
  f:write(script)
  f:close()
  return "timeout 20 " .. NODE .. " " .. path
end
local function node(script) return H.run(node_cmd(script)) end

describe("netrun.tls with real peers", function()
  before_each(function()
    group = netrun.group { threads = 1, name = "tlspeers" }
    seen:flush_all()
  end)
  after_each(function() H.shutdown(group) end)

  it("serves Node's https client: TLS 1.3, AES-128-GCM by default, ALPN http/1.1", function()
    local port = https_server()
    local out, status = node(string.format([[
      const https = require('https'), fs = require('fs');
      const req = https.request({ host: '127.0.0.1', port: %d, servername: 'localhost',
          path: '/echo', method: 'POST', ca: fs.readFileSync('%s'), agent: false,
          ALPNProtocols: ['http/1.1'] }, res => {
        const s = res.socket, info = [res.statusCode, s.getProtocol(), s.getCipher().name,
                                      s.alpnProtocol];
        let body = '';
        res.on('data', d => body += d);
        res.on('end', () => console.log(info.concat([body]).join('|')));
      });
      req.on('error', e => { console.log('error: ' + e.message); process.exit(1); });
      req.end('from node');
    ]], port, P("ca.crt")))
    assert.equal(0, status, out)
    assert.equal("200|TLSv1.3|TLS_AES_128_GCM_SHA256|http/1.1|from node\n", out)
  end)

  it("connects as a client to Node's https server, verified against its name", function()
    local f = assert(io.popen(node_cmd(string.format([[
      const https = require('https'), fs = require('fs');
      const srv = https.createServer({ cert: fs.readFileSync('%s'), key: fs.readFileSync('%s') },
        (req, res) => {
          let body = '';
          req.on('data', d => body += d);
          req.on('end', () => {
            res.end('node saw ' + req.method + ' ' + req.url + ' ' + body + ' over ' +
                    req.socket.getProtocol());
            srv.close();
          });
        });
      srv.listen(0, '127.0.0.1', () => console.log(srv.address().port));
    ]], P("server.crt"), P("server.key")))))
    local port = tonumber(f:read("l"))
    assert.truthy(port)
    local ch = H.sync(tls_client(port, netrun.tls.client { ca = P("ca.crt"), server_name = "localhost" }, "n"))
    ch:write_and_flush("POST /x HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n"
      .. "Connection: close\r\n\r\nhello")
    assert.truthy(H.eventually(function() return seen:get("n:inactive") end, 10))
    local got = seen:get("n") or ""
    assert.truthy(got:find("^HTTP/1.1 200"), got)
    assert.truthy(got:find("node saw POST /x hello over TLSv1.3", 1, true), got)
    assert.is_nil(seen:get("n:exception"))
    f:close()
    -- Node's server, verified against a name it does not hold: refused
    f = assert(io.popen(node_cmd(string.format([[
      const https = require('https'), fs = require('fs');
      const srv = https.createServer({ cert: fs.readFileSync('%s'), key: fs.readFileSync('%s') },
                                     (req, res) => res.end('no'));
      srv.on('tlsClientError', () => srv.close());
      srv.listen(0, '127.0.0.1', () => console.log(srv.address().port));
    ]], P("server.crt"), P("server.key")))))
    port = tonumber(f:read("l"))
    local ok, err = pcall(H.sync, tls_client(port, netrun.tls.client { ca = P("ca.crt"),
                                                                        server_name = "b.example" }, "m"))
    f:close()
    assert.is_false(ok)
    assert.truthy(tostring(err):find("hostname mismatch", 1, true), err)
  end)

  it("puts only TLS records on the wire, never the plaintext", function()
    -- A handler below TLS sees the bytes as the socket does.
    local Tap = {}
    function Tap:channel_read(ctx, msg)
      seen:set("in", (seen:get("in") or "") .. msg)
      ctx:fire_channel_read(msg)
    end
    function Tap:write(ctx, msg, p)
      seen:set("out", (seen:get("out") or "") .. msg)
      ctx:write(msg, p)
    end
    local Echo = {}
    function Echo:channel_read(ctx, msg) ctx:write(msg:upper()) end
    function Echo:channel_read_complete(ctx) ctx:flush() end
    local tls = netrun.tls.server { cert = P("server.crt"), key = P("server.key") }
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("tap", Tap)
        ch:pipeline():add_last("tls", tls)
        ch:pipeline():add_last("echo", Echo)
      end,
    }:sync()
    local _, port = server:local_address()
    local ch = H.sync(tls_client(port, netrun.tls.client { ca = P("ca.crt") }, "w"))
    local secret = "attack at dawn, the password is swordfish"
    ch:write_and_flush(secret)
    assert.truthy(H.eventually(function() return seen:get("w") == secret:upper() end))
    ch:close():sync()
    assert.truthy(H.eventually(function() return seen:get("w:inactive") end))
    local wire_in, wire_out = seen:get("in"), seen:get("out")
    assert.is_nil(wire_in:find("swordfish", 1, true))
    assert.is_nil(wire_out:find("SWORDFISH", 1, true))
    -- records all through: a handshake record first, application data after
    local function records(s)
      local kinds, i = {}, 1
      while i <= #s do
        local kind, ver, len = string.unpack(">BI2I2", s, i)
        assert.is_true(ver == 0x0301 or ver == 0x0303, string.format("version %x", ver))
        kinds[#kinds + 1] = kind
        i = i + 5 + len
      end
      assert.equal(#s + 1, i)             -- whole records, nothing else
      return kinds
    end
    local kin, kout = records(wire_in), records(wire_out)
    assert.equal(22, kin[1])                -- ClientHello
    assert.equal(22, kout[1])               -- ServerHello
    assert.equal(23, kin[#kin])             -- close_notify, encrypted (TLS 1.3)
    assert.is_true(#kout >= 2)
  end)

  it("answers 16 pipelined HTTPS requests in two records, not sixteen", function()
    local Tap = {}                          -- below TLS: records as the socket sees them
    function Tap:write(ctx, msg, p)
      seen:set("out", (seen:get("out") or "") .. msg)
      ctx:write(msg, p)
    end
    local tls = netrun.tls.server { cert = P("server.crt"), key = P("server.key") }
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("tap", Tap)
        ch:pipeline():add_last("tls", tls)
        ch:pipeline():add_last("http", netrun.codec.http_server {})
        ch:pipeline():add_last("hello", Hello)
      end,
    }:sync()
    local _, port = server:local_address()
    local ch = H.sync(tls_client(port, netrun.tls.client { ca = P("ca.crt") }, "p"))
    ch:write_and_flush("GET /warm HTTP/1.1\r\nHost: x\r\n\r\n")
    assert.truthy(H.eventually(function() return (seen:get("p") or ""):find("hello /warm", 1, true) end))
    seen:set("out", "")
    seen:set("p", "")
    local reqs = {}
    for i = 1, 16 do reqs[i] = "GET /" .. i .. " HTTP/1.1\r\nHost: x\r\n\r\n" end
    ch:write_and_flush(table.concat(reqs))
    assert.truthy(H.eventually(function()
      local _, n = (seen:get("p") or ""):gsub("HTTP/1.1 200", "")
      return n == 16
    end))
    local out, records, i = seen:get("out"), 0, 1
    while i <= #out do
      local kind, _, len = string.unpack(">BI2I2", out, i)
      assert.equal(23, kind)
      records = records + 1
      i = i + 5 + len
    end
    -- the first answer at once, the other 15 gathered until the flush
    assert.equal(2, records)
    assert.truthy(seen:get("p"):find("hello /16", 1, true))
    ch:close():sync()
  end)

  it("answers the requests that came with the client's close_notify, then sends its own", function()
    -- RFC 8446 6.1: close_notify closes the client's side only. Python's
    -- ssl sends its requests and close_notify in one flight; the answers
    -- -- one owed 0.1 s past it -- must come, then our close_notify.
    local port = https_server()
    local py = "timeout 20 /usr/bin/python3 " .. H.root .. "/spec/fixtures/tls/close_notify.py "
      .. port .. " " .. P("ca.crt") .. " "
    for _, version in ipairs { "", "--tls12 " } do
      local out, status = H.run(py .. version .. "/one")
      assert.equal(0, status, out)
      assert.equal("answers 1\nseen /one\nend close_notify\n", out, version)
      out, status = H.run(py .. version .. "/a /b /c /later1")
      assert.equal(0, status, out)
      assert.equal("answers 4\nseen /a /b /c /later1\nend close_notify\n", out, version)
    end
    assert.is_nil(seen:get("exception"))
  end)

  it("carries 10 MiB each way intact", function()
    local port = https_server()
    local parts = {}
    math.randomseed(1013)
    for i = 1, 1 << 14 do parts[i] = string.pack("<I4I4", math.random(0, 0xffffffff), i) end
    local big = table.concat(parts):rep(80)
    assert.equal(10 << 20, #big)
    local f = assert(io.open(P("big.in"), "wb"))
    f:write(big)
    f:close()
    local out, status = H.run("curl -sS --max-time 30 --cacert " .. P("ca.crt")
      .. " --data-binary @" .. P("big.in") .. " -o " .. P("big.out")
      .. " -w '%{http_code}' https://localhost:" .. port .. "/echo")
    assert.equal(0, status, out)
    assert.equal("200", out)
    local got = H.read_file(P("big.out"))
    assert.equal(#big, #got)
    assert.is_true(got == big)
    assert.is_nil(seen:get("exception"))
  end)
end)
