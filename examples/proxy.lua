-- proxy.lua -- a reverse proxy in Lua: the native HTTP server codec faces
-- clients, each request goes to the backend through a keep-alive pool
-- (netrun.http.client, one pool per loop) and its response comes back.
--   netrun examples/proxy.lua --backend 127.0.0.1:8080 [--backend ...] [--port 8000]
--          [--balance round_robin|least_conn|hash] [--hash-header NAME]
--          [--health-path /health --health-interval 2] [--retries 1]
--          [--max-fails 1] [--fail-timeout 10] [--backend-ca FILE]
--          [--threads 1] [--pool 64] [--timeout 30] [--max-body 8388608]
--          [--in-flight 16] [--body-budget 33554432]
--          [--conn-body-budget 16777216] [--backend-h2 no|auto|yes]
--          [--body whole|stream] [--buffer 65536]    (or BACKEND=, PORT=, ...)
-- Clients may speak HTTP/1.1 or HTTP/2 (h2c, or h2 behind TLS): the server
-- codec answers each in its own. --backend-h2 yes speaks HTTP/2 to the
-- backend (h2c by prior knowledge), its requests multiplexed on one
-- connection; the default (auto) speaks it only to an https backend that
-- agrees it.
-- Bodies are streamed both ways by default (--body stream, see "--body
-- stream" below): what a client connection costs is about 2 x --buffer
-- whatever the bodies' sizes, --max-body bounds a request body (0: no
-- limit), and a WebSocket (any Upgrade answered 101) is tunnelled.
-- --body whole holds them whole instead (described next; the default
-- with --backend-h2 yes, as streaming speaks HTTP/1.1 to the backend).
-- Several backends stream the same way (the upstream picks one per
-- request; see --backend below).
-- Answers of its own: 502 when the backend cannot be reached or answers
-- badly (or with a body over --max-body), 504 past --timeout.
--
-- --body whole: bodies are bounded, not streamed: a request or response
-- body is held whole, up to --max-body. What request bodies hold is counted in bytes
-- by the server codec (its body budget): at most --body-budget per loop
-- and --conn-body-budget per client connection, from a body's head until
-- its answer is written (so bodies waiting for a connection to the
-- backend, or sent to one that has not answered, count); past it the
-- proxy stops reading from clients until answers free room -- the
-- clients' own for their connection's budget, any for the loop's. A
-- body over a budget still passes, alone. A body admitted may be in
-- memory three times over: the bytes read, the request made of them, and
-- the copy waiting in the backend connection's outbound buffer until the
-- backend reads it. So, whatever the number of clients, a loop holds at
-- most about 3 x --body-budget (96 MiB with the defaults; measured +96
-- MiB of RSS with 4, 12 or 48 clients posting 8 MiB bodies to a backend
-- that reads nothing), plus 64 KiB per client connection (the read that
-- brought a head whose body waits). Backpressure both ways:
--  - a slow client: while its connection cannot take more (the outbound
--    buffer above its high water mark) the server codec parses no further
--    request of it, and a client connection has at most --in-flight
--    requests at the backend (past that the proxy stops reading from it),
--    so what the proxy holds for one client is bounded by
--    in-flight x max-body whatever the backend sends;
--  - a slow backend: requests wait for a pooled connection (at most --pool
--    per loop) and fail with 504 past --timeout, or with 502 at once when
--    1024 already wait (the client's max_waiting); the clients'
--    connections meanwhile hold at most --in-flight requests each.
local netrun = require "netrun"

local option = netrun.option
local port = option("port", 8000)
local threads = option("threads", 1)
-- --backend may be given several times (or BACKEND=a,b): an upstream
-- (netrun.http.upstream) then spreads the requests over them (--balance
-- round_robin|least_conn|hash, --hash-header NAME for hash), takes out a
-- backend that fails (and, with --health-path P, one that fails GET P every
-- --health-interval S seconds; those probes bring it back), and sends an
-- idempotent request whose backend failed to another (--retries N, 1):
-- streamed, only while nothing of its answer went to the client and
-- nothing of its body was read from the client (a GET; a PUT whose
-- backend could not be reached); with --body whole, any idempotent one.
-- A backend may be https://host:port (verified against the system's CAs,
-- or --backend-ca FILE). One plain host:port backend and none of those
-- options: the forwarder goes straight to it, as before.
local backends = netrun.options("backend")
if #backends == 0 then error("proxy: --backend host:port is required") end
local backend = backends[1]
local bhost, bport = backend:match("^%[?([^%]]+)%]?:(%d+)$")
local balance, health_path = option("balance"), option("health-path")
local retries, backend_ca = option("retries"), option("backend-ca")
local backend_tls = backend_ca and netrun.tls.client { ca = backend_ca } or nil
local up
if #backends > 1 or not bhost or balance or health_path or retries or backend_ca then
  up = netrun.http.upstream {
    servers = backends, balance = balance, hash = option("hash-header"),
    retries = retries and math.tointeger(tonumber(retries)),
    health = health_path and { path = health_path, interval = option("health-interval", 2),
                               fails = math.tointeger(option("health-fails", 1)),
                               passes = math.tointeger(option("health-passes", 1)) } or nil,
    fails = math.tointeger(option("max-fails", 1)), fail_timeout = option("fail-timeout", 10),
    tls = backend_tls,
  }
