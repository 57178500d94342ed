-- echo.lua -- an echo server: every byte a client sends comes back.
--   netrun examples/echo.lua [--port N] [--threads N]     (or PORT=N)
--                            [--cert server.crt --key server.key]  (TLS)
-- One group accepts and serves; each loop runs the handler in its own
-- Lua state, one handler table shared by that loop's channels.
local netrun = require "netrun"

local option = netrun.option

local port = option("port", 7000)
local threads = option("threads", 1)

-- Nobody looks at a write's future here, so the writes take the void
-- promise (Netty's voidPromise) and make none; a failed write still
-- reaches exception_caught.
local VOID = netrun.void_promise()

local Echo = {}
function Echo:channel_read(ctx, msg) ctx:write(msg, VOID) end
function Echo:channel_read_complete(ctx) ctx:flush() end
-- Backpressure (as Netty's echo examples): a client that sends and does
-- not read would have its echoes pile up in the outbound buffer. Once the
-- buffer is above write_buffer_high the channel turns unwritable and the
-- server stops reading from it; once it drains below write_buffer_low it
-- reads again. The event comes only on those changes: a read costs nothing.
function Echo:channel_writability_changed(ctx)
  local ch = ctx.channel
  ch:option("auto_read", ch:is_writable())
end
function Echo:exception_caught(ctx, err)
  -- a peer that resets its connection is routine, not a warning
  local reset = tostring(err):find("ECONNRESET") or tostring(err):find("EPIPE")
  netrun.log[reset and "debug" or "warn"]("channel %d: %s", ctx.channel:id(), err)
  ctx:close()
end

-- With a certificate and its key, clients talk TLS (examples/client.lua --tls).
local cert, key = option("cert"), option("key")
local tls = cert and netrun.tls.server { cert = cert, key = key }

local workers = netrun.group { threads = threads, name = "echo" }
local server = netrun.server {
  group = workers,
  host = option("host", "127.0.0.1"),
  port = port,
  tls = tls,
  init = function(ch) ch:pipeline():add_last("echo", Echo) end,
}:sync()

netrun.log.info("echo server listening on %s:%d", server:local_address())
