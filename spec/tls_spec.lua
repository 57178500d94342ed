-- tls_spec.lua -- TLS on OpenSSL 3 (DESIGN §8.1) against real peers: curl
-- and `openssl s_client` as clients of netrun TLS servers, netrun TLS
-- clients of netrun TLS servers. Certificates are made fresh for the run
-- by spec/fixtures/tls/make_certs.sh (0.2 s; no private key committed,
-- none to expire).
local H = require "spec.helper"
local netrun, socket = H.netrun, H.socket

local dir = H.tmpdir()
assert(H.run("bash " .. H.root .. "/spec/fixtures/tls/make_certs.sh " .. dir))
local function P(name) return dir .. "/" .. name end

-- What handlers on the loops saw, for the test to read.
local seen = netrun.shared.dict("tls_spec")

-- An HTTPS server: the native HTTP codec behind TLS; the handler answers
-- with the request's body length and a checksum, or echoes the body back
-- (POST /echo). It records the handshake event and exceptions.
local Hello = {}
function Hello:channel_active(ctx) seen:incr("active", 1, 0) end
function Hello:user_event_triggered(ctx, e)
  if e.tls == "handshake" then
    seen:set("version", e.version)
    seen:set("cipher", e.cipher)
    seen:set("alpn", e.alpn or "none")
    seen:set("server_name", e.server_name or "none")
    seen:set("resumed", e.resumed)
    seen:set("peer", e.peer and e.peer.subject or "none")
  end
end
function Hello:channel_read(ctx, req)
  local body = req.path == "/echo" and req.body or
    string.format("hello %s len=%d ch=%d", req.path, #req.body, ctx.channel:id())
  ctx:write { status = 200, headers = { ["content-type"] = "text/plain" }, body = body }
end
function Hello:channel_read_complete(ctx) ctx:flush() end
function Hello:exception_caught(ctx, err)
  seen:set("exception", tostring(err))
  seen:incr("exceptions", 1, 0)
  ctx:close()
end
function Hello:channel_inactive(ctx) seen:incr("inactive", 1, 0) end

local group
local function https_server(tls_opts)
  local tls = netrun.tls.server(tls_opts or { cert = P("server.crt"), key = P("server.key") })
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0, tls = tls,
    init = function(ch)
      ch:pipeline():add_last("http", netrun.codec.http_server { max_body = 4 << 20 })
      ch:pipeline():add_last("hello", Hello)
    end,
  }:sync()
  local _, port = server:local_address()
  return server, port, tls
end

local function curl(args)
  return H.run("curl -sS --max-time 10 --cacert " .. P("ca.crt") .. " " .. args)
end

-- openssl s_client with stdin from `input` (a file or /dev/null).
local function s_client(port, args, input)
  return H.run(string.format("timeout 10 openssl s_client -connect 127.0.0.1:%d %s < %s",
    port, args or "", input or "/dev/null"))
end

local function write_file(path, data)
  local f = assert(io.open(path, "wb"))
  f:write(data)
  f:close()
end

-- A TLS echo server (plain bytes): writes back what it reads.
local Echo = {}
function Echo:channel_read(ctx, msg) ctx:write(msg) end
function Echo:channel_read_complete(ctx) ctx:flush() end
function Echo:exception_caught(ctx, err)
  seen:set("exception", tostring(err))
  ctx:close()
end
local function echo_server(tls_opts)
  local tls = netrun.tls.server(tls_opts or { cert = P("server.crt"), key = P("server.key") })
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0, tls = tls,
    init = function(ch) ch:pipeline():add_last("echo", Echo) end,
  }:sync()
  local _, port = server:local_address()
  return server, port, tls
end

-- A netrun TLS client: its handler collects what it reads into the dict
-- under `key`, and notes close_notify and the end of the channel.
local function tls_client(port, cfg, key, opts, early)
  local Collect = {}
  -- A write made before the handshake completes waits for it.
  function Collect:handler_added(ctx) if early then ctx:write_and_flush(early) end end
  function Collect:channel_read(ctx, msg) seen:set(key, (seen:get(key) or "") .. msg) end
  function Collect:user_event_triggered(ctx, e)
    if e.tls == "close_notify" then seen:set(key .. ":close_notify", true) end
  end
  function Collect:channel_inactive(ctx) seen:set(key .. ":inactive", true) end
  function Collect:exception_caught(ctx, err) seen:set(key .. ":exception", tostring(err)) end
  return netrun.connect {
    group = group, host = "127.0.0.1", port = port, tls = cfg, options = opts,
    init = function(ch) ch:pipeline():add_last("collect", Collect) end,
  }
