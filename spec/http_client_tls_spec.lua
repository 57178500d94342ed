-- http_client_tls_spec.lua -- the HTTP client over TLS (DESIGN.md §8.3):
-- connections are pooled by origin and TLS settings, so a request never
-- takes a connection made under other settings (verification, CA,
-- client certificate, server_name, ALPN, a reload since); a redirect from
-- https to http is refused unless asked for; examples/fetch.lua's --ca and
-- --insecure. Servers are netrun's own HTTPS servers, with certificates
-- made fresh by spec/fixtures/tls/make_certs.sh.
local H = require "spec.helper"
local netrun = H.netrun

local dir = H.tmpdir()
assert(H.run("bash " .. H.root .. "/spec/fixtures/tls/make_certs.sh " .. dir))
local function P(name) return dir .. "/" .. name end

local counts = netrun.shared.dict("http_client_tls_spec")

-- An HTTPS server on group (server.crt, CN=localhost, IP 127.0.0.1,
-- signed by ca.crt) counting its connections under `name`. It answers
-- "ok <path> peer=<client certificate's subject or none> alpn=<...>",
-- and /to/<URL> with a 302 to that URL.
local function https_server(group, name, opts)
  counts:set(name, 0)
  local tls = netrun.tls.server(opts or { cert = P("server.crt"), key = P("server.key") })
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0, tls = tls,
    init = function(ch)
      local netrun = require "netrun"
      netrun.shared.dict("http_client_tls_spec"):incr(name, 1, 0)
      ch:pipeline():add_last("http", netrun.codec.http_server {})
      ch:pipeline():add_last("app", {
        user_event_triggered = function(_, ctx, e)
          if e.tls == "handshake" then
            ctx.channel:attr("peer", e.peer and e.peer.subject or "none")
            ctx.channel:attr("alpn", e.alpn or "none")
          end
          ctx:fire_user_event_triggered(e)
        end,
        channel_read = function(_, ctx, req)
          local to = req.target:match("^/to/(.*)$")
          if to then return ctx:write_and_flush { status = 302, headers = { location = to } } end
          ctx:write_and_flush { status = 200, body = string.format("ok %s peer=%s alpn=%s",
            req.path, tostring(ctx.channel:attr("peer")), tostring(ctx.channel:attr("alpn"))) }
        end,
      })
    end,
  }:sync()
  local _, port = server:local_address()
  return server, port
end

-- The body of a request's response, or "error: <message>".
local function fetch(f)
  local ok, res = pcall(H.sync, f, 15)
  if not ok then return "error: " .. tostring(res) end
  return res.body
end

