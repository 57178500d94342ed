-- netrun.http: the HTTP/1.1 client (DESIGN.md §8.3) on the native codec
-- netrun.codec.http_client.
--
--   netrun.http.request { method = "GET", url = "https://a.example/x",
--                         headers = {}, body = nil, timeout = 5,
--                         max_body = 1 << 20, tls = nil, follow = 0,
--                         forward = nil }
--     --> future of { status = 200, headers = { lowercased }, body = "...",
--                     reason, version, keep_alive }
--   local client = netrun.http.client { pool = 64, keepalive = 60,
--                                       timeout = 5, tls = ..., max_body = ... }
--   client:request { ... } --> future
--
-- Connections: each client keeps, per loop (in that loop's own Lua state)
-- and per origin (scheme, host, port), up to `pool` connections; a
-- response that leaves its connection usable puts it back (idle ones close
-- after `keepalive` seconds), and a request finding every connection busy
-- waits for one. netrun.http.request uses one default client. One request
-- at a time per connection (no pipelining: a slow response would hold up
-- the ones behind it).
--
-- timeout bounds the whole request (0: no bound): the name lookup, the
-- connect (and TLS handshake), and the response; past it the future fails with
-- "... timeout" and the connection is closed (its answer may still come).
-- Runtime failures fail the future with a message naming the request and
-- the cause: a bad URL, a refused connect, a reset or close in the middle
-- of the response, a body over max_body, a malformed response. A
-- connection that failed is never reused. A request sent on a reused
-- connection that the server closed before answering (its keep-alive ran
-- out at that moment) is sent once more on a fresh connection when its
-- method is idempotent.
--
-- forward = req (a request option, for proxies): req is a request of
-- netrun.codec.http_server, sent on as it came (method, target, end-to-end
-- fields, body: the client codec encodes it from the server codec's
-- bytes); url names only the origin; headers given are added and replace
-- forwarded fields of their names; fields the handler assigned win.
--
-- raw = true (a client option, for proxies): responses come as a
-- netrun.http.raw_response (res.status, res.keep_alive, res.response:
-- itself), the response without its hop-by-hop and framing fields encoded
-- once in C, for a server codec's ctx:write; no headers or body table
-- (one after which the connection closes: { status, keep_alive = false,
-- response }). Redirects are not followed then.
--
-- Redirects are not followed unless asked: follow = N follows up to N
-- (301, 302, 303, 307, 308 with a Location; 303, and 301/302 after a POST,
-- turn into a GET without body).
--
-- Threads: on a loop the connections live on that loop. From the main
-- thread (a script, the REPL) the request runs on a loop of a daemon group
-- of its own ("http", one thread) and its future's result is copied back;
-- await/sync there blocks until it is done.
local core = require "netrun.core"

-- A request is an array (a table made per request whose keys need no
-- hashing): its pool first (a table there: not an array of strings to
-- write), then the fields the client codec writes (METHOD, false when
-- forwarded, to HOST: lhttp_client.c reads them by position), then the
-- rest of its state: URL, promise or callback, timeout and deadline,
-- whether its pool's timer watches that deadline, its connection, whether
-- it is done (settled or timed out), retried, its own timer, TLS config,
-- redirects left to follow and the options they are followed with.
-- Unset: false.
local POOL <const>, METHOD <const>, FORWARD <const> = 1, 2, 6   -- (path 3, headers 4,
                                                                -- body 5, host 7)
local URL <const>, PROMISE <const>, CB <const>, TIMEOUT <const>, DEADLINE <const> =
      8, 9, 10, 11, 12
local PDEADLINE <const>, CONN <const>, DONE <const>, RETRIED <const>, TIMER <const>,
      TLS <const>, FOLLOW <const>, OPTS <const> = 13, 14, 15, 16, 17, 18, 19, 20

local M = {
  pool = 64, keepalive = 60, timeout = 5, max_body = 1 << 20, max_header = 16384,
  unescape = core.http.unescape,         -- + and %XX decoded (the server's)
}

local live = setmetatable({}, { __mode = "k" })   -- channel -> connection
local pools = {}              -- client id -> origin -> pool (this state's)
local codecs = {}             -- "max_header max_body" -> codec config
local now = core.now

-- The loop running this state (nil: the main thread): a state lives on
-- one thread for life, so it is asked once.
local here
local function current()
  if here == nil then here = core.current() or false end
  return here or nil
end
local byte = string.byte
local VOID = core.void_promise()
local traceback = debug.traceback

-- ---- URLs -------------------------------------------------------------------

local DEFAULT_PORT = { http = 80, https = 443 }

-- scheme, host, port, target of an absolute URL, or nil, why.
local function parse_url(url)
  if type(url) ~= "string" then return nil, "url must be a string, got " .. type(url) end
  local scheme, rest = url:match("^([%a][%w+.-]*)://(.*)$")
  if not scheme then return nil, "not an absolute http(s) URL" end
  scheme = scheme:lower()
  if not DEFAULT_PORT[scheme] then return nil, "unsupported scheme '" .. scheme .. "'" end
  local authority, target = rest:match("^([^/?#]*)(.*)$")
  if authority:find("@", 1, true) then return nil, "user information in URLs is not supported" end
  target = target:gsub("#.*$", "")
  if target == "" then target = "/" elseif target:sub(1, 1) == "?" then target = "/" .. target end
  if target:find("[%c ]") then return nil, "spaces or control characters in the path" end
  local host, port = authority:match("^%[([%x:.]+)%]:?(%d*)$")
  if not host then host, port = authority:match("^([^:]+):?(%d*)$") end
  if not host or host == "" then return nil, "no host" end
  port = port ~= "" and tonumber(port) or DEFAULT_PORT[scheme]
  if port < 1 or port > 65535 then return nil, "port out of range" end
  return scheme, host:lower(), math.tointeger(port), target
end
M.parse_url = parse_url

-- The URL a Location header points to, from the request's URL.
local function resolve_location(base, loc)
  if loc:match("^[%a][%w+.-]*://") then return loc end
  local scheme, authority = base:match("^([^:]+)://([^/?#]*)")
  if loc:sub(1, 2) == "//" then return scheme .. ":" .. loc end
  if loc:sub(1, 1) == "/" then return scheme .. "://" .. authority .. loc end
  local dir = base:match("^[^:]+://[^/?#]*(/?[^?#]*)") or "/"
  dir = dir:gsub("[^/]*$", "")
  if dir == "" then dir = "/" end
  return scheme .. "://" .. authority .. dir .. loc
end

-- ---- connections --------------------------------------------------------------

local Conn = {}
Conn.__index = Conn

local release, finish, settle, fail_request, lost

-- The handler of each connection, last in its pipeline after the codec.
function Conn:handler_added(ctx)
  self.ctx = ctx                 -- requests are written from here, through the codec
end

function Conn:channel_read(ctx, res)
  local req = self.req
  if req == nil then                     -- nobody asked: the codec lets only
    self.dead = true                     -- answers through, so this is a
    ctx:close()                          -- handler someone added
    return
  end
  self.req = nil
  if not res.keep_alive then
    self.dead = true
    ctx:close()
  end
  release(self)
  if req[DONE] then return end            -- timed out meanwhile
  if req[FOLLOW] then return finish(req, res) end
  settle(req, res)
end

function Conn:exception_caught(ctx, err)
  self.err = self.err or tostring(err)
  self.dead = true
  ctx:close()
end

function Conn:channel_inactive(ctx)
  self.dead = true
  local req = self.req
  if req then
    self.req = nil
    local err = self.err or "the connection closed before the response"
    release(self)
    fail_request(req, err, self.reused and err:find("closed before a response", 1, true))
  else
    release(self)
  end
end

-- In a new channel's init (on its loop): the codec and the handler.
function M.attach(ch, max_header, max_body, raw)
  local key = max_header .. " " .. max_body .. (raw and " raw" or "")
  local codec = codecs[key]
  if codec == nil then
    codec = core.codec.http_client { max_header = max_header, max_body = max_body, raw = raw }
    codecs[key] = codec
  end
  local conn = setmetatable({ ch = ch }, Conn)
  live[ch] = conn
  local p = ch:pipeline()
  p:add_last("http", codec)
  p:add_last("client", conn)
end

-- ---- pools --------------------------------------------------------------------------

local function pool_of(client, key, scheme, host, port, max_body)
  local per = pools[client.id]
  if per == nil then per = {}; pools[client.id] = per end
  local pool = per[key]
  if pool == nil then
    pool = { key = key, client = client, scheme = scheme, host = host, port = port,
             max_body = max_body,
             idle = {}, nidle = 0, total = 0, waiters = {}, whead = 1, wtail = 0,
             conns = {}, connecting = {}, loop = current(), dtimer = false, dat = 0 }
    per[key] = pool
  end
  return pool
end

local start, connect

-- Close idle connections past the keep-alive time; run while any idle.
local function sweep(pool)
  pool.sweeping = nil
  local keep, t, idle, n = pool.client.keepalive, now(), pool.idle, 0
  local kept = {}
  for i = 1, pool.nidle do
    local c = idle[i]
    if not c.dead and t - c.since < keep then
      n = n + 1
      kept[n] = c
    elseif not c.dead then
      c.dead = true
      c.ch:close()
    end
  end
  pool.idle, pool.nidle = kept, n
  if n > 0 then
    pool.sweeping = pool.loop:schedule(keep / 2 + 0.01, sweep, pool)
  end
end

-- A connection of the pool is gone (or never came): the first request
-- still waiting may open one of its own.
function lost(pool)
  pool.total = pool.total - 1
  while pool.whead <= pool.wtail do
    local req = pool.waiters[pool.whead]
    pool.waiters[pool.whead] = nil
    pool.whead = pool.whead + 1
    if not req[DONE] then
      pool.total = pool.total + 1
      return connect(pool, req)
    end
  end
  if pool.total == 0 then     -- nothing left: a client dropped leaves nothing
    local per = pools[pool.client.id]
    if per and per[pool.key] == pool then
      per[pool.key] = nil
      if next(per) == nil then pools[pool.client.id] = nil end
    end
  end
end

-- A connection finished its request (or died): back to the pool, or to
-- the first waiting request.
function release(conn)
  local pool = conn.pool
  if pool == nil then return end
  if conn.dead then
    conn.pool = nil
    pool.conns[conn] = nil
    return lost(pool)
  end
  while pool.whead <= pool.wtail do
    local req = pool.waiters[pool.whead]
    pool.waiters[pool.whead] = nil
    pool.whead = pool.whead + 1
    if not req[DONE] then return start(conn, req, true) end
  end
  conn.since = now()
  local n = pool.nidle + 1
  pool.idle[n] = conn
  pool.nidle = n
  if not pool.sweeping then
    pool.sweeping = pool.loop:schedule(pool.client.keepalive, sweep, pool)
  end
end

-- Send req on conn.
function start(conn, req, reused)
  conn.req = req
  conn.reused = reused
  req[CONN] = conn
  -- no future per request: the codec converts the request as it is
  -- written, and a field it cannot send (a header that is not a token,
  -- say) reaches exception_caught at once, nothing sent: the connection
  -- closes and channel_inactive fails the request with the codec's reason
  conn.ctx:write_and_flush(req, VOID)
end

function connect(pool, req)
  local client = pool.client
  local mh, mb, raw = client.max_header, pool.max_body, client.raw
  local tls = pool.scheme == "https" and (req[TLS] or client.tls or M.default_tls()) or nil
  local left = req[DEADLINE] - now()
  if left == math.huge then left = nil             -- no bound: connect's own
  elseif left <= 0 then left = 0.001 end
  if req[PDEADLINE] then pool.connecting[req] = true end   -- (its deadline is watched there)
  local ok, f = pcall(require("netrun").connect, {
    group = pool.loop, host = pool.host, port = pool.port, timeout = left, tls = tls,
    init = function(ch) require("netrun.http").attach(ch, mh, mb, raw) end,
  })
  if not ok then
    pool.connecting[req] = nil
    fail_request(req, tostring(f))
    return lost(pool)
  end
  f:add_listener(function(cf)
    if not cf:is_success() then
      pool.connecting[req] = nil
      local cause = tostring(cf:cause()):gsub("^netrun%.connect: ", "")
      fail_request(req, "connect: " .. cause)
      return lost(pool)
    end
    local ch = cf:result()
    local conn = live[ch]
    conn.pool = pool
    pool.conns[conn] = true
    if not ch:is_active() then conn.dead = true end
    if req[DONE] or conn.dead then       -- timed out meanwhile: keep it
      return release(conn)               -- (a request not done stays connecting:
    end                                  -- its deadline ends it)
    pool.connecting[req] = nil
    start(conn, req, false)
  end)
end

local function acquire(pool, req)
  local idle = pool.idle
  while pool.nidle > 0 do
    local n = pool.nidle
    local conn = idle[n]
    idle[n] = nil
    pool.nidle = n - 1
    -- (every close marks its connection dead: ours as we close, the
    -- peer's by channel_inactive, fired as the loop reads the close; a
    -- reset met by the write fails the request, sent again if idempotent)
    if not conn.dead then return start(conn, req, true) end
  end
  if pool.total < pool.client.pool then
    pool.total = pool.total + 1
    return connect(pool, req)
  end
  if req[RETRIED] then       -- sent before: ahead of those made since, as its
    pool.whead = pool.whead - 1    -- deadline is (the waiters' deadlines in order)
    pool.waiters[pool.whead] = req
  else
    pool.wtail = pool.wtail + 1
    pool.waiters[pool.wtail] = req
  end
end

-- ---- requests -----------------------------------------------------------------------

-- Deadlines. A request with its client's timeout is watched by its
-- pool's one timer (PDEADLINE true), which nothing per request needs to
-- arm or disarm: the deadlines are now + the same timeout, so the timer,
-- once set for the earliest, is never late for one made later. When it
-- fires it looks at the requests of the pool (on its connections or
-- connecting: at most the pool's size; and the waiters, which wait in
-- deadline order, up to the first not past), ends those past their
-- deadline and is set again for the earliest left. A request with a
-- timeout of its own gets a timer of its own.
local on_timeout

local function watched(r, t, past, earliest)
  if r and r[PDEADLINE] and not r[DONE] then
    local d = r[DEADLINE]
    if d <= t then past[#past + 1] = r elseif d < earliest then earliest = d end
  end
  return earliest
end

local expire

-- Set pool's timer for deadline d (at time t).
local function arm(pool, d, t)
  pool.dtimer, pool.dat = pool.loop:schedule(math.max(d - t, 0.001), expire, pool), d
end

function expire(pool)
  pool.dtimer = false
  local t, past, earliest = now(), {}, math.huge
  for conn in next, pool.conns do earliest = watched(conn.req, t, past, earliest) end
  for r in next, pool.connecting do earliest = watched(r, t, past, earliest) end
  local w, i = pool.waiters, pool.whead
  while i <= pool.wtail and w[i][DONE] do w[i] = nil; i = i + 1 end
  pool.whead = i
  for j = i, pool.wtail do      -- (in deadline order: up to the first not past)
    local r = w[j]
    if r[PDEADLINE] and not r[DONE] then
      if r[DEADLINE] > t then earliest = math.min(earliest, r[DEADLINE]); break end
      past[#past + 1] = r
    end
  end
  for i = 1, #past do on_timeout(past[i]) end   -- (after the walk: they change the sets)
  if earliest == math.huge then return end
  if pool.dtimer then           -- armed again, for a request a callback made
    if pool.dat <= earliest then return end
    pool.dtimer:cancel()         -- (for a deadline after one left: sooner)
  end
  arm(pool, earliest, t)
end

-- A request to be watched by pool's timer: it is armed unless it is, for
-- this deadline or an earlier one (a retried request comes to a pool,
-- maybe one made since, with the deadline it had).
local function watch(pool, req)
  req[PDEADLINE] = true
  local timer, d = pool.dtimer, req[DEADLINE]
  if not timer or pool.dat > d then
    if timer then timer:cancel() end
    arm(pool, d, now())
  end
end

local function done_timer(req)
  if req[TIMER] then req[TIMER]:cancel(); req[TIMER] = false end
  req[DONE] = true
end

local IDEMPOTENT = { GET = true, HEAD = true, OPTIONS = true, PUT = true, DELETE = true,
                     TRACE = true }

local send

-- The request's end: its future completes, or its callback runs (an error
-- in it is logged; it never reaches the connection's handler).
function settle(req, res, err)
  if req[TIMER] then req[TIMER]:cancel(); req[TIMER] = false end   -- (done_timer, inline)
  req[DONE] = true
  local cb = req[CB]
  if not cb then
    if res then req[PROMISE]:try_success(res) else req[PROMISE]:try_failure(err) end
    return
  end
  local ok, e = xpcall(cb, traceback, res, err)
  if not ok then core.log(3, "netrun.http: a request's callback failed: " .. tostring(e)) end
end

-- The request's method (a forwarded one's is read from the request).
local function method_of(req)
  return req[METHOD] or req[FORWARD].method
end

function fail_request(req, err, retry)
  if req[DONE] then return end
  if retry and not req[RETRIED] and IDEMPOTENT[method_of(req)] then
    req[RETRIED] = true
    req[CONN] = false
    return send(req)
  end
  settle(req, nil, string.format("netrun.http: %s %s: %s", method_of(req),
    req[URL], tostring(err)))
end

local REDIRECT = { [301] = true, [302] = true, [303] = true, [307] = true, [308] = true }

function finish(req, res)
  if req[DONE] then return end
  local loc = req[FOLLOW] and not req[FORWARD] and REDIRECT[res.status] and res.headers and
    res.headers.location
  if loc then
    done_timer(req)
    local o = req[OPTS]
    local n = {}
    for k, v in pairs(o) do n[k] = v end
    n.url = resolve_location(req[URL], loc)
    n.follow = req[FOLLOW] - 1
    n.timeout = req[TIMEOUT] > 0 and math.max(0.001, req[DEADLINE] - now()) or 0
    local method = req[METHOD]
    if res.status == 303 or ((res.status == 301 or res.status == 302) and method == "POST") then
      if method ~= "HEAD" then n.method = "GET" end
      n.body = nil
    end
    M.request_with(req[POOL].client, n, function(r, e) settle(req, r, e) end)
    return
  end
  settle(req, res)
end

function on_timeout(req)
  if req[DONE] then return end
  req[POOL].connecting[req] = nil
  local conn = req[CONN]
  settle(req, nil, string.format("netrun.http: %s %s: timeout after %g s",
    method_of(req), req[URL], req[TIMEOUT]))
  if conn and conn.req == req then      -- its answer may still come: drop it
    conn.req = nil
    conn.dead = true
    conn.ch:close()
  end
end

-- Send req through its pool; a retry finds its pool again (an emptied
-- pool leaves the table: it comes back, or the one that replaced it is used).
function send(req)
  local pool = req[POOL]
  local per = pools[pool.client.id]
  local cur = per and per[pool.key]
  if cur ~= pool then
    if cur then
      pool = cur
      req[POOL] = cur
    else
      if per == nil then per = {}; pools[pool.client.id] = per end
      per[pool.key] = pool
    end
  end
  if req[PDEADLINE] then watch(pool, req) end   -- (maybe another pool's timer watched it)
  acquire(pool, req)
end

local CLIENT_KEYS = { pool = true, keepalive = true, timeout = true, tls = true,
                      max_body = true, max_header = true, follow = true, raw = true }
-- A request's options checked: known, of the right types (raises at the
-- level of the call that gave them: core.http.check_request, in C, as
-- every request is checked).
local check_request = core.http.check_request

local function check_number(what, k, v, min)
  if v ~= nil and (type(v) ~= "number" or v ~= v or v < min) then
    error(string.format("%s: %s must be a number >= %s, got %s", what, k, min, tostring(v)), 3)
  end
end

-- Parsed URLs, cached per state (a client fetches the same few URLs
-- again and again): { scheme, host, port, target, Host header } or
-- { false, why }.
local urls, nurls = {}, 0
local function parsed(url)
  local scheme, host, port, target = parse_url(url)
  if not scheme then return { false, host } end
  local hosthdr = port == DEFAULT_PORT[scheme] and host or
    (host:find(":", 1, true) and "[" .. host .. "]:" .. port or host .. ":" .. port)
  return { scheme, host, port, target, hosthdr, scheme .. "://" .. host .. ":" .. port }
end

local METHODS = { GET = true, HEAD = true, POST = true, PUT = true, DELETE = true,
                  PATCH = true, OPTIONS = true }

-- On a loop: run the request with this client's pools; a future of the
-- response, or with cb: nothing, and cb(res) or cb(nil, err) later.
function M.request_with(client, opts, cb)
  local url = opts.url
  local u = urls[url]                   -- (nil for a nil url: parsed says why)
  if u == nil then
    u = parsed(url)
    if type(url) == "string" then
      if nurls >= 1000 then             -- (emptied in place: the lane reads it)
        for k in next, urls do urls[k] = nil end
        nurls = 0
      end
      urls[url], nurls = u, nurls + 1
    end
  end
  local scheme = u[1]
  local fwd = opts.forward
  local method = false                  -- a forwarded request's: read when needed
  if fwd == nil then
    method = opts.method or "GET"
    if METHODS[method] == nil then method = method:upper() end
  elseif scheme and u[4] ~= "/" then
    scheme = false
    u = { false, "a forwarded request's URL names only the origin (no path)" }
  end
  local p
  if cb == nil then p = core.promise() end
  if not scheme then
    local err = string.format("netrun.http: %s %s: bad URL: %s", method or fwd.method,
      tostring(url), u[2])
    if p then return p:set_failure(err) end
    current():execute(function() settle({ [CB] = cb }, nil, err) end)
    return
  end
  local h, hosthdr = opts.headers, nil
  if fwd then              -- the codec merges them with the request's own
    hosthdr = u[5]         -- (and gives Host only to one that has none)
  else
    h = { host = u[5] }
    if opts.headers then
      for k, v in pairs(opts.headers) do
        local b = type(k) == "string" and byte(k) or nil
        if (b == 72 or b == 104) and k ~= "host" and k:lower() == "host" then h.host = nil end
        h[k] = v
      end
    end
  end
  local timeout = opts.timeout or client.timeout
  -- a limit other than the client's gets connections of its own
  local mb, key = opts.max_body, u[6]
  if mb == nil or mb == client.max_body then
    mb = client.max_body
  else
    mb = math.tointeger(mb)
    key = scheme .. "+" .. mb .. "://" .. u[2] .. ":" .. u[3]
  end
  local per = pools[client.id]
  local pool = per and per[key] or pool_of(client, key, scheme, u[2], u[3], mb)
  -- the request table is also the message the codec writes (its first
  -- slots: lhttp_client.c); every slot is given here, so that the array
  -- is made whole at once and later stores find their slots
  local follow = opts.follow or client.follow
  if follow and follow > 0 then follow = math.tointeger(follow) else follow = false end
  local req = {
    pool, method, not fwd and u[4] or false, h or false, opts.body or false, fwd or false,
    hosthdr or false, url, p or false, cb or false, timeout,
    timeout > 0 and now() + timeout or math.huge, false, false, false, false, false,
    opts.tls or false, follow, follow and opts,
  }
  if timeout > 0 then
    if timeout == client.timeout then watch(pool, req)
    else req[TIMER] = pool.loop:schedule(timeout, function() on_timeout(req) end) end
  end
  acquire(pool, req)
  return p
end

-- ---- the public side ------------------------------------------------------------------

local Client = {}
Client.__index = Client
M.Client = Client

local main_group                 -- the daemon group of main-thread requests

local function on_loop(client, opts)
  if current() ~= nil then return M.request_with(client, opts) end
  main_group = main_group or require("netrun").group { threads = 1, name = "http", daemon = true }
  local p = core.promise()
  main_group:next():execute(function(c, o, pr)
    require("netrun.http").request_with(c, o):add_listener(function(f)
      if f:is_success() then pr:try_success(f:result()) else pr:try_failure(f:cause()) end
    end)
  end, client, opts, p)
  return p
end

-- client:request(opts) --> future; client:request(opts, callback): on a
-- loop, no future: callback(res) or callback(nil, err) runs on this loop
-- (cheaper: the response is not copied through a future).
local lane_request             -- core.http.lane's (made at the end)

function Client:request(opts, callback)
  if lane_request(self, opts, callback) then return end   -- the usual path, in C
  if getmetatable(self) ~= Client then
    error("netrun.http client: call it as client:request { ... }", 2)
  end
  check_request(opts)
  if callback == nil then return on_loop(self, opts) end
  if type(callback) ~= "function" then
    error("netrun.http client: the callback must be a function, got " .. type(callback), 2)
  end
  if current() == nil then
    error("netrun.http client: a callback runs on the caller's loop: call request with " ..
      "one on a loop (the main thread is not one: use the future)", 2)
  end
  M.request_with(self, opts, callback)
end

function Client:__tostring()
  return string.format("netrun.http.client(%s, pool = %d, keepalive = %g, timeout = %g)",
    self.id, self.pool, self.keepalive, self.timeout)
end

-- Clients are told apart across states by an id unique in the process.
local function new_id()
  local d = core.dict("netrun.http", { capacity = 16 })
  return "c" .. d:incr("clients", 1, 0)
end

function M.client(opts)
  local what = "netrun.http.client"
  if opts ~= nil and type(opts) ~= "table" then
    error(what .. ": options must be a table, got " .. type(opts), 2)
  end
  opts = opts or {}
  for k in pairs(opts) do
    if not CLIENT_KEYS[k] then error(what .. ": unknown option '" .. tostring(k) .. "'", 2) end
  end
  check_number(what, "pool", opts.pool, 1)
  check_number(what, "keepalive", opts.keepalive, 0)
  check_number(what, "timeout", opts.timeout, 0)
  check_number(what, "max_body", opts.max_body, 0)
  check_number(what, "max_header", opts.max_header, 64)
  if opts.raw ~= nil and type(opts.raw) ~= "boolean" then
    error(what .. ": raw must be a boolean, got " .. type(opts.raw), 2)
  end
  return setmetatable({
    id = new_id(), pool = math.tointeger(opts.pool or M.pool),
    keepalive = opts.keepalive or M.keepalive, timeout = opts.timeout or M.timeout,
    tls = opts.tls, max_body = math.tointeger(opts.max_body or M.max_body),
    max_header = math.tointeger(opts.max_header or M.max_header), follow = opts.follow,
    raw = opts.raw == true,
  }, Client)
end

local default_client
function M.request(opts)
  check_request(opts)
  default_client = default_client or M.client()
  default_client.id = "default"         -- the same pools in every state
  return on_loop(default_client, opts)
end

-- The TLS config of https requests that give none: the system's CAs,
-- the host name verified.
local default_tls
function M.default_tls()
  default_tls = default_tls or core.tls.client {}
  return default_tls
end

-- For tests: this state's pools as { [client id] = { [origin] = { idle, total, waiting } } }.
function M.stats()
  local out = {}
  for id, per in pairs(pools) do
    out[id] = {}
    for key, pool in pairs(per) do
      out[id][key] = { idle = pool.nidle, total = pool.total,
                       waiting = pool.wtail - pool.whead + 1 }
    end
  end
  return out
end

-- The pool's usual path in C (runtime/bindings/lhttp_pool.c): a request
-- with a callback taking an idle connection, and a response that puts its
-- connection back, walk the tables above there; anything else comes here.
local lane_read
lane_request, lane_read = core.http.lane {
  Client = Client, pools = pools, urls = urls, watch = watch,
  slow_read = Conn.channel_read, traceback = traceback,
}
Conn.channel_read = lane_read

return M
