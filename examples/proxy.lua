-- proxy.lua -- a reverse proxy in Lua: the native HTTP server codec faces
-- clients, each request goes to the backend through a keep-alive pool
-- (netrun.http.client, one pool per loop) and its response comes back.
--   netrun examples/proxy.lua --backend 127.0.0.1:8080 [--port 8000]
--          [--threads 1] [--pool 64] [--timeout 30] [--max-body 8388608]
--          [--in-flight 16]                         (or BACKEND=, PORT=, ...)
-- Answers of its own: 502 when the backend cannot be reached or answers
-- badly (or with a body over --max-body), 504 past --timeout.
--
-- Bodies are bounded, not streamed: a request or response body is held
-- whole, up to --max-body. Backpressure both ways:
--  - a slow client: while its connection cannot take more (the outbound
--    buffer above its high water mark) the server codec parses no further
--    request of it, and a client connection has at most --in-flight
--    requests at the backend (past that the proxy stops reading from it),
--    so what the proxy holds for one client is bounded by
--    in-flight x max-body whatever the backend sends;
--  - a slow backend: requests wait for a pooled connection (at most --pool
--    per loop) and fail with 504 past --timeout; the clients' connections
--    meanwhile hold at most --in-flight requests each.
local netrun = require "netrun"

local option = netrun.option
local port = option("port", 8000)
local threads = option("threads", 1)
local backend = option("backend") or error("proxy: --backend host:port is required")
local bhost, bport = backend:match("^%[?([^%]]+)%]?:(%d+)$")
if not bhost then error("proxy: --backend must be host:port, got " .. backend) end
local max_body = math.tointeger(option("max-body", 8 * 1024 * 1024))
local in_flight = math.tointeger(option("in-flight", 16))
local base = "http://" .. (bhost:find(":", 1, true) and "[" .. bhost .. "]" or bhost) .. ":" .. bport

local client = netrun.http.client {
  pool = math.tointeger(option("pool", 64)), keepalive = 60,
  timeout = option("timeout", 30), max_body = max_body,
  raw = true,      -- responses ready to write, hop-by-hop fields dropped in C
}

-- Hop-by-hop fields (RFC 9110 7.6.1) stay on their hop; the codecs frame
-- each side themselves. (Requests are forwarded without them, and the
-- backend's responses come without them in the client's raw mode: this is
-- for a response the client could not prepare.)
local HOP = { connection = true, ["keep-alive"] = true, te = true, trailer = true,
              ["transfer-encoding"] = true, upgrade = true, ["proxy-connection"] = true,
              ["proxy-authorization"] = true, ["proxy-authenticate"] = true,
              ["content-length"] = true }

-- In place (clearing a field while walking the table is allowed).
local function strip_hop(h)
  for k in next, h do
    if HOP[k] then h[k] = nil end
  end
  return h
end

-- Per client connection: responses go out in request order (the codec's
-- rule), so each request sent to the backend takes the next slot of a
-- ring of in_flight slots, and the slots are written in order as they
-- fill (`head` and `sent` count requests; at most in_flight are between
-- them, so no two share a slot). Each slot has its callback and request
-- options, made once.
-- Requests wait in `queue` until a slot is free and the client's
-- connection is writable; the queue counts from 1 again whenever it
-- empties, so its entries stay in the table's array part.
local Proxy = {}
Proxy.__index = Proxy

local dispatch

local VOID = netrun.void_promise()     -- no future per write (a failure reaches
                                       -- exception_caught, which closes)

local function flush_ready(self, ctx)
  local slots, head = self.slots, self.head
  local i = head % in_flight + 1
  while slots[i] ~= nil do   -- the last one ready flushes them all
    local res = slots[i]
    slots[i] = nil
    head = head + 1
    i = head % in_flight + 1
    if slots[i] == nil then ctx:write_and_flush(res, VOID) else ctx:write(res, VOID) end
  end
  self.head = head
  local q = self.queue
  if q.first <= q.last then dispatch(self, ctx) end   -- a slot is free now
