-- ws_client.lua -- a WebSocket client: sends --count text messages (and
-- one binary), prints each echo, then closes with 1000. With
-- examples/ws_echo.lua running:
--   netrun examples/ws_client.lua [--url ws://127.0.0.1:9000/] [--count 3]
--                                 [--message "hello"] [--deflate yes]
-- wss:// URLs go over TLS, verified against the system's CAs.
local netrun = require "netrun"

local option = netrun.option
local url = option("url", "ws://127.0.0.1:9000/")
local count = option("count", 3)
local message = option("message", "hello")
local deflate = option("deflate", "no") == "yes"   -- offer permessage-deflate
local group = netrun.group { threads = 1, name = "client" }
local done = netrun.promise()

-- Every echo is printed; after the last one the client closes, and the
-- close handshake's end (the server's answer) finishes the script.
local Print = { got = 0 }
function Print:channel_read(ctx, msg)
  print(string.format("%s: %q", msg.type, msg.data))
  self.got = self.got + 1
  if self.got == count + 1 then ctx:close() end
end
function Print:user_event_triggered(ctx, evt)
  if type(evt) == "table" and evt.type == "close" then
    print(string.format("closed: %d %s", evt.code, evt.reason))
  end
end
function Print:channel_inactive(ctx) done:try_success(self.got) end
function Print:exception_caught(ctx, err) done:try_failure(err) end

local ch = netrun.websocket.connect {
  url = url, group = group, timeout = 5, deflate = deflate,
  init = function(c) c:pipeline():add_last("print", Print) end,
}:sync()
for i = 1, count do ch:write(message .. " " .. i) end
ch:write_and_flush { type = "binary", data = "\0\1\2" }
local got = done:sync()
print(string.format("messages=%d", got))
group:shutdown_gracefully(0, 1):sync()
