--- WebSocket (RFC 6455): `netrun.websocket`, loaded on
-- first use, on the native codec `netrun.codec.websocket`: frames parsed
-- and masked in C, fragments reassembled, text checked as UTF-8, pings
-- answered, the close handshake done for you. Handlers read
-- `{ type = "text" | "binary", data = "..." }` and write a string (a text
-- frame) or `{ type = "binary" | "ping" | "pong" | "close", data, code,
-- reason }`; the peer's close comes as the user event
-- `{ type = "close", code, reason }`. docs/guide/websocket.md.
-- @module netrun.websocket

-- netrun.websocket: WebSocket (RFC 6455, DESIGN.md §8.3) on the native
-- codec (runtime/codec/ws.c, runtime/bindings/lws.c).
--
-- Server side, from the handler after an http_server codec:
--   function H:channel_read(ctx, req)
--     if req.headers.upgrade then
--       return netrun.websocket.upgrade(ctx, req, { protocols = { "chat" },
--                                       max_message = 1 << 20 })
--     end
--   end
-- upgrade answers 101 and puts the WebSocket codec where the HTTP codec
-- was; the handlers after it then read { type = "text" | "binary",
-- data = "..." } and write a string (a text frame) or { type = "binary",
-- data = "..." }. It returns true and the protocol chosen, or answers the
-- request itself (400, 426) and returns nil and why. Call it from the
-- channel_read that received the request: bytes the client sent after it
-- (its first frames) go to the new codec.
--
-- Client side:
--   local ch = netrun.websocket.connect { url = "ws://127.0.0.1:9000/chat",
--     init = function(ch) ch:pipeline():add_last("app", App) end }:await()
-- The future completes with the channel once the server accepted the
-- handshake (the handlers init added see channel_active then), or fails
-- with why. wss:// URLs go over TLS (tls = netrun.tls.client {...} to
-- choose its options; by default the system's CAs and the URL's host).
local core = require "netrun.core"

local M = {}

local lower, find, format = string.lower, string.find, string.format

-- Whether the comma-separated header value v holds token (any case).
local function has_token(v, token)
  if type(v) ~= "string" then return false end
  for t in v:gmatch("[^,]+") do
    if lower(t:match("^%s*(.-)%s*$")) == token then return true end
  end
  return false
end

-- The options, checked by lopts.c's readers (core.options): numeric
-- strings are numbers, sizes may be "64k".
local LIMITS = { max_message = "size 1", max_frame = "size 1", close_timeout = "seconds",
                 frame_timeout = "seconds", inflate_ratio = "integer 0" }
local function schema(t)
  for k, v in pairs(LIMITS) do t[k] = v end
  return t
end
local check_upgrade = core.options("netrun.websocket.upgrade",
  schema { protocols = "strings", deflate = "boolean" })
local check_connect = core.options("netrun.websocket.connect",
  schema { url = "string!", protocols = "strings", deflate = "boolean", headers = "table",
           timeout = "seconds", tls = "tls.client", init = "function", group = "group" })
local option_error = core.option_error

local configs = {}            -- one codec config per set of limits, per state

local function config(opts)
  local k = format("%s/%s/%s/%s/%s", opts.max_message, opts.max_frame, opts.close_timeout,
    opts.frame_timeout, opts.inflate_ratio)
  local c = configs[k]
  if c == nil then
    c = core.codec.websocket { max_message = opts.max_message,
                               max_frame = opts.max_frame,
                               close_timeout = opts.close_timeout,
                               frame_timeout = opts.frame_timeout,
                               inflate_ratio = opts.inflate_ratio }
    configs[k] = c
  end
  return c
end

local function refuse(ctx, status, why, headers)
  headers = headers or {}
  headers["content-type"] = "text/plain"
  headers.connection = "close"
  ctx:write_and_flush { status = status, headers = headers, body = why .. "\n" }
  return nil, why
end