end
local max_body = math.tointeger(option("max-body", 8 * 1024 * 1024))
local in_flight = math.tointeger(option("in-flight", 16))
local body_budget = math.tointeger(option("body-budget", 32 * 1024 * 1024))
local conn_body_budget = math.tointeger(option("conn-body-budget", 16 * 1024 * 1024))
local base = bhost and "http://" .. (bhost:find(":", 1, true) and "[" .. bhost .. "]" or bhost) .. ":" .. bport

-- (streamed by default: to HTTP/1.1 backends, one or an upstream's)
local body_mode = option("body", option("backend-h2") == "yes" and "whole" or "stream")
if body_mode ~= "stream" and body_mode ~= "whole" then error("proxy: --body must be stream or whole") end
local stream_bodies = body_mode == "stream"
local buffer = math.tointeger(option("buffer", 64 * 1024))
if stream_bodies and max_body == 0 then max_body = 1 << 40 end   -- (no limit: 1 TiB)

local backend_h2 = ({ yes = true, no = false, auto = "auto" })[option("backend-h2", "auto")]
if backend_h2 == nil then error("proxy: --backend-h2 must be yes, no or auto") end

local client = netrun.http.client {
  pool = math.tointeger(option("pool", 64)), keepalive = 60,
  timeout = option("timeout", 30),
  max_body = stream_bodies and 1 << 40 or max_body,  -- (streamed responses: no limit)
  raw = true,      -- responses ready to write, hop-by-hop fields dropped in C
  h2 = backend_h2,
  tls = backend_tls,   -- (the upstream's too: its forwarders take the client's pools)
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

local VOID = netrun.void_promise()     -- no future per write (a failure reaches
                                       -- exception_caught, which closes)

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

-- A client connection that failed (a reset, a write that failed) closes.
local function client_failed(_, c, err)
  netrun.log.debug("proxy: client %s", tostring(err))
  c:close()
end

-- The handler of a client connection. Responses go out in request order
-- (the codec's rule), so each request sent to the backend takes the next
-- slot of a ring of in_flight slots, and the slots are written in order
-- as they fill (`head` and `sent` count requests; at most in_flight are
-- between them, so no two share a slot); each slot has its callback, made
-- once. Requests wait in `queue` (from `first` to `last`) until a slot is
-- free and the client's connection is writable. The connection's state
-- is the closures' upvalues: read without a table lookup.
local function proxy_handler()
  local slots, callbacks = {}, {}
  for i = 1, in_flight do slots[i] = false end   -- false: empty (an array
                                                 -- from the start)
  local head, sent = 0, 0
  local queue, first, last = {}, 1, 0
  local paused, closed, writable = false, false, true
  local ch, ctx, forward               -- the connection's, at its first request
  local write, write_and_flush
  local dispatch

  local function flush_ready()
    local i = head % in_flight + 1
    while slots[i] do               -- the last one ready flushes them all
      local res = slots[i]
      slots[i] = false
      head = head + 1
      i = head % in_flight + 1
      if not slots[i] then write_and_flush(ctx, res, VOID) else write(ctx, res, VOID) end
    end
    if first <= last then dispatch() end  -- a slot is free now
  end

  -- To the backend, in the next slot, whose callback puts the answer
  -- there: a callback rather than a future, so the response is not copied.
  -- The request goes on as it came (method, path and query, end-to-end
  -- fields, body), with x-forwarded-for: `forward` hands the client codec
  -- the server codec's request, whose bytes it copies, with no table made
  -- of it (a handler may change req's fields first: req.path = ...).
  -- forward(req, cb) is client:request({ url = base, forward = req,
  -- headers = xff }, cb) with those options checked once, for the
  -- connection (client:forwarder).
  local function send(req)
    local i = sent % in_flight + 1
    sent = sent + 1
    local cb = callbacks[i]
    if cb == nil then
      cb = function(res, err)
        slots[i] = response_for(res, err)
        if not closed then flush_ready() end
      end
      callbacks[i] = cb
    end
    forward(req, cb)
  end

  function dispatch()
    while first <= last and sent - head < in_flight and writable do
      local r = queue[first]
      queue[first] = nil
      first = first + 1
      send(r)
    end
    if first > last then first, last = 1, 0 end   -- (the array part again)
    -- read no more from a client whose requests pile up
    local piled = last - first + 1 >= in_flight
    if piled ~= paused then
      paused = piled
      ch:option("auto_read", not piled)
    end
  end

  return {
    channel_read = function(_, c, req)
      if not ch then
        ctx, ch = c, c.channel
        write, write_and_flush = c.write, c.write_and_flush
        local xff = { ["x-forwarded-for"] = (ch:remote_address()) }
        forward = up and client:forwarder { upstream = up, headers = xff }
                  or client:forwarder { url = base, headers = xff }
      end
      if first > last and sent - head < in_flight and writable then
        return send(req)              -- nothing waits: at once
      end
      last = last + 1
      queue[last] = req
      dispatch()
    end,
    channel_writability_changed = function(_, c)
      writable = c.channel:is_writable()
      if ch then dispatch() end
    end,
    channel_inactive = function(_, c)
      closed = true                   -- (answers still coming are dropped)
      c:fire_channel_inactive()
    end,
    exception_caught = client_failed,
  }
end

-- ---- --body stream: bodies streamed both ways ----------------------------
--
-- A client connection's requests go one at a time, each to a pooled
-- backend connection through a stream forwarder (client:forwarder {
-- stream = true }, in C): the head at once, the body, if any, read from
-- the client no faster than the backend connection takes it (the server
-- codec reads nothing while that connection holds more than --buffer
-- bytes unsent) and sent on as it came (its Content-Length, or chunked);
-- the response back the same way, the backend connection reading nothing
-- while the client's holds more than --buffer unsent. So a client
-- connection holds about 2 x --buffer plus a read each way, whatever the
-- bodies' sizes. The backend connection goes back to the pool after a
-- complete exchange only. A request with Upgrade goes with it, and a 101
-- makes the two connections a byte tunnel (a WebSocket), bounded the same
-- way. An answer given before the body was all read ends the client's
-- connection after it (the rest unread); a body cut short either way
-- closes the other side.
local function stream_handler()
  local ctx, ch, forward              -- the connection's, at its first request
  local queue, first, last = {}, 1, 0
  local busy, paused, closed = false, false, false
  local start, current

  -- the exchange's end: true, the next request may go; nil, nothing was
  -- written (the backend could not be reached or failed before its
  -- head): answer it here; false, the client's connection is done -- or,
  -- over HTTP/2, that request's stream (the client reset it): the next
  -- stream goes on
  local function done(ok, err)
    busy = false
    if closed or (ok == false and not current.stream) then return end
    if ok == nil then ctx:write_and_flush(response_for(nil, err), VOID) end
    if first <= last then
      local r = queue[first]
      queue[first] = nil
      first = first + 1
      if first > last then first, last = 1, 0 end
      if paused then paused = false; ch:option("auto_read", true) end
      return start(r)
    end
  end

  function start(r)
    busy, current = true, r
    forward(r, done, ctx)
  end

  return {
    channel_read = function(_, c, req)
      if not ch then
        ctx, ch = c, c.channel
        local xff = { ["x-forwarded-for"] = (ch:remote_address()) }
        forward = up and client:forwarder { upstream = up, stream = true, buffer = buffer,
                                            headers = xff }
                  or client:forwarder { url = base, stream = true, buffer = buffer, headers = xff }
      end
      if busy then                    -- (pipelined: one at a time)
        last = last + 1
        queue[last] = req
        -- (an HTTP/2 client's requests are bounded by its streams, each
        -- unread body by its window; pausing its reads would stop the body
        -- under way too)
        if not paused and not req.stream and last - first + 1 >= in_flight then
          paused = true; ch:option("auto_read", false)
        end
        return
      end
      start(req)
    end,
    channel_inactive = function(_, c)
      closed = true
      c:fire_channel_inactive()
    end,
    -- an HTTP/2 stream's body cut short before its turn (the client reset
    -- it, or sent less than its content-length): that stream only -- its
    -- turn finds the body gone and answers 502, dropped with the stream
    exception_caught = function(h, c, err)
      if tostring(err):find("%(stream %d+%)") then
        netrun.log.debug("proxy: client %s", tostring(err))
        return
      end
      return client_failed(h, c, err)
    end,
  }
end

-- made once: each channel gets its own codec
local codec = netrun.codec.http_server { max_body = max_body, body_budget = body_budget,
                                         conn_body_budget = conn_body_budget,
                                         body = stream_bodies and "stream" or nil }
local workers = netrun.group { threads = threads, name = "proxy" }
netrun.server {
  group = workers, host = option("host", "0.0.0.0"), port = port,
  child_options = stream_bodies and { write_buffer_low = buffer // 2,
                                      write_buffer_high = buffer } or nil,
  init = function(ch)
    ch:pipeline():add_last("http", codec)
    ch:pipeline():add_last("proxy", stream_bodies and stream_handler() or proxy_handler())
  end,
}:sync()
netrun.log.info("proxy: listening on :%d, backend %s%s", port,
                up and table.concat(up.servers, " ") .. (up.health and " (probed)" or "") or base,
                stream_bodies and ", bodies streamed" or "")
