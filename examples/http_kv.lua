-- http_kv.lua -- a key-value store over HTTP on a netrun.shared.dict, so
-- every worker loop sees the same data.
--   netrun examples/http_kv.lua [--port N] [--threads N] [--host H]
--                               [--header-timeout S] [--body-timeout S]
--                               [--keepalive-timeout S]   (or PORT=N ...)
--   curl -X PUT --data-binary 'v' localhost:8080/k   -> 201 (200 if it existed)
--   curl localhost:8080/k                             -> 200 "v", or 404
--   curl -X DELETE localhost:8080/k                   -> 204, or 404
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

local TEXT = { ["content-type"] = "text/plain" }

local function reply(ctx, status, body)
  ctx:write { status = status, headers = TEXT, body = body or "" }
end

local KV = {}
function KV:channel_read(ctx, req)
  local store = netrun.shared.dict("kv")
  local key = req.path:match("^/(.+)$")
  if not key then
    return reply(ctx, 400, "use /<key>\n")
  end
  if req.method == "GET" or req.method == "HEAD" then
    local v = store:get(key)
    if v == nil then return reply(ctx, 404, "not found\n") end
    reply(ctx, 200, v)
  elseif req.method == "PUT" or req.method == "POST" then
    local existed = store:get(key) ~= nil
    store:set(key, req.body)
    reply(ctx, existed and 200 or 201, "stored\n")
  elseif req.method == "DELETE" then
    if store:get(key) == nil then return reply(ctx, 404, "not found\n") end
    store:delete(key)
    ctx:write { status = 204 }
  else
    ctx:write { status = 405, headers = { allow = "GET, HEAD, PUT, POST, DELETE" },
                body = "method not allowed\n" }
  end
end
function KV:channel_read_complete(ctx) ctx:flush() end
function KV:exception_caught(ctx, err)
  -- a peer that resets its connection is routine, not a warning
  local reset = tostring(err):find("ECONNRESET") or tostring(err):find("EPIPE")
  netrun.log[reset and "debug" or "warn"]("channel %d: %s", ctx.channel:id(), err)
  ctx:close()
end

netrun.shared.dict("kv", { capacity = 100000 })
local http = netrun.codec.http_server(limits)   -- one configuration, made once

local workers = netrun.group { threads = threads, name = "kv" }
local server = netrun.server {
  group = workers,
  host = option("host", "127.0.0.1"),
  port = port,
  init = function(ch)
    ch:pipeline():add_last("http", http):add_last("kv", KV)
  end,
}:sync()

netrun.log.info("http_kv listening on %s:%d", server:local_address())