end

local function fds()
  local n = 0
  for _ in io.popen("ls /proc/self/fd"):lines() do n = n + 1 end
  return n
end

describe("netrun.tls", function()
  before_each(function()
    group = netrun.group { threads = 2, name = "tls" }
    seen:flush_all()
  end)
  after_each(function() H.shutdown(group) end)

  it("serves HTTPS to curl --cacert: 200, several requests over one kept-alive connection", function()
    local _, port = https_server()
    local url = "https://localhost:" .. port
    local out, status = curl("-w '|%{http_code} %{num_connects}\\n' " .. url .. "/a " .. url .. "/b " .. url .. "/c")
    assert.equal(0, status, out)
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal(3, #lines, out)
    local ch = lines[1]:match("ch=(%d+)")
    assert.truthy(lines[1]:match("^hello /a len=0 ch=%d+|200 1$"), out)
    assert.equal("hello /b len=0 ch=" .. ch .. "|200 0", lines[2])
    assert.equal("hello /c len=0 ch=" .. ch .. "|200 0", lines[3])
    assert.equal(1, seen:get("active"))       -- once, after the handshake
    assert.equal("TLSv1.3", seen:get("version"))
    assert.equal("localhost", seen:get("server_name"))
    assert.truthy(seen:get("cipher"):match("^TLS_"))
  end)

  it("carries 1 MiB each way intact", function()
    local _, port = https_server()
    local big = {}
    math.randomseed(13)
    for i = 1, 1 << 14 do big[i] = string.pack("<I4I4", math.random(0, 0xffffffff), i) end
    big = table.concat(big):rep(8)
    assert.equal(1 << 20, #big)
    write_file(P("big.in"), big)
    local out, status = curl("--data-binary @" .. P("big.in") .. " -o " .. P("big.out")
      .. " -w '%{http_code}' https://localhost:" .. port .. "/echo")
    assert.equal(0, status, out)
    assert.equal("200", out)
    local f = assert(io.open(P("big.out"), "rb"))
    local got = f:read("a")
    f:close()
    assert.equal(#big, #got)
    assert.is_true(got == big)
  end)

  it("echoes 1 MiB between a netrun client and server, the echo written as each read is decrypted", function()
    local _, port = echo_server()
    local ch = H.sync(tls_client(port, netrun.tls.client { ca = P("ca.crt") }, "big"))
    local chunk = {}
    for i = 1, 4096 do chunk[i] = string.char(i % 251) end
    chunk = table.concat(chunk)
    local all = {}
    for i = 1, 256 do
      all[i] = chunk
      ch:write(chunk)
    end
    ch:flush()
    all = table.concat(all)
    assert.truthy(H.eventually(function() return #(seen:get("big") or "") >= #all end, 20))
    assert.is_true(seen:get("big") == all)
    assert.is_nil(seen:get("exception"))
    ch:close():sync()
  end)

  it("negotiates ALPN as configured", function()
    local _, port = https_server { cert = P("server.crt"), key = P("server.key"),
                                   alpn = { "http/1.1" } }
    local out = s_client(port, "-alpn h2,http/1.1")
    assert.truthy(out:find("ALPN protocol: http/1.1", 1, true), out)
    assert.truthy(H.eventually(function() return seen:get("alpn") == "http/1.1" end))
    out = s_client(port, "-alpn h2")            -- nothing in common: no ALPN
    assert.truthy(out:find("No ALPN negotiated", 1, true), out)
    out = curl("--http1.1 -w '%{http_code}' -o /dev/null https://localhost:" .. port .. "/")
    assert.equal("200", out)
  end)

  it("picks the certificate of the SNI name asked for", function()
    local _, port = https_server { cert = P("server.crt"), key = P("server.key"),
      sni = { ["b.example"] = { cert = P("b.crt"), key = P("b.key") } } }
    local out = s_client(port, "-servername b.example")
    assert.truthy(out:find("subject=CN = b.example", 1, true), out)
    assert.truthy(H.eventually(function() return seen:get("server_name") == "b.example" end))
    out = s_client(port, "-servername localhost")
    assert.truthy(out:find("subject=CN = localhost", 1, true), out)
    out = s_client(port, "-servername B.EXAMPLE")      -- names are case-insensitive
    assert.truthy(out:find("subject=CN = b.example", 1, true), out)
    out = s_client(port, "-servername unknown.example")
    assert.truthy(out:find("subject=CN = localhost", 1, true), out)
  end)

  it("prefers AES-128-GCM and X25519, sends one ticket, and takes other ciphersuites, groups and ticket counts", function()
    local req = P("req2")
    write_file(req, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    local _, port = https_server()
    local out = s_client(port, "-ign_eof", req)
    assert.truthy(out:find("Cipher is TLS_AES_128_GCM_SHA256", 1, true), out)
    assert.truthy(out:find("Server Temp Key: X25519", 1, true), out)
    local _, tickets = out:gsub("Post%-Handshake New Session Ticket arrived", "")
    assert.equal(1, tickets)
    _, port = https_server { cert = P("server.crt"), key = P("server.key"), session_tickets = 3,
      ciphersuites = "TLS_AES_256_GCM_SHA384", groups = "P-256", ciphers = "ECDHE-ECDSA-AES256-GCM-SHA384" }
    out = s_client(port, "-ign_eof", req)
    assert.truthy(out:find("Cipher is TLS_AES_256_GCM_SHA384", 1, true), out)
    assert.truthy(out:find("Server Temp Key: ECDH, prime256v1", 1, true), out)
    _, tickets = out:gsub("Post%-Handshake New Session Ticket arrived", "")
    assert.equal(3, tickets)
    out = s_client(port, "-tls1_2", req)
    assert.truthy(out:find("Cipher is ECDHE-ECDSA-AES256-GCM-SHA384", 1, true), out)
    local ok, e = pcall(netrun.tls.server, { cert = P("server.crt"), key = P("server.key"), ciphersuites = "NOPE" })
    assert.is_false(ok)
    assert.truthy(e:find("netrun.tls.server: ciphersuites 'NOPE': error:", 1, true), e)
    ok, e = pcall(netrun.tls.client, { groups = "nope" })
    assert.is_false(ok)
    assert.truthy(e:find("netrun.tls.client: groups 'nope'", 1, true), e)
    ok, e = pcall(netrun.tls.server, { cert = P("server.crt"), key = P("server.key"), session_tickets = 99 })
    assert.is_false(ok)
    assert.truthy(e:find("session_tickets must be a boolean or a count", 1, true), e)
  end)

  it("resumes sessions from tickets", function()
    local _, port = https_server()
    local req = P("req")
    write_file(req, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    local out = s_client(port, "-ign_eof -sess_out " .. P("sess.pem"), req)
    assert.truthy(out:find("\nNew, TLSv1.3", 1, true), out)
    out = s_client(port, "-ign_eof -sess_in " .. P("sess.pem"), req)
    assert.truthy(out:find("\nReused, TLSv1.3", 1, true), out)
    assert.truthy(H.eventually(function() return seen:get("resumed") == true end))
  end)

  it("connects as a client: verify on with the CA, verify off, and a wrong CA fails the connect future", function()
    local _, port = echo_server()
    local ok = netrun.tls.client { ca = P("ca.crt"), server_name = "localhost" }
    local ch = H.sync(tls_client(port, ok, "a", nil, "early;"))
    ch:write_and_flush("ping over tls")
    assert.truthy(H.eventually(function() return seen:get("a") == "early;ping over tls" end))
    ch:close():sync()
    -- no server_name: the host connected to (127.0.0.1) is checked
    ch = H.sync(tls_client(port, netrun.tls.client { ca = P("ca.crt") }, "b"))
    ch:write_and_flush("by address")
    assert.truthy(H.eventually(function() return seen:get("b") == "by address" end))
    ch:close():sync()
    ch = H.sync(tls_client(port, netrun.tls.client { verify = false }, "c"))
    ch:write_and_flush("unverified")
    assert.truthy(H.eventually(function() return seen:get("c") == "unverified" end))
    ch:close():sync()
    local f = tls_client(port, netrun.tls.client { ca = P("other-ca.crt") }, "d")
    local okc, err = pcall(H.sync, f)
    assert.is_false(okc)
    assert.truthy(tostring(err):find("certificate verify failed", 1, true), err)
    assert.truthy(tostring(err):find("unable to get local issuer certificate", 1, true), err)
    -- the wrong name fails too
    f = tls_client(port, netrun.tls.client { ca = P("ca.crt"), server_name = "b.example" }, "e")
    okc, err = pcall(H.sync, f)
    assert.is_false(okc)
    assert.truthy(tostring(err):find("hostname mismatch", 1, true), err)
  end)

  it("gives a stream over TLS, connected by host name and verified against that name", function()
    local _, port = echo_server()
    local spawned = group:next():submit(function(port, ca)
      local netrun = require "netrun"
      return netrun.spawn(function()
        local s = netrun.tcp.connect("localhost", port,
          { timeout = 5, tls = netrun.tls.client { ca = ca } }):await()
        assert(s:send("over tls by name"))
        local got, err = s:receive(16)
        s:close()
        return got or err
      end)
    end, port, P("ca.crt"))
    assert.equal("over tls by name", H.sync(H.sync(spawned)))
  end)

  -- localhost is ::1 then 127.0.0.1: TLS starts on the address that
  -- connected (before, the handshake started on ::1's channel and failed
  -- the connect with "channel closed before the TLS handshake completed"),
  -- and a connect no address accepts fails with each address's error.
  it("a TLS connect by name starts TLS only on the address that answered, or reports the connect error", function()
    local _, port = echo_server()
    local free = H.free_port()
    local got = group:next():submit(function(port, free, ca)
      local netrun = require "netrun"
      return netrun.spawn(function()
        local tls = netrun.tls.client { ca = ca }
        local ch = netrun.connect { group = netrun.current(), host = "localhost", port = port,
                                    tls = tls }:await()
        local peer = ch:remote_address()
        ch:close()
        local ok, err = pcall(function()
          return netrun.tcp.connect("localhost", free, { timeout = 5, tls = tls }):await()
        end)
        local ok2, err2 = pcall(function()
          return netrun.connect { group = netrun.current(), host = "localhost", port = free,
                                  tls = tls }:await()
        end)
        return { peer, ok or tostring(err), ok2 or tostring(err2) }
      end)
    end, port, free, P("ca.crt"))
    local peer, err, err2 = table.unpack(H.sync(H.sync(got)))
    assert.equal("127.0.0.1", peer)
    for _, e in ipairs { err, err2 } do
      assert.matches("::1:" .. free .. ": ECONNREFUSED: connection refused; 127.0.0.1:" ..
        free .. ": ECONNREFUSED: connection refused", e, 1, true)
      assert.is_nil(e:find("TLS", 1, true), e)
    end
    assert.matches("netrun.tcp.connect: localhost:" .. free .. ": ", err, 1, true)
  end)

  it("verifies client certificates when required and reports the peer's subject", function()
    local _, port = https_server { cert = P("server.crt"), key = P("server.key"),
                                   ca = P("ca.crt"), verify = "required" }
    local client = netrun.tls.client { ca = P("ca.crt"), cert = P("client.crt"), key = P("client.key") }
    local ch = H.sync(tls_client(port, client, "r"))
    ch:write_and_flush("GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
    assert.truthy(H.eventually(function() return (seen:get("r") or ""):find("hello /x", 1, true) end))
    assert.equal("CN=client one,O=netrun", seen:get("peer"))
    ch:close():sync()
    local out = curl("-o /dev/null -w '%{http_code}' https://localhost:" .. port .. "/")
    assert.are_not.equal("200", out)               -- no client certificate
    assert.truthy(H.eventually(function()
      return (seen:get("exception") or ""):find("peer did not return a certificate", 1, true)
    end), seen:get("exception"))
  end)

  it("reports a client certificate's subject and issuer whole, however long the subject", function()
    -- long.crt's subject is 750 bytes in RFC 2253 form: each name must
    -- come whole and apart (an issuer is what an application may trust).
    local ous = {}
    for i = 14, 1, -1 do ous[#ous + 1] = string.format("OU=unit %02d %s", i, string.rep("0", 40)) end
    local subject = "CN=client long," .. table.concat(ous, ",") .. ",O=netrun"
    assert.is_true(#subject > 700)
    local Peer = {}
    function Peer:user_event_triggered(ctx, e)
      if e.tls == "handshake" then
        seen:set("subject", e.peer and e.peer.subject or "none")
        seen:set("issuer", e.peer and e.peer.issuer or "none")
        seen:set("peer_error", e.peer and e.peer.error or "none")
      end
    end
    Peer.channel_read = Echo.channel_read
    Peer.channel_read_complete = Echo.channel_read_complete
    for _, verify in ipairs { "optional", "required" } do
      seen:flush_all()
      local tls = netrun.tls.server { cert = P("server.crt"), key = P("server.key"),
                                      ca = P("ca.crt"), verify = verify }
      local server = netrun.server {
        group = group, host = "127.0.0.1", port = 0, tls = tls,
        init = function(ch) ch:pipeline():add_last("peer", Peer) end,
      }:sync()
      local _, port = server:local_address()
      local client = netrun.tls.client { ca = P("ca.crt"), cert = P("long.crt"), key = P("long.key") }
      local ch = H.sync(tls_client(port, client, verify))
      ch:write_and_flush("x")
      assert.truthy(H.eventually(function() return seen:get(verify) == "x" end))
      assert.equal(subject, seen:get("subject"), verify)
      assert.equal("CN=netrun test CA", seen:get("issuer"), verify)
      assert.equal("none", seen:get("peer_error"))
      ch:close():sync()
      server:close():sync()
    end
  end)

  it("answers plain HTTP with a 400 that says so, fails garbage with OpenSSL's reason, closes both, and serves on", function()
    local _, port = https_server()
    -- curl speaking plain HTTP to the TLS port: a 400 in plain text, as nginx
    local out = H.run("curl -sS --max-time 10 -i http://127.0.0.1:" .. port .. "/x")
    assert.truthy(out:find("^HTTP/1.1 400 Bad Request\r\n"), out)
    assert.truthy(out:find("\r\nConnection: close\r\n", 1, true), out)
    assert.truthy(out:find("\r\n\r\nThe plain HTTP request was sent to HTTPS port\n$"), out)
    assert.truthy(H.eventually(function() return seen:get("exception") end))
    assert.equal("tls: handshake failed: a plain HTTP request on the TLS port (answered 400)",
      seen:get("exception"))
    assert.is_nil(seen:get("active"))            -- never active behind TLS
    assert.is_nil(seen:get("inactive"))
    -- a request line that comes in pieces
    local c = H.client(port)
    c:setoption("tcp-nodelay", true)
    for _, piece in ipairs { "P", "OST", " ", "/form HTTP/1.1\r\nHost: x\r\n\r\n" } do
      c:send(piece)
      socket.sleep(0.02)                         -- (each its own segment, to be read alone)
    end
    assert.equal(400, (H.read_response(c)))
    c:close()
    -- any method; HEAD gets no body
    c = H.client(port)
    c:send("HEAD /x HTTP/1.1\r\nHost: x\r\n\r\n")
    local status, headers, body = H.read_response(c, true)
    assert.equal(400, status)
    assert.equal("46", headers["content-length"])
    local _, err, rest = c:receive("*a")        -- closed by the server, no body
    assert.equal("closed", err)
    assert.equal("", rest)
    c:close()
    -- what is no request line fails the handshake as before: a TLS
    -- record that is no handshake, an SSH client, lowercase words
    local function refused(bytes)
      local before = seen:get("exceptions")
      c = H.client(port)
      c:send(bytes)
      local data, partial
      data, err, partial = c:receive("*a")      -- an alert or nothing, then closed
      data = data or partial
      assert.truthy(err == nil or err == "closed", err)
      assert.falsy(data:find("HTTP/1.1", 1, true), data)
      c:close()
      assert.truthy(H.eventually(function() return seen:get("exceptions") == before + 1 end))
      assert.truthy(seen:get("exception"):find("tls: handshake failed: error:", 1, true),
        seen:get("exception"))
    end
    refused(string.rep("\22\3\1\0\5garbage", 10))
    refused("SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")
    refused("get / http/1.1\r\n\r\n")
    refused("GET\r\n\r\n")
    out = curl("-w '%{http_code}' -o /dev/null https://localhost:" .. port .. "/")
    assert.equal("200", out)
  end)

  it("survives 10,000 failed handshakes (garbage, plaintext, cut short) with fds and RSS flat", function()
    local _, port = https_server()
    local n = 10000                              -- ~2.5 s plain, ~10 s under ASan
    local kinds = {
      "\22\3\1\0\5garbage",                          -- a record that is no handshake
      "GET / HTTP/1.1\r\nHost: x\r\n\r\n",             -- plaintext on a TLS port
      "\22\3\1\2\0\1\0\1\252\3\3",                 -- a ClientHello cut short, then EOF
    }
    local failed = 0                             -- exceptions expected so far
    local function fail_once(i)
      local kind = i % 3 + 1
      local c = H.client(port)
      c:send(kinds[kind])
      if kind == 3 then
        c:close()                                -- the server sees EOF mid-handshake
        return
      end
      local data, err = c:receive("*a")         -- the alert, then closed
      assert.truthy(data or err == "closed", err)
      c:close()
      failed = failed + 1
    end
    for i = 1, 300 do fail_once(i) end             -- warm up pools and caches
    assert.truthy(H.eventually(function() return seen:get("exceptions") == failed end))
    local fd0, rss0 = fds(), H.rss()
    local t0 = socket.gettime()
    for i = 1, n do fail_once(i) end
    assert.truthy(H.eventually(function() return seen:get("exceptions") == failed end, 10),
      tostring(seen:get("exceptions")) .. " exceptions, " .. failed .. " expected")
    assert.truthy(H.eventually(function() return fds() <= fd0 end), fds() .. " fds, " .. fd0 .. " before")
    assert.truthy(socket.gettime() - t0 < 120)
    if not H.sanitized then
      assert.is_true(H.rss() - rss0 < 4096, (H.rss() - rss0) .. " KiB more RSS")
    end
    assert.is_nil(seen:get("active"))
    local out = curl("-w '%{http_code}' -o /dev/null https://localhost:" .. port .. "/")
    assert.equal("200", out)
  end)

  it("holds a connection that has sent nothing for little more than a plaintext one", function()
    if H.sanitized then return end               -- RSS says nothing under ASan
    local _, port = https_server()
    local function channels()
      local n = 0
      for _, l in ipairs(group:loops()) do n = n + l:stats().channels end
      return n
    end
    local base, rss0 = channels(), H.rss()
    local clients = {}
    for i = 1, 1000 do clients[i] = H.client(port) end
    assert.truthy(H.eventually(function() return channels() == base + 1000 end, 10))
    local per = (H.rss() - rss0) * 1024 / 1000
    for _, c in ipairs(clients) do c:close() end
    -- the SSL (~9 KiB resident) waits for the first bytes, as in nginx
    assert.is_true(per < 4096, per .. " bytes per connection")
    assert.truthy(H.eventually(function() return channels() == base end, 10))
  end)

  it("closes a peer that does not complete the handshake in handshake_timeout", function()
    local _, port = https_server { cert = P("server.crt"), key = P("server.key"),
                                   handshake_timeout = 0.2 }
    local c = H.client(port)
    local t0 = socket.gettime()
    local data, err = c:receive("*a")               -- we send nothing
    local waited = socket.gettime() - t0
    assert.truthy(data or err == "closed", err)
    assert.is_true(waited > 0.15 and waited < 3, tostring(waited))
    c:close()
    assert.truthy(H.eventually(function() return seen:get("exception") end))
    assert.equal("tls: handshake timed out after 0.2 s", seen:get("exception"))
  end)

  it("sends close_notify on close, after everything written before it", function()
    local Bye = {}
    function Bye:channel_active(ctx)
      for i = 1, 64 do ctx:write(string.rep(string.char(64 + i % 26), 1000)) end
      ctx:write("the end")
      ctx:close()
    end
    local tls = netrun.tls.server { cert = P("server.crt"), key = P("server.key") }
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0, tls = tls,
      init = function(ch) ch:pipeline():add_last("bye", Bye) end,
    }:sync()
    local _, port = server:local_address()
    local ch = H.sync(tls_client(port, netrun.tls.client { ca = P("ca.crt") }, "z"))
    assert.truthy(H.eventually(function() return seen:get("z:inactive") end))
    local got = seen:get("z")
    assert.equal(64007, #got)
    assert.equal("the end", got:sub(-7))
    assert.is_true(seen:get("z:close_notify"))
    assert.is_nil(seen:get("z:exception"))
    assert.is_false(ch:is_open())
    local out = s_client(port, "-ign_eof")
    assert.truthy(out:find("the end", 1, true), out)
    assert.truthy(out:find("\nclosed", 1, true), out)   -- close_notify, not a bare EOF
  end)

  it("takes the peer's close_notify as a half-close with allow_half_closure: writes go on, our close ends it", function()
    local Half = {}
    function Half:channel_read(ctx, msg) ctx:write(msg) end
    function Half:channel_read_complete(ctx) ctx:flush() end
    function Half:user_event_triggered(ctx, e)
      local name = type(e) == "table" and e.tls or tostring(e)
      seen:set("events", (seen:get("events") or "") .. name .. ";")
      if e == "input_shutdown" then           -- the client sends no more
        ctx.channel:loop():schedule(0.05, function()
          ctx:write_and_flush(" and later")
          ctx:close()
        end)
      end
    end
    local tls = netrun.tls.server { cert = P("server.crt"), key = P("server.key") }
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0, tls = tls,
      child_options = { allow_half_closure = true },
      init = function(ch) ch:pipeline():add_last("half", Half) end,
    }:sync()
    local _, port = server:local_address()
    local out, status = H.run("timeout 20 /usr/bin/python3 " .. H.root
      .. "/spec/fixtures/tls/close_notify.py " .. port .. " " .. P("ca.crt") .. " --raw echoed")
    assert.equal(0, status, out)
    assert.equal("got echoed and later\nend close_notify\n", out)
    assert.equal("handshake;close_notify;input_shutdown;", seen:get("events"))
  end)

  it("makes the channel unwritable when the peer does not read, and reads with auto_read off", function()
    local Flood = {}
    function Flood:channel_active(ctx)
      local ch = ctx.channel
      local n = 0
      while ch:is_writable() and n < 4096 do
        ctx:write_and_flush(string.rep("x", 16384))
        n = n + 1
      end
      seen:set("flood_writes", n)
      seen:set("flood_writable", ch:is_writable())
    end
    local tls = netrun.tls.server { cert = P("server.crt"), key = P("server.key") }
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0, tls = tls,
      init = function(ch) ch:pipeline():add_last("flood", Flood) end,
    }:sync()
    local _, port = server:local_address()
    -- auto_read off: the handshake still completes (TLS asks for its reads)
    local ch = H.sync(tls_client(port, netrun.tls.client { ca = P("ca.crt") }, "f",
                                 { auto_read = false }))
    assert.truthy(H.eventually(function() return seen:get("flood_writes") end))
    assert.is_false(seen:get("flood_writable"))
    assert.is_true(seen:get("flood_writes") < 4096)
    ch:read()
    assert.truthy(H.eventually(function() return #(seen:get("f") or "") > 0 end))
    ch:close():sync()
  end)

  it("reload swaps the certificate for new handshakes and keeps live connections", function()
    local _, port, tls = echo_server()
    local live = H.sync(tls_client(port, netrun.tls.client { ca = P("ca.crt") }, "l"))
    live:write_and_flush("before;")
    assert.truthy(H.eventually(function() return seen:get("l") == "before;" end))
    assert.truthy(s_client(port):find("subject=CN = localhost", 1, true))
    assert.equal(2, netrun.tls.reload(tls, { cert = P("reloaded.crt"), key = P("reloaded.key") }))
    assert.truthy(s_client(port):find("subject=CN = reloaded", 1, true))
    live:write_and_flush("after")
    assert.truthy(H.eventually(function() return seen:get("l") == "before;after" end))
    -- files replaced in place, then reload(config) re-reads them
    assert(os.execute("cp " .. P("server.crt") .. " " .. P("reloaded.crt") .. " && cp "
      .. P("server.key") .. " " .. P("reloaded.key")))
    assert.equal(3, netrun.tls.reload(tls))
    assert.truthy(s_client(port):find("subject=CN = localhost", 1, true))
    -- a bad reload raises and leaves the current certificate in place
    local ok, err = pcall(netrun.tls.reload, tls, { cert = P("nope.crt"), key = P("server.key") })
    assert.is_false(ok)
    assert.truthy(err:find("cert '" .. P("nope.crt") .. "'", 1, true), err)
    assert.truthy(s_client(port):find("subject=CN = localhost", 1, true))
    live:write_and_flush("!")
    assert.truthy(H.eventually(function() return seen:get("l") == "before;after!" end))
    live:close():sync()
    -- reloads racing handshakes on both loops (TSan watches the swap)
    local clients = io.popen(string.format("for i in $(seq 16); do (timeout 10 openssl s_client "
      .. "-connect 127.0.0.1:%d </dev/null 2>&1 | grep -c '^subject=') & done; wait", port))
    for _ = 1, 30 do netrun.tls.reload(tls) end
    local subjects = clients:read("a")
    clients:close()
    assert.equal(string.rep("1\n", 16), subjects)
  end)

  it("adds by hand to a pipeline, and raises clear errors for bad configs", function()
    local tls = netrun.tls.server { cert = P("server.crt"), key = P("server.key") }
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_first("tls", tls)
        ch:pipeline():add_last("echo", Echo)
      end,
    }:sync()
    local _, port = server:local_address()
    local ch = H.sync(tls_client(port, netrun.tls.client { ca = P("ca.crt") }, "h"))
    ch:write_and_flush("by hand")
    assert.truthy(H.eventually(function() return seen:get("h") == "by hand" end))
    ch:close():sync()

    local function err_of(f, ...)
      local ok, e = pcall(f, ...)
      assert.is_false(ok)
      return e
    end
    local e = err_of(netrun.tls.server, { cert = P("server.crt"), key = P("server.key"), bogus = 1 })
    assert.truthy(e:find("netrun.tls.server: unknown option 'bogus'", 1, true), e)
    e = err_of(netrun.tls.client, { verify = "yes" })
    assert.truthy(e:find("netrun.tls.client: verify must be a boolean", 1, true), e)
    e = err_of(netrun.tls.server, { key = P("server.key") })
    assert.truthy(e:find("cert (or cert_pem) is required", 1, true), e)
    e = err_of(netrun.tls.server, { cert = P("missing.crt"), key = P("server.key") })
    assert.truthy(e:find("netrun.tls.server: cert '" .. P("missing.crt") .. "': error:", 1, true), e)
    assert.truthy(e:find("No such file or directory", 1, true), e)
    e = err_of(netrun.tls.server, { cert = P("server.crt"), key = P("b.key") })
    assert.truthy(e:find("key '" .. P("b.key") .. "': error:", 1, true), e)
    assert.truthy(e:find("key values mismatch", 1, true), e)
    e = err_of(netrun.tls.server, { cert = P("server.crt"), key = P("server.key"), min_version = "SSLv3" })
    assert.truthy(e:find("min_version must be", 1, true), e)
    e = err_of(netrun.tls.server, { cert = P("server.crt"), key = P("server.key"), verify = "required" })
    assert.truthy(e:find("needs ca", 1, true), e)
    e = err_of(netrun.server, { group = group, port = 0, tls = "nope" })
    assert.truthy(e:find('netrun.server: tls must be a netrun.tls.server config, got "nope"', 1, true), e)
  end)

  it("takes PEM text as well as files", function()
    local function slurp(p) local f = assert(io.open(p)) local s = f:read("a") f:close() return s end
    local _, port = echo_server { cert_pem = slurp(P("server.crt")), key_pem = slurp(P("server.key")) }
    local ch = H.sync(tls_client(port, netrun.tls.client { ca = P("ca.crt") }, "p"))
    ch:write_and_flush("pem")
    assert.truthy(H.eventually(function() return seen:get("p") == "pem" end))
    ch:close():sync()
  end)
end)
