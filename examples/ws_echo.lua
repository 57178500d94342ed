-- ws_echo.lua -- a WebSocket echo server: text and binary messages come
-- back as they were sent; any other HTTP request gets a small page (GET /)
-- or 426 Upgrade Required.
--   netrun examples/ws_echo.lua [--port 9000] [--host H] [--threads N]
--                               [--max-message BYTES] [--close-timeout S]
--                               [--deflate yes]  (permessage-deflate, when
--                                                 the client offers it)
--                               [--inflate-ratio N]  (what a connection may
--                                 inflate: N times what it sent compressed;
--                                 0: no bound but max-message)
-- Try it: netrun examples/ws_client.lua --url ws://127.0.0.1:9000/
local netrun = require "netrun"

local option = netrun.option
local port = option("port", 9000)
local opts = {
  max_message = option("max-message", 1 << 20),   -- larger: closed with 1009
  close_timeout = option("close-timeout", 5),     -- wait for the peer's close
  deflate = option("deflate", "no") == "yes",     -- agree permessage-deflate
  inflate_ratio = option("inflate-ratio", 64),    -- 1008 past it (0: none)
}

local PAGE = netrun.codec.http_response {
  status = 200, headers = { ["content-type"] = "text/html" },
  body = "<!doctype html><title>ws_echo</title><p>A WebSocket echo: connect "
    .. "to ws://this-host/ and every message comes back.</p>\n",
}
local UPGRADE = netrun.codec.http_response {
  status = 426, headers = { upgrade = "websocket", ["content-type"] = "text/plain" },
  body = "this is a WebSocket endpoint\n",
}
local VOID = netrun.void_promise()

-- Before the upgrade: HTTP requests. After it: WebSocket messages, which
-- this same handler echoes (a text message's table is written back as it
-- is: its type says which frame).
local Echo = {}
function Echo:channel_read(ctx, msg)
  if msg.method == nil then             -- a message { type, data }
    ctx:write(msg.type == "text" and msg.data or msg, VOID)
  elseif msg.headers.upgrade then
    netrun.websocket.upgrade(ctx, msg, opts)
  else
    ctx:write(msg.path == "/" and PAGE or UPGRADE, VOID)
  end
end
function Echo:channel_read_complete(ctx) ctx:flush() end
function Echo:exception_caught(ctx, err)
  local reset = tostring(err):find("ECONNRESET") or tostring(err):find("EPIPE")
  netrun.log[reset and "debug" or "warn"]("channel %d: %s", ctx.channel:id(), err)
  ctx:close()
end

local http = netrun.codec.http_server()   -- one configuration, made once

local workers = netrun.group { threads = option("threads", 1), name = "ws" }
local server = netrun.server {
  group = workers, host = option("host", "127.0.0.1"), port = port,
  init = function(ch)
    ch:pipeline():add_last("http", http):add_last("echo", Echo)
  end,
}:sync()

netrun.log.info("ws_echo listening on %s:%d", server:local_address())
