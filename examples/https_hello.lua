-- https_hello.lua -- "Hello, World!" over HTTPS: TLS (OpenSSL 3) in front of
-- the native HTTP codec, a Lua handler answering.
--   netrun examples/https_hello.lua [--port 8443] [--cert server.crt --key server.key]
--                                   [--threads N] [--host H]   (or PORT=, CERT=, KEY=)
-- Without --cert/--key it makes a self-signed pair for localhost with the
-- openssl CLI in a temporary directory and logs where (try
-- `curl --cacert THAT.crt https://localhost:8443/`). To make one yourself:
--   openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
--     -keyout server.key -out server.crt -days 365 -subj /CN=localhost \
--     -addext subjectAltName=DNS:localhost,IP:127.0.0.1
local netrun = require "netrun"

local option = netrun.option

local port = option("port", 8443)
local threads = option("threads", 1)
local cert, key = option("cert"), option("key")

if not cert or not key then
  local dir = os.tmpname()
  os.remove(dir)
  cert, key = dir .. "/server.crt", dir .. "/server.key"
  local ok = os.execute(string.format(
    "mkdir -p %s && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
    .. "-nodes -keyout %s -out %s -days 30 -subj /CN=localhost "
    .. "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 2>/dev/null", dir, key, cert))
  if not ok then error("https_hello: no --cert/--key given and openssl could not make a pair") end
  netrun.log.info("https_hello: self-signed certificate %s (key %s)", cert, key)
end

-- Built once: every loop shares its SSL_CTX.
local tls = netrun.tls.server { cert = cert, key = key, alpn = { "h2", "http/1.1" } }

local response = netrun.codec.http_response {
  status = 200,
  headers = { ["content-type"] = "text/plain" },
  body = "Hello, World!",
}
local VOID = netrun.void_promise()

local Hello = {}
function Hello:channel_read(ctx, req) ctx:write(response, VOID) end
function Hello:channel_read_complete(ctx) ctx:flush() end
function Hello:exception_caught(ctx, err)
  netrun.log.debug("channel %d: %s", ctx.channel:id(), err)   -- failed handshakes, too
  ctx:close()
end

local http = netrun.codec.http_server {}   -- one configuration, made once

local workers = netrun.group { threads = threads, name = "https" }
local server = netrun.server {
  group = workers,
  host = option("host", "127.0.0.1"),
  port = port,
  tls = tls,                      -- TLS first in every connection's pipeline
  init = function(ch)
    ch:pipeline():add_last("http", http):add_last("hello", Hello)
  end,
}:sync()

netrun.log.info("https_hello listening on %s:%d", server:local_address())
