-- http_hello.lua -- "Hello, World!" over HTTP/1.1: the native codec parses
-- and encodes, a Lua handler answers.
--   netrun examples/http_hello.lua [--port N] [--threads N] [--host H]   (or PORT=N)
-- Keep-alive and pipelining are handled by the codec: the handler writes
-- one response per request and flushes once per read.
local netrun = require "netrun"

local option = netrun.option

local port = option("port", 8080)
local threads = option("threads", 1)

-- One response table, reused: the codec copies what it needs at write.
local response = {
  status = 200,
  headers = { ["content-type"] = "text/plain" },
  body = "Hello, World!",
}

local Hello = {}
function Hello:channel_read(ctx, req) ctx:write(response) end
function Hello:channel_read_complete(ctx) ctx:flush() end
function Hello:exception_caught(ctx, err)
  netrun.log.warn("channel %d: %s", ctx.channel:id(), err)
  ctx:close()
end

local workers = netrun.group { threads = threads, name = "http" }
local server = netrun.server {
  group = workers,
  host = option("host", "127.0.0.1"),
  port = port,
  init = function(ch)
    ch:pipeline():add_last("http", netrun.codec.http_server {})
    ch:pipeline():add_last("hello", Hello)
  end,
}:sync()

netrun.log.info("http_hello listening on %s:%d", server:local_address())
