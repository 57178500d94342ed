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
  if req.done then return end            -- timed out meanwhile
  if req.follow then return finish(req, res) end
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
             loop = current(), dhead = false, dtail = false, dtimer = false }
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
    if not req.done then
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
    return lost(pool)
  end
  while pool.whead <= pool.wtail do
    local req = pool.waiters[pool.whead]
    pool.waiters[pool.whead] = nil
    pool.whead = pool.whead + 1
    if not req.done then return start(conn, req, true) end
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
  req.conn = conn
  -- no future per request: the codec converts the request as it is
  -- written, and a field it cannot send (a header that is not a token,
  -- say) reaches exception_caught at once, nothing sent: the connection
  -- closes and channel_inactive fails the request with the codec's reason
  conn.ctx:write_and_flush(req, VOID)
end

function connect(pool, req)
  local client = pool.client
  local mh, mb, raw = client.max_header, pool.max_body, client.raw
  local tls = pool.scheme == "https" and (req.tls or client.tls or M.default_tls()) or nil
  local left = req.deadline - now()
  if left == math.huge then left = nil             -- no bound: connect's own
  elseif left <= 0 then left = 0.001 end
  local ok, f = pcall(require("netrun").connect, {
    group = pool.loop, host = pool.host, port = pool.port, timeout = left, tls = tls,
    init = function(ch) require("netrun.http").attach(ch, mh, mb, raw) end,
  })
  if not ok then
    fail_request(req, tostring(f))
    return lost(pool)
  end
  f:add_listener(function(cf)
    if not cf:is_success() then
      local cause = tostring(cf:cause()):gsub("^netrun%.connect: ", "")
      fail_request(req, "connect: " .. cause)
      return lost(pool)
    end
    local ch = cf:result()
    local conn = live[ch]
    conn.pool = pool
    if not ch:is_active() then conn.dead = true end
    if req.done or conn.dead then       -- timed out meanwhile: keep it
      return release(conn)
    end
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
  pool.wtail = pool.wtail + 1
  pool.waiters[pool.wtail] = req
end

-- ---- requests -----------------------------------------------------------------------

-- Deadlines. A request with its client's timeout joins its pool's
-- deadline list at the tail: the deadlines are now + the same timeout, so
-- the list is in deadline order, and one timer per pool, set for the
-- head's, expires them (no timer and no closure per request). A request
-- with a timeout of its own gets a timer of its own.
local on_timeout

local function unlink(req)
  local pool, prev, nxt = req.dpool, req.dprev, req.dnext
  if prev then prev.dnext = nxt else pool.dhead = nxt end
  if nxt then nxt.dprev = prev else pool.dtail = prev end
  req.dpool, req.dprev, req.dnext = false, false, false
end

local function expire(pool)
  pool.dtimer = false
  local t = now()
  local head = pool.dhead
  while head and head.deadline <= t do
    on_timeout(head)                     -- unlinks it (settle, done_timer)
    if pool.dhead == head then unlink(head) end
    head = pool.dhead
  end
  if head then
    pool.dtimer = pool.loop:schedule(math.max(head.deadline - t, 0.001), expire, pool)
  end
end

local function add_deadline(pool, req)
  local tail = pool.dtail
  req.dpool, req.dprev = pool, tail
  if tail then tail.dnext = req else pool.dhead = req end
  pool.dtail = req
  if not pool.dtimer then
    pool.dtimer = pool.loop:schedule(req.timeout, expire, pool)
  end
end

local function done_timer(req)
  if req.dpool then unlink(req)
  elseif req.timer then req.timer:cancel(); req.timer = nil end
  req.done = true
end

local IDEMPOTENT = { GET = true, HEAD = true, OPTIONS = true, PUT = true, DELETE = true,
                     TRACE = true }

local send

-- The request's end: its future completes, or its callback runs (an error
-- in it is logged; it never reaches the connection's handler).
function settle(req, res, err)
  if req.dpool then unlink(req)          -- (done_timer, inline: once per request)
  elseif req.timer then req.timer:cancel(); req.timer = nil end
  req.done = true
  local cb = req.cb
  if cb == nil then
    if res then req.promise:try_success(res) else req.promise:try_failure(err) end
    return
  end
  local ok, e = xpcall(cb, traceback, res, err)
  if not ok then core.log(3, "netrun.http: a request's callback failed: " .. tostring(e)) end
end

-- The request's method (a forwarded one's is read from the request).
local function method_of(req)
  return req.method or req.forward.method
end

function fail_request(req, err, retry)
  if req.done then return end
  if retry and not req.retried and IDEMPOTENT[method_of(req)] then
    req.retried = true
    req.conn = false
    return send(req)
  end
  settle(req, nil, string.format("netrun.http: %s %s: %s", method_of(req),
    req.url, tostring(err)))
end

local REDIRECT = { [301] = true, [302] = true, [303] = true, [307] = true, [308] = true }

function finish(req, res)
  if req.done then return end
  local loc = req.follow and not req.forward and REDIRECT[res.status] and res.headers and
    res.headers.location
  if loc then
    done_timer(req)
    local o = req.opts
    local n = {}
    for k, v in pairs(o) do n[k] = v end
    n.url = resolve_location(req.url, loc)
    n.follow = req.follow - 1
    n.timeout = req.timeout > 0 and math.max(0.001, req.deadline - now()) or 0
    local method = req.method
    if res.status == 303 or ((res.status == 301 or res.status == 302) and method == "POST") then
      if method ~= "HEAD" then n.method = "GET" end
      n.body = nil
    end
    M.request_with(req.pool.client, n, function(r, e) settle(req, r, e) end)
    return
  end
  settle(req, res)
end

function on_timeout(req)
  if req.done then return end
  local conn = req.conn
  settle(req, nil, string.format("netrun.http: %s %s: timeout after %g s",
    method_of(req), req.url, req.timeout))
  if conn and conn.req == req then      -- its answer may still come: drop it
    conn.req = nil
    conn.dead = true
    conn.ch:close()
  end
end

-- Send req through its pool; a retry finds its pool again (an emptied
-- pool leaves the table: it comes back, or the one that replaced it is used).
function send(req)
  local pool = req.pool
  local per = pools[pool.client.id]
  local cur = per and per[pool.key]
  if cur ~= pool then
    if cur then
      pool = cur
      req.pool = cur
    else
      if per == nil then per = {}; pools[pool.client.id] = per end
      per[pool.key] = pool
    end
  end
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
      if nurls >= 1000 then urls, nurls = {}, 0 end
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
    current():execute(function() settle({ cb = cb }, nil, err) end)
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
  -- the request table is also the message the codec writes (it reads
  -- method, path, headers, body, forward and host); fields that are nil
  -- for most requests are set apart, so that the constructor sizes it for
  -- the rest
  local req = {
    pool = pool, url = url, promise = p, cb = cb, method = method,
    path = not fwd and u[4] or nil, headers = h, body = opts.body, forward = fwd,
    host = hosthdr, timeout = timeout, deadline = timeout > 0 and now() + timeout or math.huge,
    dpool = false, dprev = false, dnext = false, conn = false, done = false,
  }
  if opts.tls then req.tls = opts.tls end
  local follow = opts.follow or client.follow
  if follow and follow > 0 then req.follow, req.opts = math.tointeger(follow), opts end
  if timeout > 0 then
    if timeout == client.timeout then add_deadline(pool, req)
    else req.timer = pool.loop:schedule(timeout, function() on_timeout(req) end) end
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
function Client:request(opts, callback)
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

return M
