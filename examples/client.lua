-- client.lua -- connects to a server, sends a message, prints what comes
-- back, and exits. With examples/echo.lua running:
--   netrun examples/client.lua [--port 7000] [--message "hello"]
--                              [--tls CA_FILE | system | insecure] [--server-name N]
-- --tls talks TLS: verifying the server against CA_FILE or the system's
-- CAs, or not at all (insecure); the name checked is --server-name, else
-- --host.
local netrun = require "netrun"

local option = netrun.option

local message = option("message", "hello from netrun\n")
local group = netrun.group { threads = 1, name = "client" }
local reply = netrun.promise()

-- Collects bytes until the whole message has come back (an echo).
local Collect = { got = "" }
function Collect:channel_read(ctx, msg)
  self.got = self.got .. msg
  if #self.got >= #message then reply:try_success(self.got) end
end
function Collect:channel_inactive(ctx)
  reply:try_failure("the server closed the connection")
end
function Collect:exception_caught(ctx, err) reply:try_failure(err) end

local tls_mode = option("tls")
local tls = tls_mode and netrun.tls.client {
  verify = tls_mode ~= "insecure",
  ca = (tls_mode ~= "insecure" and tls_mode ~= "system") and tls_mode or nil,
  server_name = option("server-name"),
}

local ok, ch = pcall(function()
  return netrun.connect {
    group = group, host = option("host", "127.0.0.1"), port = option("port", 7000),
    timeout = 5, tls = tls,
    init = function(c) c:pipeline():add_last("collect", Collect) end,
  }:sync()
end)
if ok then
  ch:write_and_flush(message)
  local got, answer = pcall(reply.sync, reply)
  io.write(got and answer or ("error: " .. tostring(answer) .. "\n"))
  ch:close():sync()
else
  io.stderr:write("client: ", tostring(ch), "\n")
end
group:shutdown_gracefully(0, 1):sync()
if not ok then os.exit(1) end