describe("netrun.http client over TLS", function()
  local servers, loops
  setup(function()
    servers = netrun.group { threads = 1, name = "tlsd" }
    loops = netrun.group { threads = 1, name = "tlsc" }
  end)
  teardown(function() H.shutdown(servers); H.shutdown(loops) end)

  it("never takes a connection made with other verification or another CA", function()
    local server, port = https_server(servers, "verify")
    local url = "https://127.0.0.1:" .. port .. "/"
    local c = netrun.http.client {}
    -- verify = false first: its connection is pooled ...
    assert.equal("ok / peer=none alpn=none", fetch(c:request { url = url, tls = netrun.tls.client { verify = false } }))
    -- ... and a request with the default settings (the system's CAs, which
    -- do not know the test CA) must make its own, and fail to verify
    assert.matches("^error: .*certificate", fetch(c:request { url = url }))
    local ca = netrun.tls.client { ca = P("ca.crt") }
    assert.equal("ok / peer=none alpn=none", fetch(c:request { url = url, tls = ca }))
    assert.matches("^error: .*certificate",
      fetch(c:request { url = url, tls = netrun.tls.client { ca = P("other-ca.crt") } }))
    -- configs made alike share their connections: no new one for this
    local before = counts:get("verify")
    assert.equal("ok / peer=none alpn=none", fetch(c:request { url = url, tls = netrun.tls.client { ca = P("ca.crt") } }))
    assert.equal("ok / peer=none alpn=none", fetch(c:request { url = url, tls = ca }))
    assert.equal(before, counts:get("verify"))
    server:close():sync()
  end)

  it("never takes a connection made with another client certificate, server_name or ALPN", function()
    local server, port = https_server(servers, "mtls", { cert = P("server.crt"), key = P("server.key"),
      ca = P("ca.crt"), verify = "optional", alpn = { "http/1.1" } })
    local url = "https://127.0.0.1:" .. port .. "/"
    local c = netrun.http.client {}
    local with_cert = netrun.tls.client { ca = P("ca.crt"), cert = P("client.crt"), key = P("client.key") }
    assert.matches("peer=.*client one", fetch(c:request { url = url, tls = with_cert }))
    -- an anonymous request is not sent over the authenticated connection
    assert.equal("ok / peer=none alpn=none", fetch(c:request { url = url, tls = netrun.tls.client { ca = P("ca.crt") } }))
    assert.equal(2, counts:get("mtls"))
    assert.equal("ok / peer=none alpn=http/1.1",
      fetch(c:request { url = url, tls = netrun.tls.client { ca = P("ca.crt"), alpn = { "http/1.1" } } }))
    assert.equal(3, counts:get("mtls"))
    local named = netrun.tls.client { ca = P("ca.crt"), server_name = "localhost" }
    assert.equal("ok / peer=none alpn=none", fetch(c:request { url = url, tls = named }))
    assert.equal("ok / peer=none alpn=none", fetch(c:request { url = url, tls = named }))
    assert.equal(4, counts:get("mtls"))
    assert.matches("peer=.*client one", fetch(c:request { url = url, tls = with_cert }))
    assert.equal(4, counts:get("mtls"))                -- its own, again
    server:close():sync()
  end)

  it("a reload that changes a client's TLS settings retires the connections made before it (callbacks on a loop)", function()
    local server, port = https_server(servers, "reload")
    local url = "https://127.0.0.1:" .. port .. "/r"
    local cfg = netrun.tls.client { ca = P("ca.crt") }
    local c = netrun.http.client { tls = cfg }
    local loop = loops:next()
    -- client:request(opts, callback) on a loop: after its first request
    -- (which makes the pool) the usual path is C's (core.http.lane)
    local function on_loop()
      return H.sync(loop:submit(function(c, url)
        local netrun = require "netrun"
        local p = netrun.promise()
        c:request({ url = url }, function(res, err) p:set_success(res and res.body or "error: " .. tostring(err)) end)
        return p
      end, c, url):sync(), 15)
    end
    assert.equal("ok /r peer=none alpn=none", on_loop())
    assert.equal("ok /r peer=none alpn=none", on_loop())
    assert.equal(1, counts:get("reload"))
    netrun.tls.reload(cfg)                              -- rebuilt alike: the same identity
    assert.equal("ok /r peer=none alpn=none", on_loop())
    assert.equal(1, counts:get("reload"))
    netrun.tls.reload(cfg, { ca = P("other-ca.crt") })  -- another CA: the pooled connection goes
    assert.matches("^error: .*certificate", on_loop())
    netrun.tls.reload(cfg, { ca = P("ca.crt") })
    assert.equal("ok /r peer=none alpn=none", on_loop())
    assert.equal(3, counts:get("reload"))              -- (the refused one counted too)
    -- the same through a forwarder (a proxy's path), and netrun.http.request
    local f = H.sync(H.sync(loop:submit(function(c, url)
      local netrun = require "netrun"
      return netrun.server {
        group = netrun.current(), host = "127.0.0.1", port = 0,
        init = function(ch)
          local forward = c:forwarder { url = url:match("^(https://[^/]+)") }
          ch:pipeline():add_last("http", netrun.codec.http_server {})
          ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
            forward(req, function(res, err)
              ctx:write_and_flush { status = res and 200 or 502, body = res and res.body or tostring(err) }
            end)
          end })
        end,
      }
    end, c, url)))
    local _, fport = f:local_address()
    local function via_front()
      local s = H.client(fport)
      s:send("GET /f HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
      local status, _, body = H.read_response(s)
      s:close()
      return status .. " " .. body
    end
    assert.equal("200 ok /f peer=none alpn=none", via_front())
    netrun.tls.reload(cfg, { ca = P("other-ca.crt") })
    assert.matches("^502 .*certificate", via_front())
    netrun.tls.reload(cfg, { ca = P("ca.crt") })
    assert.equal("200 ok /f peer=none alpn=none", via_front())
    f:close():sync()
    server:close():sync()
  end)

  it("refuses a redirect from https to http unless follow_downgrade is set", function()
    local server, port = https_server(servers, "down")
    local plain = netrun.server {
      group = servers, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("http", require("netrun").codec.http_server {})
        ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
          ctx:write_and_flush { status = 200, body = "plain " .. req.path .. " auth=" ..
            tostring(req.headers.authorization) }
        end })
      end,
    }:sync()
    local _, pport = plain:local_address()
    local tls = netrun.tls.client { ca = P("ca.crt") }
    local url = "https://127.0.0.1:" .. port .. "/to/http://127.0.0.1:" .. pport .. "/x"
    local err = fetch(netrun.http.request { url = url, tls = tls, follow = 3,
                                           headers = { authorization = "Bearer s3cret" } })
    assert.matches("^error: netrun%.http: GET .*: redirect from https to http refused %(follow_downgrade%)", err)
    assert.equal("plain /x auth=nil", fetch(netrun.http.request { url = url, tls = tls, follow = 3,
      follow_downgrade = true, headers = { authorization = "Bearer s3cret" } }))
    -- https to https on the same origin keeps everything
    local same = "https://127.0.0.1:" .. port .. "/to/" .. "https://127.0.0.1:" .. port .. "/y"
    assert.equal("ok /y peer=none alpn=none", fetch(netrun.http.request { url = same, tls = tls, follow = 1 }))
    local c = netrun.http.client { follow = 2, follow_downgrade = true, tls = tls }
    assert.equal("plain /x auth=nil", fetch(c:request { url = url }))
    assert.has_error(function() netrun.http.client { follow_downgrade = "yes" } end,
      "netrun.http.client: follow_downgrade must be a boolean, got \"yes\"")
    plain:close():sync()
    server:close():sync()
  end)

  it("examples/fetch.lua verifies against --ca, and verifies nothing with --insecure", function()
    local server, port = https_server(servers, "fetch")
    local cmd = string.format("%s %s/examples/fetch.lua --url https://127.0.0.1:%d/f ", H.BIN, H.root, port)
    local out, status = H.run(cmd .. "--ca " .. P("ca.crt"))
    assert.equal(0, status, out)
    assert.matches("HTTP/1.1 200 OK\n.*ok /f peer=none.*requests=1 seconds=[%d.]+ errors=0", out)
    out = H.run(cmd .. "--insecure")
    assert.matches("ok /f peer=none.*requests=1 seconds=[%d.]+ errors=0", out)
    out = H.run(cmd .. "--ca " .. P("other-ca.crt"))
    assert.matches("requests=0 seconds=[%d.]+ errors=1", out)
    assert.matches("certificate verify failed", out)   -- (its log line, before or after)
    out = H.run(cmd)                                    -- the system's CAs
    assert.matches("requests=0 seconds=[%d.]+ errors=1", out)
    server:close():sync()
  end)
end)