end

-- What the client gets for the backend's answer r, or for err.
local function response_for(r, err)
  if r then                -- (a table only if it could not be prepared)
    return r.response or { status = r.status, headers = strip_hop(r.headers), body = r.body }
  end
  local timeout = err:find("timeout after", 1, true)
  netrun.log.debug("proxy: %s", err)
  return { status = timeout and 504 or 502, headers = { ["content-type"] = "text/plain" },
           body = timeout and "gateway timeout\n" or "bad gateway\n" }
end

-- To the backend, in the next slot. Each slot has its request options,
-- made once: client:request reads them as it is called (it keeps them
-- only to follow redirects, which this client does not), so the slot's
-- table serves its every request; forward is cleared after the call, so
-- that a slot does not hold on to a request already answered.
local function send(self, ctx, req)
  local i = self.sent % in_flight + 1
  self.sent = self.sent + 1
  local o, cb = self.opts[i], self.callbacks[i]
  if o == nil then           -- a callback rather than a future: the response is not copied
    o = { url = base, forward = req, headers = self.xff }
    cb = function(res, err)
      self.slots[i] = response_for(res, err)
      if not self.closed then flush_ready(self, ctx) end
    end
    self.opts[i], self.callbacks[i] = o, cb
  else
    o.forward = req
  end
  client:request(o, cb)
  o.forward = nil
end

function dispatch(self, ctx)
  local q, ch = self.queue, self.ch
  local first, last = q.first, q.last
  while first <= last and self.sent - self.head < in_flight and self.writable do
    local r = q[first]
    q[first] = nil
    first = first + 1
    send(self, ctx, r)
  end
  if first > last then first, last = 1, 0 end
  q.first, q.last = first, last
  -- read no more from a client whose requests pile up
  local piled = last - first + 1 >= in_flight
  if piled ~= self.paused then
    self.paused = piled
    ch:option("auto_read", not piled)
  end
end

function Proxy:channel_read(ctx, req)
  -- the request goes on as it came (method, path and query, end-to-end
  -- fields, body), with x-forwarded-for: `forward` hands the client codec
  -- the server codec's request, whose bytes it copies, with no table made
  -- of it. A handler may read or change req's fields first (req.path =
  -- ..., req.headers.host = ...): what it changed is what is sent.
  local ch = self.ch
  if not ch then
    ch = ctx.channel
    self.ch, self.xff = ch, { ["x-forwarded-for"] = (ch:remote_address()) }
  end
  local q = self.queue
  if q.first > q.last and self.sent - self.head < in_flight and self.writable then
    return send(self, ctx, req)       -- nothing waits: at once
  end
  q.last = q.last + 1
  q[q.last] = req
  dispatch(self, ctx)
end

function Proxy:channel_writability_changed(ctx)
  self.writable = ctx.channel:is_writable()
  if self.ch then dispatch(self, ctx) end
end

function Proxy:channel_inactive(ctx)
  self.closed = true                   -- (answers still coming are dropped)
  ctx:fire_channel_inactive()
end

function Proxy:exception_caught(ctx, err)
  netrun.log.debug("proxy: client %s", tostring(err))
  ctx:close()
end

local codec = netrun.codec.http_server { max_body = max_body }   -- made once: each
                                                                 -- channel gets its own codec
local workers = netrun.group { threads = threads, name = "proxy" }
netrun.server {
  group = workers, host = option("host", "0.0.0.0"), port = port,
  init = function(ch)
    ch:pipeline():add_last("http", codec)
    ch:pipeline():add_last("proxy", setmetatable({ slots = {}, opts = {}, callbacks = {},
      head = 0, sent = 0, queue = { first = 1, last = 0 }, paused = false, ch = false,
      xff = false, writable = true, closed = false }, Proxy))
  end,
}:sync()
netrun.log.info("proxy: listening on :%d, backend %s", port, base)
