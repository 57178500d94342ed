-- http_hello.lua -- "Hello, World!" over HTTP/1.1: the native codec parses
-- and encodes, a Lua handler answers.
--   netrun examples/http_hello.lua [--port N] [--threads N] [--host H]
--                                  [--response prepared|table|dynamic]
--                                  [--header-timeout S] [--body-timeout S]
--                                  [--keepalive-timeout S]   (or PORT=N ...)
--                                  [--observe ACCESS_LOG]
-- Keep-alive and pipelining are handled by the codec: the handler writes
-- one response per request and flushes once per read.
local netrun = require "netrun"

local option = netrun.option

local port = option("port", 8080)
local threads = option("threads", 1)

-- The codec faces clients, so it times them (nginx's defaults): a request
-- head must arrive within 60 s of its first byte, a body may pause 60 s
-- between reads (both answered with 408), and an idle connection is
-- closed after 75 s; 0 turns one off.
local limits = {
  header_timeout = option("header-timeout", 60),
  body_timeout = option("body-timeout", 60),
  keepalive_timeout = option("keepalive-timeout", 75),
}

-- The response is prepared once: its table is read and its headers checked
-- here, and each write copies its bytes (adding Date, and Connection: close
-- when the client asked for it). A plain table works too (--response
-- table) and costs a table walk per response. --response dynamic writes
-- what a real handler does (examples/http_kv.lua): a new table per
-- response with the same status and headers table and a body that differs
-- from the last one (two constant strings in turn, so what is measured is
-- the write, not the making of a body).
local mode = option("response", "prepared")
if mode ~= "prepared" and mode ~= "table" and mode ~= "dynamic" then
  error(("--response %s: prepared, table or dynamic"):format(mode), 0)
end
local TEXT = { ["content-type"] = "text/plain" }
local response = {
  status = 200,
  headers = TEXT,
  body = "Hello, World!",
}
if mode == "prepared" then
  response = netrun.codec.http_response(response)
end
local BODIES = { "Hello, World!", "Hello, Earth!" }

-- Nobody looks at a write's future here, so the writes take the void
-- promise (Netty's voidPromise) and make none; a failed write still
-- reaches exception_caught.
local VOID = netrun.void_promise()

local Hello = {}
function Hello:channel_read(ctx, req) ctx:write(response, VOID) end
if mode == "dynamic" then
  local turn = 1
  function Hello:channel_read(ctx, req)
    turn = 3 - turn
    ctx:write({ status = 200, headers = TEXT, body = BODIES[turn] }, VOID)
  end
end
-- --observe FILE: what an observed service pays (DESIGN.md §9.8, measured
-- by bench/instr.sh's `observed` case): an access log line per request to
-- FILE, a labelled counter and a histogram updated per request.
local observe = option("observe", nil)
local access_log
if observe then
  local requests = netrun.metrics.counter { name = "hello_requests_total", labels = { "code" } }
  local sizes = netrun.metrics.histogram { name = "hello_response_bytes", buckets = { 16, 256, 4096 } }
  local OK, plain = { code = "200" }, Hello.channel_read
  function Hello:channel_read(ctx, req)
    requests:inc(1, OK)
    sizes:observe(13)
    return plain(self, ctx, req)
  end
  access_log = netrun.handler.access_log { path = observe,
    format = '$remote_addr "$request" $status $body_bytes_sent $request_time' }
end
function Hello:channel_read_complete(ctx) ctx:flush() end
function Hello:exception_caught(ctx, err)
  -- a peer that resets its connection is routine, not a warning
  local reset = tostring(err):find("ECONNRESET") or tostring(err):find("EPIPE")
  netrun.log[reset and "debug" or "warn"]("channel %d: %s", ctx.channel:id(), err)
  ctx:close()
end

-- One codec configuration for every connection: made once here, each
-- add_last below gives a connection its own codec state from it.
local http = netrun.codec.http_server(limits)

local workers = netrun.group { threads = threads, name = "http" }
local server = netrun.server {
  group = workers,
  host = option("host", "127.0.0.1"),
  port = port,
  init = function(ch)
    ch:pipeline():add_last("http", http)
    if access_log then ch:pipeline():add_last("log", access_log) end
    ch:pipeline():add_last("hello", Hello)
  end,
}:sync()

netrun.log.info("http_hello listening on %s:%d", server:local_address())
