--- A NATS client (core NATS, and JetStream publish and API calls):
-- `netrun.nats`, loaded on first use. Its calls are nats.js's, in Lua's
-- conventions: network and server failures are `nil, err` (`"closed"`,
-- `"timeout"`, `"no responders"`, the server's `-ERR` text), programming
-- errors (a subject with a space, an unknown option) raise at the
-- caller's line.
--
-- A connection lives on the loop that made it (one per loop, as a
-- lua-resty-redis pool is per worker) and is used there. The calls that
-- wait (`connect`, `connection:request`, `connection:flush`,
-- `connection:drain`, `subscription:drain`, `jetstream:publish`,
-- `jetstream:api`) wait in a coroutine (`netrun.spawn`, a stream
-- server's, a subscription callback's) and return the value or
-- `nil, err`; called elsewhere on the loop (a handler, a timer) they
-- return a future, completed with the value or failed with the error. A
-- connection or subscription cannot be sent to another loop (the
-- transfer raises, naming it); a message is plain data and can.
--
-- Unless `reconnect = false`, a lost connection reconnects (to the same
-- server, or another of the URLs given and of the servers announced in
-- `connect_urls`), sends its subscriptions again, then what was published
-- meanwhile (held up to `buffer` bytes). The defaults of `connect`'s
-- options are the fields of `netrun.nats.defaults`. See
-- docs/guide/nats.md and docs/guide/limits.md.
-- @module netrun.nats
-- @usage
-- netrun.spawn(function()
--   local nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:4222" })
--   local sub = nc:subscribe("orders.*", function(msg)
--     if msg.reply then msg:respond("ok") end
--   end, { queue = "workers" })
--   nc:publish("orders.new", '{"id":1}')
--   local reply, err = nc:request("svc.price", "AAPL", { timeout = 2 })
--   nc:drain()
-- end)

-- netrun.nats: a NATS client (DESIGN.md §9.5), on a channel of netrun's
-- and the wire of runtime/bindings/lnats.c (which encodes publications,
-- holds outbound bytes and parses what the server sends, in C).
--
--   local nc, err = netrun.nats.connect { url = "nats://[user:pass@]h:4222" }
--   nc:publish(subject, data [, reply] [, headers])   --> true | nil, err
--   local sub = nc:subscribe(subject, function(msg) ... end
--                            [, { queue = name, max = n }])
--   local msg, err = nc:request(subject, data, { timeout = 5 })
--   nc:flush(); nc:drain(); nc:close()
--   local ack = nc:jetstream():publish(subject, data)  --> { stream, seq }
--
-- Where it runs. A connection lives on the loop that made it (in that
-- loop's Lua state: one connection per loop, as a pool of lua-resty-redis
-- is per worker) and is used there. Calls that wait -- connect, request,
-- flush, drain, sub:next, a JetStream publish -- wait in a coroutine
-- (netrun.spawn, a stream server's, a subscription callback's) and return
-- value or nil, err; called outside one (a handler, a timer) they return
-- a future instead, completed with the value or failed with err. Outside
-- a loop (the main thread) they raise.
--
-- Subscription callbacks run on that loop, in order, each subscription in
-- a coroutine of its own (made on its first message), so a callback may
-- wait (make a request, sleep, write to a stream). While it waits, later
-- messages queue, up to pending_msgs messages or pending_bytes bytes;
-- past either, messages are dropped and counted (sub:dropped()) and
-- on_error hears "slow consumer" once per episode, as nats.go and nats.js
-- do. A subscription without a callback is read with sub:next([timeout])
-- or `for msg in sub:messages() do`, under the same limits.
--
-- A message is { subject, data, reply, headers, status, description }
-- with msg:respond(data [, headers]). headers: { name = "value" } (a name
-- given more than once: { name = { "a", "b" } }); status and description
-- come from a status line ("NATS/1.0 503").
--
-- Connection loss: unless reconnect = false, the client reconnects to the
-- same server or another one of the pool (the URLs given, and the
-- connect_urls the server announces), waiting reconnect_wait (+ jitter)
-- between attempts on one server, up to max_reconnects failed attempts
-- per server; subscriptions are sent again, then what was published in
-- the meantime (held in the wire, up to `buffer` bytes; past it publish
-- returns nil, "reconnect buffer full"). A server that leaves
-- max_pings_out keepalive PINGs unanswered is taken for dead (the
-- connection is dropped and the client reconnects). Network failures are
-- nil, err; programming errors (a bad subject, an unknown option) raise.
local core = require "netrun.core"
local json = require "netrun.json"

local M = {
  version = "0.1.0",
  defaults = {
    timeout = 5,                  -- one connection attempt: TCP, INFO, TLS, CONNECT/PONG
    ping_interval = 120, max_pings_out = 2,
    reconnect = true, max_reconnects = 60, reconnect_wait = 2, reconnect_jitter = 0.1,
    buffer = 8 * 1024 * 1024,     -- outbound bytes held while not writing
    pending_msgs = 65536, pending_bytes = 64 * 1024 * 1024,   -- per subscription
    max_control_line = 64 * 1024, max_message = 64 * 1024 * 1024,
    request_timeout = 5, flush_timeout = 10, drain_timeout = 30,
    max_servers = 64,             -- the pool, discovered servers included
    echo = true, ignore_discovered = false, inbox_prefix = "_INBOX",
  },
}

local OPTION_KEYS = {
  url = true, servers = true, token = true, user = true, pass = true, tls = true,
  name = true, on_disconnect = true, on_reconnect = true, on_closed = true,
  on_error = true, options = true,
}
for k in pairs(M.defaults) do OPTION_KEYS[k] = true end

local concat, find, sub, format = table.concat, string.find, string.sub, string.format
local isyieldable, running = coroutine.isyieldable, coroutine.running
-- A coroutine that waits for the client (a request's reply, a
-- subscription's next message) parks without a promise (core.park; the
-- client wakes it with core.unpark, exactly once): a promise, its
-- listener and its registry reference cost more than the rest of a
-- request round trip.
local park, unpark = core.park, core.unpark

local Conn = {}
Conn.__index = Conn
local Sub = {}
Sub.__index = Sub
local Link = {}                  -- the handler of one TCP connection
Link.__index = Link
local JS = {}
JS.__index = JS
-- Messages keep their connection as a number (_c, a key of conns): a
-- message is plain data that may be copied to another loop (a spawn's
-- result, a task's argument), where msg:respond then says why it cannot.
-- The connection and subscription objects stay on their loop (a transfer
-- of one raises, naming it).
local Msg = {}
Msg.__index = Msg
Conn.__name = "netrun.nats.connection"
Sub.__name = "netrun.nats.subscription"
JS.__name = "netrun.nats.jetstream"
M.Conn, M.Sub, M.Msg = Conn, Sub, Msg
local conns = {}                 -- this state's open connections, by id
local next_conn = 0

--- A message, as a subscription's callback, `subscription:next` and
-- `connection:request` give it: a table
-- `{ subject, data, reply, headers, status, description }`. `data` is
-- the payload (a string, `""` for none); `reply` the reply subject, or
-- nil; `headers` `{ name = "value" }` (a name sent more than once:
-- `{ name = { "a", "b" } }`), names as sent, or nil; `status` and `description` come from a status line
-- (`NATS/1.0 503`), else nil. A message is plain data: it may be copied to
-- another loop, where `msg:respond` raises.
-- @type msg

--- Publish to the message's reply subject, as
-- `connection:publish(msg.reply, data, nil, headers)` on the connection
-- that received it.
-- @function msg:respond
-- @string[opt=""] data the payload
-- @tparam[opt] table headers `{ name = "value" | { "a", "b" } }`
-- @treturn[1] boolean true: sent, or held while reconnecting
-- @treturn[2] nil
-- @treturn[2] string `"the message has no reply subject"`, or `connection:publish`'s error
-- @raise when the message's connection is closed or on another loop
function Msg:respond(data, headers)
  if self.reply == nil then return nil, "the message has no reply subject" end
  local nc = conns[self._c]
  if nc == nil then
    error("netrun.nats: msg:respond: the message's connection is closed or on another loop", 2)
  end
  return nc:publish(self.reply, data, nil, headers)
end

--- @section end

-- ---- small helpers ------------------------------------------------------

local valid_subject = core.nats.valid_subject

local function check_subject(s, what, level)
  if not valid_subject(s) then
    error(format("netrun.nats: %s must be a non-empty string without spaces, tabs or " ..
      "line breaks, got %s", what, type(s) == "string" and format("%q", s) or type(s)), level + 1)
  end
end

local function check_seconds(v, what, level)
  if v ~= nil and (type(v) ~= "number" or v ~= v or v < 0) then
    error(format("netrun.nats: %s must be a number of seconds >= 0, got %s", what,
      tostring(v)), level + 1)
  end
end

local function check_count(v, what, level, allow_negative)
  if v ~= nil and (math.type(v) ~= "integer" or (v < 0 and not allow_negative)) then
    error(format("netrun.nats: %s must be an integer%s, got %s", what,
      allow_negative and "" or " >= 0", tostring(v)), level + 1)
  end
end

-- Wait for future p in a coroutine (value, or nil, err); elsewhere, p.
local function result(p)
  if not isyieldable() then return p end
  local ok, v = pcall(p.await, p)
  if ok then return v end
  return nil, v
end

-- Fail p with "<what> timeout" after `seconds` (0 or nil: never).
local function deadline(loop, p, seconds, what)
  if seconds and seconds > 0 then
    local t = loop:schedule(seconds, function() p:try_failure(what) end)
    p:add_listener(function() t:cancel() end)
  end
  return p
end

-- Call a user's event callback; a failure is logged, never propagated.
local function event(nc, name, ...)
  local fn = nc.opts[name]
  if fn then
    local ok, err = xpcall(fn, debug.traceback, nc, ...)
    if not ok then core.log(2, "netrun.nats: " .. name .. " failed: " .. tostring(err)) end
  end
end

local function report(nc, err, s)
  if nc.opts.on_error then
    event(nc, "on_error", err, s)
  else
    core.log(2, "netrun.nats: " .. tostring(err) ..
      (s and " (subscription " .. s.subject .. ")" or ""))
  end
end

-- 22 random characters: the inbox of a connection.
local ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
local function nuid()
  local f = io.open("/dev/urandom", "rb")
  local bytes = f and f:read(22)
  if f then f:close() end
  local out = {}
  for i = 1, 22 do
    local b = bytes and bytes:byte(i) or math.random(0, 255)
    local k = b % 62 + 1
    out[i] = sub(ALPHABET, k, k)
  end
  return concat(out)
end

-- ---- URLs and the server pool ---------------------------------------------

local function unescape(s)
  return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

-- "nats://user:pass@host:port", "tls://token@host", "host:port", "host".
local function parse_url(u, level)
  if type(u) ~= "string" or u == "" then
    error("netrun.nats: a server URL must be a non-empty string, got " .. tostring(u), level + 1)
  end
  local scheme, rest = u:match("^(%a[%w+.-]*)://(.*)$")
  scheme, rest = scheme and scheme:lower() or "nats", rest or u
  if scheme ~= "nats" and scheme ~= "tls" then
    error("netrun.nats: URL " .. u .. ": the scheme must be nats:// or tls://", level + 1)
  end
  local auth, hostport = rest:match("^(.*)@([^@]*)$")
  hostport = (hostport or rest):gsub("/.*$", "")
  local host, port
  if hostport:sub(1, 1) == "[" then
    host, port = hostport:match("^%[([^%]]+)%]:?(%d*)$")
  else
    host, port = hostport:match("^([^:]+):?(%d*)$")
  end
  port = port ~= "" and tonumber(port) or 4222
  if not host or port < 1 or port > 65535 then
    error("netrun.nats: URL " .. u .. ": expected host[:port]", level + 1)
  end
  local s = { host = host, port = math.tointeger(port), tls = scheme == "tls", failures = 0,
              last_attempt = -math.huge }
  if auth then
    local user, pass = auth:match("^([^:]*):(.*)$")
    if user then
      s.user, s.pass = unescape(user), unescape(pass)
    else
      s.token = unescape(auth)
    end
  end
  s.key = host .. ":" .. s.port
  return s
end

local function add_server(nc, s)
  for _, have in ipairs(nc.pool) do
    if have.key == s.key then return end
  end
  if #nc.pool < nc.opts.max_servers then nc.pool[#nc.pool + 1] = s end
end

-- The server announced connect_urls ("host:port"): join the pool.
local function discover(nc, urls)
  if nc.opts.ignore_discovered or type(urls) ~= "table" then return end
  for i = 1, math.min(#urls, nc.opts.max_servers) do
    local u = urls[i]
    if type(u) == "string" and #u < 300 then
      local ok, s = pcall(parse_url, u, 1)
      if ok then
        s.tls = nc.pool[1] and nc.pool[1].tls
        s.discovered = true
        add_server(nc, s)
      end
    end
  end
end

-- ---- options ---------------------------------------------------------------

local function read_options(opts, level)
  if type(opts) == "string" then opts = { url = opts } end
  if type(opts) ~= "table" then
    error("netrun.nats.connect: options must be a table, got " .. type(opts), level + 1)
  end
  local o = {}
  for k, v in pairs(opts) do
    if not OPTION_KEYS[k] then
      error("netrun.nats.connect: unknown option '" .. tostring(k) .. "'", level + 1)
    end
    o[k] = v
  end
  for k, v in pairs(M.defaults) do
    if o[k] == nil then o[k] = v end
  end
  for _, k in ipairs { "timeout", "ping_interval", "reconnect_wait", "reconnect_jitter",
                       "request_timeout", "flush_timeout", "drain_timeout" } do
    check_seconds(o[k], k, level + 1)
  end
  for _, k in ipairs { "max_pings_out", "buffer", "pending_msgs", "pending_bytes",
                       "max_control_line", "max_message", "max_servers" } do
    check_count(o[k], k, level + 1)
  end
  check_count(o.max_reconnects, "max_reconnects", level + 1, true)
  for _, k in ipairs { "on_disconnect", "on_reconnect", "on_closed", "on_error" } do
    if o[k] ~= nil and type(o[k]) ~= "function" then
      error("netrun.nats.connect: " .. k .. " must be a function, got " .. type(o[k]), level + 1)
    end
  end
  for _, k in ipairs { "token", "user", "pass", "name" } do
    if o[k] ~= nil and type(o[k]) ~= "string" then
      error("netrun.nats.connect: " .. k .. " must be a string, got " .. type(o[k]), level + 1)
    end
  end
  if o.options ~= nil and type(o.options) ~= "table" then
    error("netrun.nats.connect: options must be a table of channel options, got " ..
      type(o.options), level + 1)
  end
  if o.tls ~= nil and o.tls ~= true and o.tls ~= false and
     not (type(o.tls) == "userdata" and tostring(o.tls):match("^netrun%.tls%.client")) then
    error("netrun.nats.connect: tls must be true, false or a netrun.tls.client config, got " ..
      tostring(o.tls), level + 1)
  end
  local urls = {}
  if o.url ~= nil then
    if type(o.url) ~= "string" then
      error("netrun.nats.connect: url must be a string, got " .. type(o.url), level + 1)
    end
    for u in o.url:gmatch("[^,%s]+") do urls[#urls + 1] = u end
  end
  if o.servers ~= nil then
    if type(o.servers) ~= "table" then
      error("netrun.nats.connect: servers must be an array of URLs, got " .. type(o.servers),
        level + 1)
    end
    for _, u in ipairs(o.servers) do urls[#urls + 1] = u end
  end
  if #urls == 0 then urls[1] = "nats://127.0.0.1:4222" end
  local pool = {}
  for _, u in ipairs(urls) do pool[#pool + 1] = parse_url(u, level + 1) end
  return o, pool
end

-- ---- headers and messages --------------------------------------------------

local function check_header_text(s, what)
  if type(s) ~= "string" or find(s, "[\r\n]") then
    error("netrun.nats: header " .. what .. " must be a string without line breaks, got " ..
      (type(s) == "string" and format("%q", s) or type(s)), 4)
  end
end

-- { name = value | { values } } --> "NATS/1.0\r\nname: value\r\n...\r\n"
local function encode_headers(h)
  local names = {}
  for k in pairs(h) do
    check_header_text(k, "names")
    if k == "" or find(k, "[:%s]") then
      error("netrun.nats: header name " .. format("%q", k) ..
        " must be non-empty, without ':' or spaces", 4)
    end
    names[#names + 1] = k
  end
  table.sort(names)
  local out = { "NATS/1.0\r\n" }
  for _, k in ipairs(names) do
    local v = h[k]
    if type(v) == "table" then
      for _, one in ipairs(v) do
        check_header_text(one, "values")
        out[#out + 1] = k .. ": " .. one .. "\r\n"
      end
    else
      if type(v) == "number" then v = tostring(v) end
      check_header_text(v, "values")
      out[#out + 1] = k .. ": " .. v .. "\r\n"
    end
  end
  out[#out + 1] = "\r\n"
  return concat(out)
end

-- "NATS/1.0[ code[ description]]\r\n(name: value\r\n)*\r\n" into msg.
local function decode_headers(msg, hdr)
  local first, rest = hdr:match("^(NATS/1%.0[^\r\n]*)\r\n(.*)$")
  if not first then return false end
  local code, desc = first:match("^NATS/1%.0[ \t]+(%d%d%d)[ \t]*(.-)%s*$")
  if code then
    msg.status = math.tointeger(tonumber(code))
    if desc ~= "" then msg.description = desc end
  end
  local h
  for line in rest:gmatch("([^\r\n]*)\r\n") do
    local k, v = line:match("^([^:]+):[ \t]*(.-)[ \t]*$")
    if k then
      h = h or {}
      local have = h[k]
      if have == nil then
        h[k] = v
      elseif type(have) == "table" then
        have[#have + 1] = v
      else
        h[k] = { have, v }
      end
    end
  end
  msg.headers = h
  return true
end

-- ---- the connection's handler ------------------------------------------------

local links = {}                 -- id -> link, until its channel's init adopts it
local next_link = 0

-- A channel's init (run on this loop, copied like any init): the link
-- becomes its handler.
function M._adopt(ch, id)
  local link = links[id]
  links[id] = nil
  if link == nil or link.dead then
    ch:close()
    return
  end
  link.ch = ch
  ch:pipeline():add_last("nats", link)
end

-- Give up on a link's server (stale, broken, hostile): reset the
-- connection at once -- a graceful close would wait for the server to
-- read what is queued -- and remember why (channel_inactive reports it).
local function drop(link, err)
  link.err = link.err or err
  if link.ch then core.nats.abort(link.ch) end
end

function Link:channel_read(ctx, data)
  local nc = self.nc
  if nc.link ~= self then return end
  local err = nc.w:feed(data)
  if err and nc.link == self then drop(self, err) end
  if nc.woken[1] then nc:_deliver() end
end

function Link:channel_writability_changed(ctx)
  local nc = self.nc
  if nc.link == self and ctx.channel:is_writable() then
    nc.w:flush()
    local p = nc.writable
    if p then
      nc.writable = nil
      p:try_success(true)
    end
  end
end

function Link:channel_inactive(ctx)
  self.nc:_lost(self, self.err or "connection closed")
end

function Link:exception_caught(ctx, err)
  drop(self, tostring(err))
end

-- ---- connecting ----------------------------------------------------------------

-- Start a connection attempt to server s.
local function attempt(nc, s)
  next_link = next_link + 1
  local id = next_link
  local link = setmetatable({ nc = nc, server = s, phase = "info" }, Link)
  nc.link = link
  s.last_attempt = core.now()
  nc.w:detach()
  nc.w:reset()
  links[id] = link
  local timeout = nc.opts.timeout > 0 and nc.opts.timeout or nil    -- 0: none
  if timeout then
    link.timer = nc.loop:schedule(timeout, function()
      if link.phase ~= "up" then nc:_failed(link, "timeout") end
    end)
  end
  require("netrun").connect {
    group = nc.loop, host = s.host, port = s.port, timeout = timeout, options = nc.opts.options,
    init = function(ch) require("netrun.nats")._adopt(ch, id) end,
  }:add_listener(function(f)
    if not f:is_success() then
      links[id] = nil
      nc:_failed(link, (tostring(f:cause()):gsub("^netrun%.connect: ", "")))
    end
  end)
end

-- The next server to try and how long to wait before trying it: the
-- first in pool order (the one just lost goes last) whose last attempt
-- was reconnect_wait ago; servers past max_reconnects failures leave.
local function next_server(nc)
  local o = nc.opts
  local pool, keep = nc.pool, {}
  for _, s in ipairs(pool) do
    if o.max_reconnects < 0 or s.failures <= o.max_reconnects then keep[#keep + 1] = s end
  end
  nc.pool = keep
  if #keep == 0 then return nil end
  local now, best, wait = core.now(), nil, math.huge
  for _, s in ipairs(keep) do
    local w = s.last_attempt + o.reconnect_wait - now
    if w <= 0 then return s, 0 end
    if w < wait then best, wait = s, w end
  end
  return best, wait + math.random() * o.reconnect_jitter
end

function Conn:_reconnect()
  if self.state == "closed" then return end
  local s, wait = next_server(self)
  if s == nil then
    return self:_close("no server left to reconnect to (max_reconnects); the last error: " ..
      tostring(self.last_error))
  end
  if wait <= 0 then return attempt(self, s) end
  self.retry = self.loop:schedule(wait, function()
    self.retry = nil
    if self.state ~= "closed" then attempt(self, s) end
  end)
end

-- An attempt failed (before the handshake completed).
function Conn:_failed(link, err)
  if link.dead then return end
  link.dead = true
  if link.timer then link.timer:cancel() end
  drop(link, err)
  if self.link ~= link or self.state == "closed" then return end
  self.link = nil
  link.server.failures = link.server.failures + 1
  self.last_error = err
  if self.state == "connecting" then
    -- the first connect tries each server of the pool once
    self.tried = (self.tried or 0) + 1
    local s = self.pool[self.tried + 1]
    if s then return attempt(self, s) end
    local p = self.connecting
    self.connecting = nil
    self:_close(err)
    if p then p:try_failure(err) end
    return
  end
  self:_reconnect()
end

-- A live connection was lost.
function Conn:_lost(link, err)
  if link.phase ~= "up" then return self:_failed(link, err) end
  if link.dead then return end
  link.dead = true
  if link.keepalive then link.keepalive:cancel() end
  if self.link ~= link or self.state == "closed" then return end
  self.link = nil
  self.w:detach()
  self.last_error = err
  -- keepalive PINGs die with the connection; flushes are asked again
  local keep = {}
  for _, p in ipairs(self.pongs) do
    if p and not p:is_done() then keep[#keep + 1] = p end
  end
  self.pongs = keep
  local p = self.writable
  if p then self.writable = nil; p:try_success(false) end
  if not self.opts.reconnect or self.state == "draining" then
    return self:_close(err)
  end
  self.state = "reconnecting"
  event(self, "on_disconnect", err)
  -- the server just lost goes to the end of the pool
  for i, s in ipairs(self.pool) do
    if s == link.server then
      table.remove(self.pool, i)
      self.pool[#self.pool + 1] = s
      break
    end
  end
  self:_reconnect()
end

local function connect_json(nc, link)
  local o, s = nc.opts, link.server
  local c = {
    verbose = false, pedantic = false, tls_required = link.tls or false,
    lang = "lua", version = M.version, protocol = 1, echo = o.echo,
    headers = true, no_responders = true, name = o.name,
    user = s.user or o.user, pass = s.pass or o.pass,
    auth_token = s.token or o.token,
  }
  return json.encode(c)
end

local function send_connect(nc, link)
  if link.dead then return end
  link.phase = "ping"
  link.ch:write_and_flush("CONNECT " .. connect_json(nc, link) .. "\r\nPING\r\n")
end

-- The first INFO: upgrade to TLS if either side wants it, then CONNECT.
local function start_session(nc, link, info)
  local o, s = nc.opts, link.server
  local want = o.tls == true or type(o.tls) == "userdata" or s.tls or info.tls_required
  if o.tls == false and info.tls_required then
    return nc:_failed(link, "the server requires TLS (tls = false)")
  end
  if not want then return send_connect(nc, link) end
  local netrun = require "netrun"
  local cfg = type(o.tls) == "userdata" and o.tls or nc.default_tls
  if cfg == nil then
    cfg = netrun.tls.client {}
    nc.default_tls = cfg
  end
  link.tls = true
  link.phase = "tls"
  local ch = link.ch
  ch:pipeline():add_first("tls", cfg)
  core.tls.set_host(ch, "tls", s.host)
  core.tls.handshake(ch):add_listener(function(f)
    if link.dead then return end
    if f:is_success() then
      send_connect(nc, link)
    else
      nc:_failed(link, "TLS: " .. tostring(f:cause()))
    end
  end)
end

function Conn:_info(link, text)
  local ok, info = pcall(json.decode, text)
  if not ok or type(info) ~= "table" then
    return drop(link, "NATS protocol error: INFO is not a JSON object")
  end
  self.info = info
  local mp = math.tointeger(info.max_payload)
  if mp and mp > 0 then
    self.max_payload = math.min(mp, self.opts.max_message)
    self.w:set_max_payload(self.max_payload)
  end
  discover(self, info.connect_urls)
  if link.phase == "info" then start_session(self, link, info) end
end

-- The handshake's PONG: the connection is up.
function Conn:_up(link)
  link.phase = "up"
  if link.timer then link.timer:cancel() end
  link.server.failures = 0
  local w, ch = self.w, link.ch
  -- subscriptions first, in the order they were made, then what was
  -- published meanwhile (held in the wire), then the flushes' PINGs
  local sids, lines = {}, {}
  for sid in pairs(self.subs) do sids[#sids + 1] = sid end
  table.sort(sids)
  for _, sid in ipairs(sids) do lines[#lines + 1] = self.subs[sid]:_sub_line() end
  if lines[1] then ch:write(concat(lines)) end
  w:attach(ch)
  for _ = 1, #self.pongs do w:send("PING\r\n") end
  self.pings_out = 0
  local interval = self.opts.ping_interval
  if interval > 0 then
    link.keepalive = self.loop:schedule_at_fixed_rate(interval, interval, function()
      self:_keepalive(link)
    end)
  end
  local was = self.state
  self.state = "connected"
  if was == "connecting" then
    local p = self.connecting
    self.connecting = nil
    p:try_success(self)
  elseif was == "reconnecting" then
    self.reconnects = self.reconnects + 1
    event(self, "on_reconnect")
  end
end

function Conn:_keepalive(link)
  if self.link ~= link or link.dead then return end
  if self.pings_out >= self.opts.max_pings_out then
    return drop(link, "stale connection (no PONG to " .. self.pings_out .. " PINGs)")
  end
  self.pings_out = self.pings_out + 1
  self.pongs[#self.pongs + 1] = false
  self.w:send("PING\r\n")
end

-- PING, PONG, +OK, -ERR and INFO, for the current link.
function Conn:_ctl(kind, text)
  local link = self.link
  if link == nil then return end
  if kind == "PING" then
    if link.phase ~= "up" then return link.ch:write_and_flush("PONG\r\n") end
    if not self.w:send("PONG\r\n", true) then
      drop(link, "the server sends PINGs and reads nothing (buffer full)")
    end
  elseif kind == "PONG" then
    if link.phase == "ping" then return self:_up(link) end
    self.pings_out = 0
    if self.woken[1] then self:_deliver() end
    local p = table.remove(self.pongs, 1)
    if p then p:try_success(true) end
  elseif kind == "INFO" then
    self:_info(link, text)
  elseif kind == "ERR" then
    local lower = text:lower()
    if link.phase ~= "up" then
      link.err = text
      return self:_failed(link, text)
    end
    if find(lower, "^permissions violation") or find(lower, "^invalid subject") then
      return report(self, text)
    end
    -- anything else ends the connection (the server closes it too)
    report(self, text)
    drop(link, text)
  end
end

--- Connect to a NATS server: TCP, its INFO, TLS if either side wants it,
-- CONNECT (verbose and pedantic off, headers and no_responders on) and a
-- PING/PONG. The first connect tries each server of the pool once, in
-- order, and fails with the last one's error; a connection made
-- reconnects by itself (see the reconnect options). Call it on a loop:
-- in a coroutine it waits; elsewhere on the loop it returns a future of
-- the connection.
-- @tparam table|string opts the options, or a URL alone
-- @string[opt="nats://127.0.0.1:4222"] opts.url `nats://[user:pass@]host[:port]`, `nats://token@host`, `tls://host[:port]`; several separated by commas
-- @tparam[opt] {string,...} opts.servers more URLs, after `url`'s
-- @string[opt] opts.token an authentication token (a URL's own wins)
-- @string[opt] opts.user a user name (a URL's own wins)
-- @string[opt] opts.pass its password
-- @string[opt] opts.name the connection's name, sent in CONNECT
-- @param[opt] opts.tls `true` (the system's CAs), a `netrun.tls.client` config, or `false` (refuse a server whose INFO requires TLS); `tls://` and a server requiring it upgrade too
-- @tparam[opt] table opts.options the channel's options (`sndbuf`, `tcp_nodelay`, ...)
-- @number[opt=5] opts.timeout seconds for one connection attempt, TCP to the handshake's PONG (0: none)
-- @bool[opt=true] opts.reconnect reconnect after a connection is lost
-- @int[opt=60] opts.max_reconnects failed attempts per server before it leaves the pool (-1: never); when none is left, the connection closes
-- @number[opt=2] opts.reconnect_wait seconds between attempts on one server
-- @number[opt=0.1] opts.reconnect_jitter up to this many seconds more, at random
-- @number[opt=120] opts.ping_interval seconds between keepalive PINGs (0: none)
-- @int[opt=2] opts.max_pings_out PINGs left unanswered before the server is taken for dead (dropped, reconnected)
-- @int[opt=8388608] opts.buffer bytes of publications held while not writing (reconnecting, the server not reading)
-- @int[opt=65536] opts.pending_msgs messages queued per subscription before more are dropped (slow consumer)
-- @int[opt=67108864] opts.pending_bytes bytes queued per subscription likewise
-- @int[opt=65536] opts.max_control_line the longest control line (`INFO`, `MSG ...`) taken from the server
-- @int[opt=67108864] opts.max_message the largest message (headers and payload) taken from the server
-- @number[opt=5] opts.request_timeout `connection:request`'s default timeout, seconds
-- @number[opt=10] opts.flush_timeout `connection:flush`'s default timeout, and how long a publication waits for a full buffer in a coroutine
-- @number[opt=30] opts.drain_timeout `connection:drain`'s and `subscription:drain`'s default timeout
-- @int[opt=64] opts.max_servers servers kept in the pool, announced ones included
-- @bool[opt=false] opts.ignore_discovered keep out the servers announced in `connect_urls`
-- @bool[opt=true] opts.echo receive this connection's own publications on its subscriptions
-- @string[opt="_INBOX"] opts.inbox_prefix the prefix of the requests' reply subjects
-- @tparam[opt] function opts.on_disconnect `(nc, err)`: the connection was lost, reconnecting
-- @tparam[opt] function opts.on_reconnect `(nc)`: connected again
-- @tparam[opt] function opts.on_closed `(nc, err)`: closed for good (`err` nil after `connection:close` or `connection:drain`)
-- @tparam[opt] function opts.on_error `(nc, err, sub)`: a permissions violation, a slow consumer, a callback that raised (without it, they are logged)
-- @treturn[1] connection
-- @treturn[2] nil
-- @treturn[2] string why the last attempt failed: `"timeout"`, the connect's error, `"TLS: ..."`, the server's `-ERR` text (`"Authorization Violation"`)
-- @raise on the main thread (not a loop), and on a bad option or URL
-- @usage local nc, err = netrun.nats.connect { servers = { "nats://a:4222", "nats://b:4222" }, name = "api" }
function M.connect(opts)
  local loop = core.current()
  if loop == nil then
    error("netrun.nats.connect: a connection lives on a loop: call it on one (in " ..
      "netrun.spawn, a handler, a loop's task); the main thread is not one", 2)
  end
  local o, pool = read_options(opts, 2)
  local nc = setmetatable({
    opts = o, pool = pool, loop = loop, state = "connecting",
    subs = {}, next_sid = 1, woken = {}, pongs = {}, pings_out = 0,
    requests = {}, next_token = 0, reconnects = 0,
    max_payload = 1024 * 1024, closed_p = core.promise(),
  }, Conn)
  next_conn = next_conn + 1
  nc.id = next_conn
  conns[next_conn] = nc
  nc.w = core.nats.wire(function(sid, subject, reply, data, hdr)
                          return nc:_msg(sid, subject, reply, data, hdr)
                        end,
                        function(kind, text) return nc:_ctl(kind, text) end,
                        { buffer = math.max(o.buffer, 1), max_control_line = o.max_control_line,
                          max_message = o.max_message })
  -- nc.publish is C (the wire's publisher): the fast path of the call
  -- users make most, with the Lua function below for headers and failures.
  nc.publish = core.nats.publisher(nc.w, Conn._publish_slow)
  nc.connecting = core.promise()
  attempt(nc, pool[1])
  return result(nc.connecting)
end

-- ---- publishing ------------------------------------------------------------------

--- A connection to a NATS server (or a pool of them), made by `connect`.
-- It stays on its loop; its calls that wait run in a coroutine there, or
-- return a future elsewhere on it.
-- @type connection

--- Publish a message. Without headers, the publication is encoded in C
-- and written when the loop's iteration ends, with the others made in it
-- (sooner when many bytes accumulate). While reconnecting it is held (up to `buffer` bytes) and sent
-- once connected again. When the server does not read and the buffer is
-- full, a coroutine waits (up to `flush_timeout`) for it to read; other
-- callers get an error at once. (A field of each connection, made by
-- `connect`, not a method of the class.)
-- @function connection:publish
-- @string subject the subject
-- @string[opt=""] data the payload
-- @string[opt] reply a reply subject for the receivers
-- @tparam[opt] table headers `{ name = "value" | { "a", "b" } }`: names without `:` or spaces, no line breaks
-- @treturn[1] boolean true: written, or held to be
-- @treturn[2] nil
-- @treturn[2] string `"closed"`, `"maximum payload exceeded (the server takes N bytes)"` (headers count), `"reconnect buffer full"`, `"write buffer full (the server does not read)"`, `"write buffer full (timeout)"`
-- @raise on a subject or reply subject that is empty or has spaces, tabs or line breaks, on bad headers
-- @usage nc:publish("orders.new", json, nil, { ["Trace-Id"] = id })

-- Publications with headers, and those the wire refused (why: "closed",
-- "max_payload" or "full").
function Conn._publish_slow(nc, subject, data, reply, headers, why)
  if why == nil then
    check_subject(subject, "the subject", 3)
    if reply ~= nil then check_subject(reply, "the reply subject", 3) end
    if type(headers) ~= "table" then
      error("netrun.nats: publish: headers must be a table, got " .. type(headers), 3)
    end
    local ok
    ok, why = nc.w:pub(subject, data, reply, encode_headers(headers))
    if ok then return true end
  end
  if why == "closed" then return nil, "closed" end
  if why == "max_payload" then
    return nil, "maximum payload exceeded (the server takes " .. nc.max_payload .. " bytes)"
  end
  if nc.state ~= "connected" then return nil, "reconnect buffer full" end
  if not isyieldable() then return nil, "write buffer full (the server does not read)" end
  -- In a coroutine: wait until the channel takes writes again, then retry.
  local deadline_at = core.now() + nc.opts.flush_timeout
  while true do
    local p = nc.writable or core.promise()
    nc.writable = p
    local left = deadline_at - core.now()
    if left <= 0 then return nil, "write buffer full (timeout)" end
    local t = nc.loop:schedule(left, function() p:try_success(false) end)
    p:await()
    t:cancel()
    local ok
    if headers ~= nil then
      ok, why = nc.w:pub(subject, data, reply, encode_headers(headers))
    else
      ok, why = nc.w:pub(subject, data, reply)
    end
    if ok then return true end
    if why ~= "full" or nc.state ~= "connected" then
      return Conn._publish_slow(nc, subject, data, reply, headers, why)
    end
  end
end

-- ---- subscriptions ---------------------------------------------------------------

local function sub_options(opts)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    error("netrun.nats: subscribe: options must be a table, got " .. type(opts), 3)
  end
  for k in pairs(opts) do
    if k ~= "queue" and k ~= "max" and k ~= "pending_msgs" and k ~= "pending_bytes" then
      error("netrun.nats: subscribe: unknown option '" .. tostring(k) .. "'", 3)
    end
  end
  if opts.queue ~= nil then check_subject(opts.queue, "queue", 3) end
  check_count(opts.max, "max", 3)
  check_count(opts.pending_msgs, "pending_msgs", 3)
  check_count(opts.pending_bytes, "pending_bytes", 3)
  return opts
end

--- Subscribe to a subject (wildcards `*` and `>` as NATS has them). The
-- SUB is sent at once (while reconnecting: once connected, and again
-- after every reconnect); nothing waits for the server. With a callback,
-- `fn(msg)` runs on this loop for each message, in order, in a coroutine
-- of the subscription's own (made on its first message), so it may wait
-- (make a request, sleep); meanwhile later messages queue, up to
-- `pending_msgs` messages or `pending_bytes` bytes, past which they are
-- dropped and counted (`subscription:dropped`) and `on_error` hears
-- `"slow consumer: messages dropped"` once per episode. A callback that
-- raises is reported to `on_error`
-- (`"subscription callback failed: ..."`) and the next message comes. Without a callback, read the
-- messages with `subscription:next` or `subscription:messages`.
-- @function connection:subscribe
-- @string subject the subject
-- @tparam[opt] function fn `fn(msg)`, given each `msg`
-- @tparam[opt] table opts (may come second, without `fn`)
-- @string[opt] opts.queue a queue group: each message goes to one member of the group
-- @int[opt] opts.max unsubscribe after this many messages (the server is told too)
-- @int[opt] opts.pending_msgs this subscription's own `pending_msgs`
-- @int[opt] opts.pending_bytes this subscription's own `pending_bytes`
-- @treturn[1] subscription
-- @treturn[2] nil
-- @treturn[2] string `"closed"`, or `"draining"` (during `connection:drain`)
-- @raise on a bad subject, callback, queue name or option
-- @usage local sub = nc:subscribe("orders.*", function(msg) print(msg.subject, msg.data) end,
--   { queue = "workers" })
function Conn:subscribe(subject, fn, opts)
  check_subject(subject, "the subject", 2)
  if type(fn) == "table" and opts == nil then fn, opts = nil, fn end
  if fn ~= nil and type(fn) ~= "function" then
    error("netrun.nats: subscribe: the callback must be a function, got " .. type(fn), 2)
  end
  opts = sub_options(opts)
  if self.state == "closed" then return nil, "closed" end
  if self.state == "draining" then return nil, "draining" end
  local sid = self.next_sid
  self.next_sid = sid + 1
  local s = setmetatable({
    nc = self, sid = sid, subject = subject, queue = opts.queue, fn = fn, max = opts.max,
    received = 0, q = {}, head = 1, tail = 0, bytes = 0, dropped_n = 0,
    pending_msgs = opts.pending_msgs or self.opts.pending_msgs,
    pending_bytes = opts.pending_bytes or self.opts.pending_bytes,
  }, Sub)
  self.subs[sid] = s
  if self.state == "connected" then self.w:send(s:_sub_line()) end
  return s
end

function Sub:_sub_line()
  local line = "SUB " .. self.subject .. (self.queue and " " .. self.queue or "") ..
    " " .. self.sid .. "\r\n"
  if self.max then
    line = line .. "UNSUB " .. self.sid .. " " .. math.max(self.max - self.received, 1) .. "\r\n"
  end
  return line
end

-- A message for subscription sid (the wire's on_msg).
function Conn:_msg(sid, subject, reply, data, hdr)
  local s = self.subs[sid]
  if s == nil then return end
  if s == self.inbox then return self:_response(subject, reply, data, hdr) end
  local n = s.received + 1
  s.received = n
  local max = s.max
  if max and n > max then return end
  local m = setmetatable({ subject = subject, data = data, reply = reply, _c = self.id }, Msg)
  if hdr and not decode_headers(m, hdr) then
    report(self, "NATS: a message with a malformed header block was dropped", s)
    return
  end
  local tail = s.tail
  if tail - s.head + 1 >= s.pending_msgs or s.bytes + #data > s.pending_bytes then
    if s.idle or s.waiter or (s.fn and not s.running) then
      self:_wake(s)              -- its reader is not busy: let it catch up
      tail = s.tail
    end
    if tail - s.head + 1 >= s.pending_msgs or s.bytes + #data > s.pending_bytes then
      s.dropped_n = s.dropped_n + 1
      if not s.slow then
        s.slow = true
        report(self, "slow consumer: messages dropped", s)
      end
      return
    end
  end
  tail = tail + 1
  s.q[tail] = m
  s.tail = tail
  s.bytes = s.bytes + #data
  if not s.marked then
    s.marked = true
    local w = self.woken
    w[#w + 1] = s
  end
  if max and n == max then
    self.subs[sid] = nil          -- the server unsubscribed it too
    s.done = true
  end
end

-- Run a subscription's callback on its queued messages, in its coroutine.
local function worker(s)
  local fn, q = s.fn, s.q
  s.co = running()
  while true do
    while s.head <= s.tail do
      local h = s.head
      local m = q[h]
      q[h] = nil
      s.head = h + 1
      s.bytes = s.bytes - #m.data
      local ok, err = xpcall(fn, debug.traceback, m)
      if not ok then report(s.nc, "subscription callback failed: " .. tostring(err), s) end
    end
    s.head, s.tail, s.slow = 1, 0, false
    if s.done then break end
    s.idle = true
    park()                            -- until _wake
  end
  s.running, s.co = false, nil
  if s.drained then s.drained:try_success(true) end
end

-- Run the callbacks (or wake the readers) of the subscriptions that got
-- messages in this read: at its end, or before a PONG or a reply that
-- came after those messages completes a flush or a request (what was
-- received before a flush's PONG has been handed over when it returns).
function Conn:_deliver()
  local woken = self.woken
  self.woken = {}
  for i = 1, #woken do
    woken[i].marked = false
    self:_wake(woken[i])
  end
end

-- Messages arrived for s (or it ended): run its callback, or wake its reader.
function Conn:_wake(s)
  if s.idle then
    s.idle = false
    unpark(s.co)
  elseif s.waiter then
    local co = s.waiter
    s.waiter = nil
    unpark(co, true)
  elseif s.fn and not s.running then
    s.running = true
    core.spawn(worker, s)
  end
end

-- Stop delivering; with keep, the queued messages are still delivered.
function Sub:_finish(keep)
  local nc = self.nc
  if nc.subs[self.sid] == self then nc.subs[self.sid] = nil end
  self.done = true
  if not keep then
    for i = self.head, self.tail do self.q[i] = nil end
    self.head, self.tail, self.bytes = 1, 0, 0
  end
  if self.fn and (self.running or self.head <= self.tail) then
    nc:_wake(self)
  else
    if self.waiter then nc:_wake(self) end
    if self.drained then self.drained:try_success(true) end
  end
end

--- @section end

--- A subscription, made by `connection:subscribe`. It stays on its
-- connection's loop.
-- @type subscription

--- Unsubscribe: at once, or after `max` messages in all (those received
-- so far count). At once, the messages still queued are dropped and a
-- `subscription:next` waiting returns `nil, "closed"`; a callback
-- running finishes its message. A call on a subscription already ended
-- does nothing.
-- @function subscription:unsubscribe
-- @int[opt] max the messages to take in all before it ends (not more than received: at once)
-- @treturn boolean true
-- @raise on a `max` that is not an integer >= 0
function Sub:unsubscribe(max)
  check_count(max, "max", 2)
  local nc = self.nc
  if self.done then return true end
  if max and max > self.received then
    self.max = max
    if nc.state == "connected" then nc.w:send("UNSUB " .. self.sid .. " " .. max .. "\r\n") end
    return true
  end
  if nc.state == "connected" then nc.w:send("UNSUB " .. self.sid .. "\r\n") end
  self:_finish(false)
  return true
end

-- The future of a drain: unsubscribe, deliver what the server sent
-- before it took the UNSUB (a PING's round trip tells), then complete.
function Sub:_drain(timeout)
  local nc = self.nc
  if self.drained then return self.drained end
  self.drained = core.promise()
  if self.done then
    if not self.running then self.drained:try_success(true) end
    return self.drained
  end
  if nc.state == "connected" or nc.state == "draining" then
    nc.w:send("UNSUB " .. self.sid .. "\r\n")
  end
  nc:_flush_future(timeout):add_listener(function() self:_finish(true) end)
  return deadline(nc.loop, self.drained, timeout, "drain timeout")
end

--- Drain: unsubscribe, then deliver what the server sent before it
-- took the UNSUB (a PING's round trip tells) and what is queued: with a
-- callback, the drain completes once the callback has run on all of it;
-- without one, the queued messages are left for `subscription:next`. In a
-- coroutine it waits; elsewhere on the loop it returns a future.
-- @function subscription:drain
-- @number[opt=drain_timeout] timeout seconds (0: none)
-- @treturn[1] boolean true
-- @treturn[2] nil
-- @treturn[2] string `"drain timeout"`
-- @raise on a timeout that is not a number >= 0
function Sub:drain(timeout)
  check_seconds(timeout, "timeout", 2)
  return result(self:_drain(timeout or self.nc.opts.drain_timeout))
end

--- The next message of a subscription without a callback, waiting for
-- it (in a coroutine) if none is queued.
-- @function subscription:next
-- @number[opt] timeout seconds (none: wait until a message comes or it ends)
-- @treturn[1] msg the message
-- @treturn[2] nil
-- @treturn[2] string `"timeout"`, `"closed"` (unsubscribed, or the connection closed, and nothing left queued) or `"busy"` (another coroutine waits on it)
-- @raise outside a coroutine, on a subscription with a callback, on a bad timeout
function Sub:next(timeout)
  check_seconds(timeout, "timeout", 2)
  if self.fn then error("netrun.nats: sub:next: this subscription has a callback", 2) end
  if not isyieldable() then
    error("netrun.nats: sub:next waits, so it must run inside netrun.spawn", 2)
  end
  if self.waiter then return nil, "busy" end
  local stop = timeout and core.now() + timeout
  while self.head > self.tail do
    if self.done then return nil, "closed" end
    local co, t = running(), nil
    self.waiter = co
    if stop then
      t = self.nc.loop:schedule(math.max(stop - core.now(), 0), function()
        if self.waiter == co then
          self.waiter = nil
          unpark(co, false)
        end
      end)
    end
    local woke = park()
    if t then t:cancel() end
    if not woke then return nil, "timeout" end
  end
  local h = self.head
  local m = self.q[h]
  self.q[h] = nil
  self.head = h + 1
  self.bytes = self.bytes - #m.data
  if self.head > self.tail then self.head, self.tail, self.slow = 1, 0, false end
  return m
end

--- An iterator of the messages (`subscription:next` without a timeout),
-- which ends when the subscription does (unsubscribed, or the connection
-- closed). In a coroutine.
-- @function subscription:messages
-- @treturn function the iterator
-- @usage for msg in sub:messages() do print(msg.data) end
function Sub:messages()
  return function() return (self:next()) end
end

--- The messages dropped because the queue was full (a slow consumer).
-- @function subscription:dropped
-- @treturn int the count
function Sub:dropped() return self.dropped_n end

--- What is queued, not yet handed to the callback or `subscription:next`.
-- @function subscription:pending
-- @treturn int messages
-- @treturn int bytes of their payloads
function Sub:pending() return self.tail - self.head + 1, self.bytes end

--- The messages the server sent to this subscription (dropped ones
-- included).
-- @function subscription:delivered
-- @treturn int the count
function Sub:delivered() return self.received end
function Sub:__tostring()
  return "netrun.nats.subscription(" .. self.subject .. ", sid " .. self.sid .. ")"
end

--- @section end

-- ---- request/reply -----------------------------------------------------------

-- One wildcard subscription, made on first use, serves every request:
-- each request's reply subject is the inbox prefix and a token.
function Conn:_inbox()
  local s = self.inbox
  if s then return s end
  local prefix = self.opts.inbox_prefix .. "." .. nuid()
  s = self:subscribe(prefix .. ".*")
  self.inbox, self.inbox_prefix = s, prefix .. "."
  return s
end

-- A request's entry in nc.requests is the coroutine parked for it, or
-- its future (a request made outside a coroutine).
local function settle(entry, m, err)
  if type(entry) == "thread" then
    unpark(entry, m, err)
  elseif err then
    entry:try_failure(err)
  else
    entry:try_success(m)
  end
end

function Conn:_response(subject, reply, data, hdr)
  local token = sub(subject, #self.inbox_prefix + 1)
  local entry = self.requests[token]
  if entry == nil then return end
  self.requests[token] = nil
  local m = setmetatable({ subject = subject, data = data, reply = reply, _c = self.id }, Msg)
  if hdr and not decode_headers(m, hdr) then
    return settle(entry, nil, "malformed header block in the reply")
  end
  if self.woken[1] then self:_deliver() end
  if m.status == 503 and data == "" then return settle(entry, nil, "no responders") end
  settle(entry, m)
end

-- Send a request whose reply settles entry (a coroutine or a future,
-- see settle): true, or nil, err when it could not be sent.
function Conn:_send_request(subject, data, timeout, headers, entry)
  if self.state == "closed" then return nil, "closed" end
  self:_inbox()
  local token = tostring(self.next_token)
  self.next_token = self.next_token + 1
  self.requests[token] = entry
  local ok, err = self.publish(self, subject, data, self.inbox_prefix .. token, headers)
  if not ok then
    self.requests[token] = nil
    return nil, err
  end
  if timeout > 0 then self:_expire_at(core.now() + timeout, token) end
  return true
end

-- The request's future (failed with "timeout", "no responders", ...).
function Conn:_request(subject, data, timeout, headers)
  local p = core.promise()
  local ok, err = self:_send_request(subject, data, timeout, headers, p)
  if not ok then p:try_failure(err) end
  return p
end

-- Request deadlines: one queue per connection, sorted by deadline, and
-- one loop timer armed for its head -- not a timer and a listener per
-- request (they were most of a request's cost). Answered requests stay
-- queued until their deadline passes (nothing is searched when an answer
-- comes); the timer fires at most every EXPIRY_SLACK seconds, so a
-- timeout is reported up to that late.
local EXPIRY_SLACK = 0.01

function Conn:_expire_at(deadline, token)
  local q = self.expiry
  if q == nil then
    q = { head = 1, tail = 0, at = {}, token = {} }
    self.expiry = q
  end
  local at, tok = q.at, q.token
  local i = q.tail + 1
  -- requests with one timeout come in deadline order: almost always an append
  while i > q.head and at[i - 1] > deadline do
    at[i], tok[i] = at[i - 1], tok[i - 1]
    i = i - 1
  end
  at[i], tok[i] = deadline, token
  q.tail = q.tail + 1
  if q.armed == nil or deadline < q.armed then self:_arm_expiry(deadline) end
end

function Conn:_arm_expiry(deadline)
  local q = self.expiry
  if q.timer then q.timer:cancel() end
  q.armed = deadline
  q.timer = self.loop:schedule(math.max(deadline - core.now(), 0) + EXPIRY_SLACK, function()
    q.timer, q.armed = nil, nil
    self:_expire()
  end)
end

function Conn:_expire()
  local q, requests = self.expiry, self.requests
  local at, tok = q.at, q.token
  -- a failed request resumes its coroutine here, which may make another
  -- request (and queue it): q is kept consistent at every step
  while q.head <= q.tail and at[q.head] <= core.now() do
    local h = q.head
    local token = tok[h]
    at[h], tok[h] = nil, nil
    q.head = h + 1
    local entry = requests[token]
    if entry then
      requests[token] = nil
      settle(entry, nil, "timeout")
    end
  end
  if q.head > q.tail then
    q.head, q.tail = 1, 0
  elseif self.state ~= "closed" and (q.armed == nil or at[q.head] < q.armed) then
    self:_arm_expiry(at[q.head])
  end
end

--- @type connection

--- Send a request and wait for its first reply. The reply subject is the
-- connection's inbox (`<inbox_prefix>.<random>.<token>`: one wildcard
-- subscription, made on the first request, serves them all). In a
-- coroutine it waits; elsewhere on the loop it returns a future.
-- @function connection:request
-- @string subject the subject
-- @string[opt=""] data the payload
-- @tparam[opt] table opts
-- @number[opt=request_timeout] opts.timeout seconds (0: none); a timeout is reported up to 10 ms late
-- @tparam[opt] table opts.headers `{ name = "value" | { "a", "b" } }`
-- @treturn[1] msg the reply
-- @treturn[2] nil
-- @treturn[2] string `"timeout"`, `"no responders"` (a 503 status without data), `"closed"`, `"malformed header block in the reply"`, or `connection:publish`'s error
-- @raise on a bad subject, options or headers
-- @usage local reply, err = nc:request("svc.price", "AAPL", { timeout = 2 })
function Conn:request(subject, data, opts)
  check_subject(subject, "the subject", 2)
  local timeout, headers = self.opts.request_timeout, nil
  if opts ~= nil then
    if type(opts) ~= "table" then
      error("netrun.nats: request: options must be a table, got " .. type(opts), 2)
    end
    check_seconds(opts.timeout, "timeout", 2)
    timeout = opts.timeout or timeout
    headers = opts.headers
  end
  if not isyieldable() then return self:_request(subject, data, timeout, headers) end
  local ok, err = self:_send_request(subject, data, timeout, headers, running())
  if not ok then return nil, err end
  return park()                       -- the reply, or nil, err (settle)
end

-- ---- flush, drain, close --------------------------------------------------------

function Conn:_flush_future(timeout)
  local p = core.promise()
  if self.state == "closed" then
    p:try_failure("closed")
    return p
  end
  self.pongs[#self.pongs + 1] = p
  if self.state == "connected" or self.state == "draining" then self.w:send("PING\r\n") end
  return deadline(self.loop, p, timeout, "flush timeout")
end

--- A round trip to the server (PING, PONG): once it returns, the server
-- has processed everything published before, and the messages it sent
-- before its PONG have been handed to their subscriptions. While
-- reconnecting, the PING goes once connected. In a coroutine it waits;
-- elsewhere on the loop it returns a future.
-- @function connection:flush
-- @number[opt=flush_timeout] timeout seconds (0: none)
-- @treturn[1] boolean true
-- @treturn[2] nil
-- @treturn[2] string `"flush timeout"` or `"closed"`
-- @raise on a timeout that is not a number >= 0
function Conn:flush(timeout)
  check_seconds(timeout, "timeout", 2)
  return result(self:_flush_future(timeout or self.opts.flush_timeout))
end

--- Drain, then close: every subscription is drained
-- (`subscription:drain`: unsubscribed, what was queued still delivered),
-- what was published is flushed (`connection:flush`), and the connection
-- closes, on failure too. Meanwhile `connection:subscribe` returns
-- `nil, "draining"` and publishing still works; a lost connection is not
-- reconnected. A second call waits for the first drain. In a coroutine
-- it waits; elsewhere on the loop it returns a future.
-- @function connection:drain
-- @number[opt=drain_timeout] timeout seconds for all of it
-- @treturn[1] boolean true
-- @treturn[2] nil
-- @treturn[2] string `"closed"` (already), `"drain timeout"`, `"flush timeout"`
-- @raise on a timeout that is not a number >= 0
function Conn:drain(timeout)
  check_seconds(timeout, "timeout", 2)
  if self.drain_f then return result(self.drain_f) end
  if self.state == "closed" then return nil, "closed" end
  timeout = timeout or self.opts.drain_timeout
  local nc = self
  self.drain_f = core.spawn(function()
    local t0 = core.now()
    local function left() return math.max(timeout - (core.now() - t0), 0.001) end
    nc.state = nc.state == "connected" and "draining" or nc.state
    local subs = {}
    for _, s in pairs(nc.subs) do
      if s ~= nc.inbox then subs[#subs + 1] = s end
    end
    local futures = {}
    for _, s in ipairs(subs) do futures[#futures + 1] = s:_drain(left()) end
    for _, f in ipairs(futures) do
      local ok, err = pcall(f.await, f)
      if not ok then nc:close(); error(err, 0) end
    end
    local ok, err = pcall(function() return nc:_flush_future(left()):await() end)
    nc:close()
    if not ok then error(err, 0) end
    return true
  end)
  return result(self.drain_f)
end

--- Close now: what was published and is held is written first (while
-- connected); requests and flushes waiting fail with `"closed"`,
-- subscriptions end (their queued messages dropped; `subscription:next`
-- returns `nil, "closed"`), `on_closed(nc, nil)` runs and
-- `connection:closed`'s future completes. A second call does nothing.
-- @function connection:close
-- @treturn boolean true
function Conn:close()
  if self.state == "closed" then return true end
  self:_close(nil)
  return true
end

function Conn:_close(err)
  if self.state == "closed" then return end
  self.state = "closed"
  self.last_error = err or self.last_error
  if self.retry then self.retry:cancel(); self.retry = nil end
  if self.expiry and self.expiry.timer then self.expiry.timer:cancel() end
  local link = self.link
  self.link = nil
  if link then
    link.dead = true
    if link.timer then link.timer:cancel() end
    if link.keepalive then link.keepalive:cancel() end
    self.w:flush()
    if link.ch then link.ch:close() end
  end
  self.w:close()
  local requests, pongs = self.requests, self.pongs
  self.requests, self.pongs = {}, {}
  for _, entry in pairs(requests) do settle(entry, nil, "closed") end
  for _, p in ipairs(pongs) do if p then p:try_failure("closed") end end
  if self.writable then self.writable:try_success(false); self.writable = nil end
  if self.connecting then
    self.connecting:try_failure(err or "closed")
    self.connecting = nil
  end
  local subs = {}
  for _, s in pairs(self.subs) do subs[#subs + 1] = s end
  for _, s in ipairs(subs) do s:_finish(false) end
  conns[self.id] = nil
  self.closed_p:try_success(true)
  event(self, "on_closed", err)
end

-- ---- what a user may ask -------------------------------------------------------

--- The connection's state.
-- @function connection:status
-- @treturn string `"connected"`, `"reconnecting"`, `"draining"` or `"closed"`
-- (`"connecting"` only before `connect` returned it)
function Conn:status() return self.state end

--- A future completed (with true) once the connection is closed: by
-- `connection:close`, `connection:drain`, or when no server is left to
-- reconnect to.
-- @function connection:closed
-- @treturn future
function Conn:closed() return self.closed_p end

--- The server's last INFO, decoded (`server_id`, `version`,
-- `max_payload`, `connect_urls`, ...).
-- @function connection:server_info
-- @treturn table|nil the INFO
function Conn:server_info() return self.info end

--- The connection's counters, since `connect`.
-- @function connection:stats
-- @treturn table `{ in_msgs, in_bytes, out_msgs, out_bytes, reconnects, buffered }`:
-- messages received and published and their payload bytes,
-- reconnections, and bytes held, not yet written
function Conn:stats()
  local in_msgs, in_bytes, out_msgs, out_bytes, held = self.w:stats()
  return { in_msgs = in_msgs, in_bytes = in_bytes, out_msgs = out_msgs,
           out_bytes = out_bytes, reconnects = self.reconnects, buffered = held }
end

--- Why the connection was last lost, or a connection attempt last
-- failed, or why it closed.
-- @function connection:last_error
-- @treturn string|nil the error, nil if none yet
function Conn:last_error() return self.last_error end

--- The pool: the servers it may reconnect to, those given and those
-- announced (less those that failed `max_reconnects` times).
-- @function connection:servers
-- @treturn {string,...} `"host:port"` of each
function Conn:servers()
  local out = {}
  for i, s in ipairs(self.pool) do out[i] = s.key end
  return out
end

--- The server it is connected to.
-- @function connection:connected_server
-- @treturn string|nil `"host:port"`, nil while not connected
function Conn:connected_server()
  local link = self.link
  return link and link.phase == "up" and link.server.key or nil
end

function Conn:__tostring()
  return "netrun.nats.connection(" .. self.state .. ")"
end

-- ---- JetStream -------------------------------------------------------------------

--- A JetStream context on this connection (nothing is sent: JetStream's
-- API is requests on `$JS.API.>` subjects).
-- @function connection:jetstream
-- @tparam[opt] table opts
-- @number[opt=5] opts.timeout seconds each call waits for its answer
-- @string[opt] opts.domain a JetStream domain: the API prefix becomes `$JS.<domain>.API`
-- @string[opt="$JS.API"] opts.prefix the API prefix (wins over `domain`)
-- @treturn jetstream
-- @raise on options that are not a table, a bad timeout
function Conn:jetstream(opts)
  if opts ~= nil and type(opts) ~= "table" then
    error("netrun.nats: jetstream: options must be a table, got " .. type(opts), 2)
  end
  opts = opts or {}
  check_seconds(opts.timeout, "timeout", 2)
  local prefix = opts.prefix or (opts.domain and "$JS." .. opts.domain .. ".API") or "$JS.API"
  return setmetatable({ nc = self, timeout = opts.timeout or 5, prefix = prefix }, JS)
end

local EXPECT = { stream = "Nats-Expected-Stream", last_seq = "Nats-Expected-Last-Sequence",
                 last_msg_id = "Nats-Expected-Last-Msg-Id",
                 last_subject_seq = "Nats-Expected-Last-Subject-Sequence" }

-- A request whose reply is a JSON API answer: a future of the decoded
-- table, failed with the API's error ("description (code N)").
local function api_future(js, subject, data, headers, timeout)
  local nc = js.nc
  local out = core.promise()
  nc:_request(subject, data, timeout or js.timeout, headers):add_listener(function(f)
    if not f:is_success() then return out:try_failure(f:cause()) end
    local ok, v = pcall(json.decode, f:result().data)
    if not ok or type(v) ~= "table" then
      return out:try_failure("JetStream: the answer is not a JSON object")
    end
    if type(v.error) == "table" then
      return out:try_failure(format("JetStream: %s (%s%s)", tostring(v.error.description),
        tostring(v.error.code), v.error.err_code and " " .. tostring(v.error.err_code) or ""))
    end
    out:try_success(v)
  end)
  return out
end

--- @section end

--- A JetStream context, made by `connection:jetstream`.
-- @type jetstream

--- Publish to a stream and wait for its acknowledgement. In a coroutine
-- it waits; elsewhere on the loop it returns a future.
-- @function jetstream:publish
-- @string subject a subject a stream takes
-- @string[opt=""] data the payload
-- @tparam[opt] table opts
-- @string[opt] opts.msg_id `Nats-Msg-Id`: the stream drops a duplicate within its window (`duplicate` in the acknowledgement)
-- @tparam[opt] table opts.expect `{ stream, last_seq, last_msg_id, last_subject_seq }`: the stream refuses the message unless they hold
-- @tparam[opt] table opts.headers more headers
-- @number[opt] opts.timeout seconds (the context's by default)
-- @treturn[1] table the acknowledgement `{ stream, seq, duplicate, domain }`
-- @treturn[2] nil
-- @treturn[2] string `"no responders"` (no stream takes the subject), `"timeout"`, `"closed"`, an error acknowledgement as `"JetStream: <description> (<code> <err_code>)"` (`"JetStream: wrong last sequence: 200 (400 10071)"`)
-- @raise on a bad subject, options, or an unknown `expect` key
-- @usage local ack = assert(js:publish("orders.new", data, { msg_id = id }))
function JS:publish(subject, data, opts)
  check_subject(subject, "the subject", 2)
  local headers, timeout
  if opts ~= nil then
    if type(opts) ~= "table" then
      error("netrun.nats: jetstream publish: options must be a table, got " .. type(opts), 2)
    end
    check_seconds(opts.timeout, "timeout", 2)
    timeout = opts.timeout
    if opts.headers or opts.msg_id or opts.expect then
      headers = {}
      for k, v in pairs(opts.headers or {}) do headers[k] = v end
      if opts.msg_id then headers["Nats-Msg-Id"] = tostring(opts.msg_id) end
      for k, v in pairs(opts.expect or {}) do
        local name = EXPECT[k] or error("netrun.nats: jetstream publish: unknown expect '" ..
          tostring(k) .. "'", 2)
        headers[name] = tostring(v)
      end
    end
  end
  local ack = core.promise()
  api_future(self, subject, data, headers, timeout):add_listener(function(f)
    if not f:is_success() then return ack:try_failure(f:cause()) end
    local v = f:result()
    if type(v.stream) ~= "string" or math.type(v.seq) ~= "integer" then
      return ack:try_failure("JetStream: the acknowledgement has no stream and seq")
    end
    ack:try_success({ stream = v.stream, seq = v.seq, duplicate = v.duplicate == true,
                      domain = v.domain })
  end)
  return result(ack)
end

--- Any JetStream API call (streams, consumers): a request to
-- `<prefix>.<name>` with `request` as JSON. In a coroutine it waits;
-- elsewhere on the loop it returns a future.
-- @function jetstream:api
-- @string name the call, e.g. `"STREAM.INFO.ORDERS"`
-- @tparam[opt] table request its request (nil: an empty body)
-- @number[opt] timeout seconds (the context's by default)
-- @treturn[1] table the decoded answer
-- @treturn[2] nil
-- @treturn[2] string `"timeout"`, `"no responders"` (no JetStream), `"closed"`, an API error as `"JetStream: <description> (<code> <err_code>)"`
-- @raise on a name that is not a non-empty string or makes a bad subject
-- @usage js:api("STREAM.CREATE.ORDERS", { name = "ORDERS", subjects = { "orders.>" }, num_replicas = 3 })
function JS:api(name, req, timeout)
  if type(name) ~= "string" or name == "" then
    error("netrun.nats: jetstream api: the name must be a string such as " ..
      "\"STREAM.INFO.ORDERS\", got " .. tostring(name), 2)
  end
  check_subject(self.prefix .. "." .. name, "the API subject", 2)
  local body = req == nil and "" or json.encode(req)
  return result(api_future(self, self.prefix .. "." .. name, body, nil, timeout))
end

--- @section end

return M