local function choose(offered, protocols)
  if type(offered) ~= "string" or protocols == nil then return nil end
  for _, p in ipairs(protocols) do
    if has_token(offered, lower(p)) then return p end
  end
  return nil
end

local NONE = {}

--- Upgrade an HTTP request to a WebSocket, from the `channel_read` of the
-- handler after `netrun.codec.http_server` that got the request: answers
-- 101 (the first of `protocols` the client offered) and puts the WebSocket
-- codec where the HTTP codec was; bytes the client sent after its request
-- go to it. The handler keeps its place and reads the messages next. A
-- request that is no valid upgrade is answered 400, 405 or 426 here. The
-- 101 is flushed when the handler call returns: add the channel to a
-- channel group before then, in the same call.
-- @tparam ctx ctx the handler's ctx
-- @param req the request
-- @tparam[opt] table opts the codec's options (`netrun.codec.websocket`: `max_message`, `max_frame`, `close_timeout`, `frame_timeout`, `inflate_ratio`) and:
-- @tparam[opt] {string,...} opts.protocols subprotocols this server speaks, by preference
-- @bool[opt=false] opts.deflate accept permessage-deflate when the client offers it
-- @treturn[1] bool true
-- @treturn[1] string|nil the protocol chosen
-- @treturn[2] nil
-- @treturn[2] string why (the request was answered with an error status)
-- @usage if req.headers.upgrade then return netrun.websocket.upgrade(ctx, req) end
function M.upgrade(ctx, req, opts)
  opts = check_upgrade(opts) or NONE
  local h = req.headers
  if req.method ~= "GET" then
    return refuse(ctx, 405, "websocket upgrade: the method must be GET", { allow = "GET" })
  end
  if not has_token(h.upgrade, "websocket") or not has_token(h.connection, "upgrade") then
    return refuse(ctx, 426, "websocket upgrade: Upgrade: websocket and Connection: Upgrade expected",
      { upgrade = "websocket" })
  end
  if h["sec-websocket-version"] ~= "13" then
    return refuse(ctx, 426, "websocket upgrade: version 13 only",
      { ["sec-websocket-version"] = "13" })
  end
  local key = h["sec-websocket-key"]
  if type(key) ~= "string" or not key:match("^[%w+/]+==$") or #key ~= 24 then
    return refuse(ctx, 400, "websocket upgrade: bad Sec-WebSocket-Key")
  end
  local proto = choose(h["sec-websocket-protocol"], opts.protocols)
  local ext, bits
  if opts.deflate and type(h["sec-websocket-extensions"]) == "string" then
    ext, bits = core.ws.deflate_accept(h["sec-websocket-extensions"])
  end
  local resp = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
    .. "Connection: Upgrade\r\nSec-WebSocket-Accept: " .. core.ws.accept(key)
    .. (proto and ("\r\nSec-WebSocket-Protocol: " .. proto) or "")
    .. (ext and ("\r\nSec-WebSocket-Extensions: " .. ext) or "") .. "\r\n\r\n"
  core.ws.switch(ctx.channel, config(opts), resp, bits)
  return true, proto
end

-- ---- client --------------------------------------------------------------

local function parse_url(url)
  local scheme, rest = url:match("^(wss?)://(.+)$")
  if not scheme then return nil end
  local hostport, path = rest:match("^([^/]+)(/.*)$")
  hostport = hostport or rest
  path = path or "/"
  local host, port = hostport:match("^%[(.+)%]:?(%d*)$")
  if not host then host, port = hostport:match("^([^:]+):?(%d*)$") end
  if not host then return nil end
  port = tonumber(port) or (scheme == "wss" and 443 or 80)
  return scheme, host, port, path, hostport
end

local function check_header(k, v)
  if type(k) ~= "string" or find(k, "[^%w%-_]") then
    option_error("netrun.websocket.connect", "headers", k, "a table of header names (letters, " ..
      "digits, - and _)")
  end
  if type(v) ~= "string" or find(v, "[\r\n]") then
    option_error("netrun.websocket.connect", "headers." .. k, v, "a string without CR or LF")
  end
