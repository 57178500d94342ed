-- static.lua -- a directory served over HTTP: netrun.handler.static after
-- the HTTP codec; what is not a file goes on to a Lua handler (here a
-- plain 404, where an application would route it).
--   netrun examples/static.lua [--root DIR] [--port 8080] [--threads N] [--host H]
-- Try: curl -i http://127.0.0.1:8080/   (DIR/index.html)
--      curl -r 0-99 http://127.0.0.1:8080/some/file
local netrun = require "netrun"

local option = netrun.option
local root = option("root", ".")
local port = option("port", 8080)

-- One configuration, made once: each loop keeps its own open file cache.
local files = netrun.handler.static {
  root = root,
  index = "index.html",
  precompressed = true,                 -- app.js.br / app.js.gz when accepted
  cache = { max = 1000, valid = 60 },
}
local http = netrun.codec.http_server {}

local NotFound = {}
function NotFound:channel_read(ctx, req)
  ctx:write { status = 404, headers = { ["content-type"] = "text/plain" },
              body = "not found: " .. req.path .. "\n" }
end
function NotFound:channel_read_complete(ctx) ctx:flush() end

local workers = netrun.group { threads = option("threads", 1), name = "static" }
local server = netrun.server {
  group = workers,
  host = option("host", "127.0.0.1"),
  port = port,
  init = function(ch)
    ch:pipeline():add_last("http", http):add_last("files", files)
      :add_last("app", NotFound)
  end,
}:sync()

netrun.log.info("static: serving %s on %s:%d", root, server:local_address())