end

--- Connect a WebSocket client: TCP (TLS for `wss://`), the HTTP handshake,
-- then a channel whose handlers read and write messages as a server's do.
-- The handlers `init` adds see `channel_active` once the 101 came. The
-- codec's options (`max_message`, ...) are taken as `upgrade` takes them.
-- @tparam table opts
-- @string opts.url `ws://host[:port][/path]` or `wss://...`
-- @tparam[opt] function opts.init `init(ch)`, adds the handlers
-- @tparam[opt] {string,...} opts.protocols subprotocols to offer
-- @tparam[opt] table opts.headers extra handshake fields
-- @bool[opt=false] opts.deflate offer permessage-deflate
-- @number[opt=10] opts.timeout seconds for the connect and the handshake
-- @param[opt] opts.tls a `netrun.tls.client` config (default: the system's CAs, the URL's host)
-- @tparam[opt] group opts.group where the channel lives (a loop may be given)
-- @treturn future of the channel, once the server accepted the handshake
function M.connect(opts)
  opts = check_connect(opts)
  local scheme, host, port, path, hostport = parse_url(opts.url)
  if not scheme then
    option_error("netrun.websocket.connect", "url", opts.url, "ws:// or wss://host[:port][/path]")
  end
  local key = core.ws.key()
  local lines = { "GET ", path, " HTTP/1.1\r\nHost: ", hostport,
    "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: ", key,
    "\r\nSec-WebSocket-Version: 13\r\n" }
  if opts.protocols then
    lines[#lines + 1] = "Sec-WebSocket-Protocol: " .. table.concat(opts.protocols, ", ") .. "\r\n"
  end
  if opts.deflate then
    lines[#lines + 1] = "Sec-WebSocket-Extensions: " .. core.ws.deflate_offer .. "\r\n"
  end
  for k, v in pairs(opts.headers or {}) do
    check_header(k, v)
    lines[#lines + 1] = k .. ": " .. v .. "\r\n"
  end
  lines[#lines + 1] = "\r\n"
  local codec = core.codec.websocket { client = true, request = table.concat(lines),
    accept = core.ws.accept(key), max_message = opts.max_message,
    max_frame = opts.max_frame, close_timeout = opts.close_timeout,
    frame_timeout = opts.frame_timeout, handshake_timeout = opts.timeout or 10,
    deflate = opts.deflate and true or false, inflate_ratio = opts.inflate_ratio }
  local netrun = require "netrun"
  local tls = opts.tls
  if scheme == "wss" and tls == nil then tls = netrun.tls.client {} end
  local done = netrun.promise()
  local init, url = opts.init, opts.url
  local copts = { group = opts.group, host = host, port = port, timeout = opts.timeout,
                  tls = tls }
  copts.init = function(ch)
    local p = ch:pipeline()
    local open = false
    p:add_last("websocket", codec)
    p:add_last("websocket_open", {
      channel_active = function(_, ctx)
        open = true
        done:try_success(ctx.channel)
        ctx:fire_channel_active()
      end,
      -- A failure before the 101 (a bad answer, TLS) is the future's to
      -- report, once: the handlers after this one never saw the channel
      -- active, and the tail would log it again at warn.
      exception_caught = function(_, ctx, err)
        done:try_failure(err)
        if open then ctx:fire_exception_caught(err) end
      end,
      channel_inactive = function(_, ctx)
        done:try_failure("netrun.websocket.connect: " .. url
          .. ": closed during the handshake")
        ctx:fire_channel_inactive()
      end,
    })
    if init then init(ch) end
  end
  netrun.connect(copts):add_listener(function(f)
    if not f:is_success() then done:try_failure(f:cause()) end
  end)
  return done
end

return M
