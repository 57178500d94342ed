--- The HTTP/1.1 client: `netrun.http`, loaded on first use.
--
-- Requests run on the caller's loop, on keep-alive connections pooled per
-- loop, origin and TLS settings; from the main thread (a script, the REPL)
-- they run on a loop of a group of their own and `sync`/`await` block until
-- done. Futures fail with the method, URL and cause (a bad URL, a refused or
-- timed-out connect, `timeout after N s`, a reset mid-response, a body over
-- `max_body`, a malformed response); a connection that failed is never
-- reused, and an idempotent request whose reused connection was closed
-- before answering is sent once more. Host names resolve through
-- `netrun.dns`; `https` verifies the server against the system's CAs and
-- the host name unless a `tls` config says otherwise. The defaults are
-- fields of the module: `pool` (64), `keepalive` (60), `timeout` (5),
-- `max_body` (1 MiB), `max_header` (16384), `max_waiting` (1024). Limits:
-- docs/guide/limits.md; the whole story: docs/guide/http-client.md.
-- @module netrun.http

--- A request's options (`request`, `client:request`):
-- @table request_options
-- @string url the absolute URL, `http://` or `https://` (for `forward`: the origin only)
-- @tparam[opt] upstream upstream instead of url: a pool of servers (`netrun.http.upstream`); each try goes to one of them, an idempotent request that failed to another
-- @string[opt="/"] path with upstream: the path and query
-- @string[opt="GET"] method the method
-- @tparam[opt] table headers header fields (an array value repeats a field)
-- @param[opt] body the body, a string (Content-Length is set); with `stream`, also a function returning the next chunk, nil at the end (sent chunked)
-- @number[opt=5] timeout seconds for the whole request: lookup, connect, TLS, response (0: none)
-- @int[opt=1048576] max_body the largest response body
-- @param[opt] tls a `netrun.tls.client` config
-- @int[opt=0] follow redirects to follow
-- @bool[opt=false] follow_downgrade follow a redirect from https to http
-- @param[opt] forward a request of `netrun.codec.http_server` to send on as it came (proxies)
-- @bool[opt=false] stream on a loop: the response head first (no `body`), then its body with `res:read()` (in a coroutine: the next piece, nil at the end, or nil, err) or `res:each(fn)`; a connection of its own, read one piece ahead at most

-- netrun.http: the HTTP/1.1 client (DESIGN.md §8.3) on the native codec
-- netrun.codec.http_client.
--
--   netrun.http.request { method = "GET", url = "https://a.example/x",
--                         headers = {}, body = nil, timeout = 5,
--                         max_body = 1 << 20, tls = nil, follow = 0,
--                         follow_downgrade = false, forward = nil }
--     --> future of { status = 200, headers = { lowercased }, body = "...",
--                     reason, version, keep_alive }
--   local client = netrun.http.client { pool = 64, keepalive = 60,
--                                       timeout = 5, tls = ..., max_body = ...,
--                                       max_waiting = 1024 }
--   client:request { ... } --> future
--
-- Connections: each client keeps, per loop (in that loop's own Lua state)
-- and per origin (scheme, host, port) and TLS settings (the identity of
-- the request's TLS config, else the client's, else the default: a
-- request never takes a connection made under other settings, and a
-- reload that changes a config's settings retires the connections made
-- before it), up to `pool` connections; a response that leaves its
-- connection usable puts it back (idle ones close after `keepalive`
-- seconds), and a request finding every connection busy waits for one, up
-- to `max_waiting` per pool (past it a request fails at once: a backend
-- that cannot keep up does not grow the line without bound). netrun.http.request uses one default client. One request
-- at a time per connection (no pipelining: a slow response would hold up
-- the ones behind it). The pools are C (runtime/bindings/http/lhttp_pool.c):
-- this module reads a request's options and hands it to its pool.
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
-- forward = req (a request option, for proxies; false: none): req is a
-- request of netrun.codec.http_server, sent on as it came (method, target, end-to-end
-- fields, body: the client codec encodes it from the server codec's
-- bytes); url names only the origin; headers given are added and replace
-- forwarded fields of their names; fields the handler assigned win.
--
-- client:forwarder { url = origin, headers = ... } (for proxies): a
-- function forward(req, callback), client:request with those options and
-- forward = req, the options checked once.
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
-- turn into a GET without body or the fields describing it). A redirect
-- to another origin (scheme, host or port) leaves Authorization, Cookie,
-- Proxy-Authorization and a given Host behind; one from https to http
-- fails the request ("redirect from https to http refused") unless
-- follow_downgrade = true (a request's or the client's option).
--
-- Threads: on a loop the connections live on that loop. From the main
-- thread (a script, the REPL) the request runs on a loop of a group of
-- its own ("http", one thread) and its future's result is copied back;
-- await/sync there blocks until it is done.
local core = require "netrun.core"

local M = {
  pool = 64, keepalive = 60, timeout = 5, max_body = 1 << 20, max_header = 16384,
  max_waiting = 1024, h2 = "auto",
  unescape = core.http.unescape,         -- + and %XX decoded (the server's)
}

--- Decode a URL component as the server codec decodes `req.args`: `+` as
-- a space and `%XX` escapes.
-- @function unescape
-- @string s the component
-- @treturn string the decoded text

local pools = {}              -- client id -> origin [# TLS identity] -> pool (this state's)
local by_id = {}              -- pool number -> pool (for connections' init)
local codecs, ncodecs = {}, 0 -- "max_header max_body" -> codec config
local now = core.now
local tls_identity = core.tls.identity

-- The loop running this state (nil: the main thread): a state lives on
-- one thread for life, so it is asked once.
local here
local function current()
  if here == nil then here = core.current() or false end
  return here or nil
end
local byte = string.byte

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

-- ---- pools ------------------------------------------------------------------------

-- Each pool (client, origin, body limit) on this loop is a
-- core.http.pool (runtime/bindings/http/lhttp_pool.c): its connections, its
-- line of waiting requests, its timers and its rules are there. What it
-- asks of this side: open a connection, and forget it once it empties.

-- In a new connection's init (on its loop): the codec and the pool's
-- handler.
function M.attach(ch, max_header, max_body, raw, id, h2)
  local key = max_header .. " " .. max_body .. (raw and " raw" or "") .. " " .. tostring(h2)
  local codec = codecs[key]
  if codec == nil then
    codec = core.codec.http_client { max_header = max_header, max_body = max_body, raw = raw,
                                     h2 = h2 }
    ncodecs = ncodecs + 1
    if ncodecs > 64 then codecs, ncodecs = {}, 1 end   -- (a limit per request
    codecs[key] = codec                                 -- makes one each)
  end
  local p = ch:pipeline()
  p:add_last("http", codec)
  p:add_last("client", by_id[id] or error("netrun.http: the pool of this connection is gone"))
end

local npools = 0

local function pool_of(client, key, scheme, host, port, max_body, tls)
  local per = pools[client.id]
  if per == nil then per = {}; pools[client.id] = per end
  local pool = per[key]
  if pool ~= nil then return pool end
  npools = npools + 1
  local id, loop = npools, current()
  local mh, raw, h2 = client.max_header, client.raw, client.h2
  -- open a connection for the pool (tls and the time left: the request's
  -- that asked); an error string if it could not even start
  local function connect(P, tls, left)
    tls = scheme == "https" and (tls or client.tls or M.default_tls(h2)) or nil
    local ok, f = pcall(require("netrun").connect, {
      group = loop, host = host, port = port, timeout = left, tls = tls,
      init = function(ch) require("netrun.http").attach(ch, mh, max_body, raw, id, h2) end,
    })
    if not ok then return tostring(f) end
    f:add_listener(function(cf)
      if cf:is_success() then
        -- (a turn later: TLS completes the future before it tells the
        -- codec which protocol ALPN agreed, and h2 must be known first)
        return loop:execute(function() P:connected(cf:result()) end)
      end
      P:connect_failed("connect: " .. tostring(cf:cause()):gsub("^netrun%.connect: ", ""))
    end)
  end
  -- emptied: a client dropped leaves nothing (a request for the origin
  -- later makes a pool again)
  local function empty(P)
    local p = pools[client.id]
    if p and p[key] == P then
      p[key] = nil
      if next(p) == nil then pools[client.id] = nil end
    end
    by_id[id] = nil
  end
  -- https: the config its connections are made with, watched for reloads
  -- (a request with another config's identity goes to another pool)
  pool = core.http.pool { max = client.pool, keepalive = client.keepalive,
                          max_waiting = client.max_waiting,
                          h2 = h2 == true or (h2 == "auto" and scheme == "https"),
                          connect = connect, empty = empty,
                          tls = scheme == "https" and (tls or client.tls or M.default_tls(h2)) or nil }
  per[key], by_id[id] = pool, pool
  return pool
end

-- ---- requests -----------------------------------------------------------------------

local REDIRECT = { [301] = true, [302] = true, [303] = true, [307] = true, [308] = true }

-- Fields a redirect to another origin (scheme, host or port) leaves
-- behind: credentials meant for the first one, and a Host given for it
-- (curl since CVE-2018-1000007 and CVE-2022-27776, the Fetch standard,
-- Go's http.Client).
local CROSS_ORIGIN = { authorization = true, cookie = true, ["proxy-authorization"] = true,
                       host = true }
-- Fields that describe a body, left behind when a redirect drops it (a
-- 303, or a 301/302 after a POST, turned into a GET; the Fetch standard's
-- request-body-header names, and the framing).
local OF_BODY = { ["content-type"] = true, ["content-length"] = true,
                  ["transfer-encoding"] = true, ["content-encoding"] = true,
                  ["content-language"] = true, ["content-location"] = true }

-- The headers table h without the fields named (lowercase) in drop.
local function without(h, drop)
  local out
  for k, v in pairs(h) do
    if type(k) == "string" and drop[k:lower()] then
      if out == nil then              -- (copied only when something goes)
        out = {}
        for k2, v2 in pairs(h) do out[k2] = v2 end
      end
      out[k] = nil
    end
  end
  return out or h
end

-- A request that follows redirects: its target (callback or promise) gets
-- the response after the redirects, each one a request of its own with
-- the time left. To another origin the credentials and a given Host stay
-- behind; from https to http it stops with an error unless
-- follow_downgrade (a request's, else the client's) allows it.
local function following(client, opts, url, method, follow, timeout, target)
  local t0 = now()
  local function finish(r, e)
    if type(target) == "function" then return target(r, e) end
    if r then target:try_success(r) else target:try_failure(e) end
  end
  return function(res, err)
    local loc = res and REDIRECT[res.status] and res.headers and res.headers.location
    if not loc then return finish(res, err) end
    local n = {}
    for k, v in pairs(opts) do n[k] = v end
    n.url = resolve_location(url, loc)
    n.follow = follow - 1
    n.timeout = timeout > 0 and math.max(0.001, t0 + timeout - now()) or 0
    local s1, h1, p1 = parse_url(url)
    local s2, h2, p2 = parse_url(n.url)      -- (a bad one fails as the request)
    if s1 == "https" and s2 == "http" then
      local allow = opts.follow_downgrade
      if allow == nil then allow = client.follow_downgrade end
      if not allow then
        return finish(nil, string.format("netrun.http: %s %s: redirect from https to http " ..
          "refused (follow_downgrade): %s", method, url, n.url))
      end
    end
    local h = opts.headers
    if h and s2 and (s1 ~= s2 or h1 ~= h2 or p1 ~= p2) then h = without(h, CROSS_ORIGIN) end
    if res.status == 303 or ((res.status == 301 or res.status == 302) and method == "POST") then
      if method ~= "HEAD" then n.method = "GET" end
      n.body = nil
      if h then h = without(h, OF_BODY) end
    end
    n.headers = h
    return M.request_with(client, n, finish)
  end
end

-- A request's options checked: known, of the right types (raises at the
-- caller's line: core.http.check_request, in C, as every request is
-- checked); it returns them, or a copy whose numeric strings are numbers.
local check_request = core.http.check_request
-- The client's and the forwarder's, by lopts.c's readers (core.options).
local check_client = core.options("netrun.http.client", {
  pool = "integer 1", max_waiting = "integer 0", keepalive = "seconds", timeout = "seconds",
  max_body = "size 0", max_header = "size 64", follow = "integer 0", raw = "boolean",
  follow_downgrade = "boolean", tls = "tls.client", h2 = "any" })
local check_forwarder = core.options("netrun.http client:forwarder",
  { url = "string", upstream = "table", headers = "table", stream = "boolean", buffer = "size 1" })

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

-- ---- streamed responses (stream = true) -------------------------------------------

-- A request whose response body is read as it comes, on a connection of
-- its own (not pooled: closed once the body ended): its target gets the
-- head (res, without body) as soon as it is whole; res:read() then
-- returns the body's next piece, nil at its end, or nil, err. The
-- connection reads one piece ahead at most: while a piece waits for
-- res:read(), it reads nothing (the server's send blocks), so a reader
-- slower than the server holds one read, not the body.
local streams, nstreams = {}, 0

-- In the connection's init (on its loop): the codec, in streaming mode,
-- and the request's handler.
function M.attach_stream(ch, id)
  local st = streams[id]
  if st == nil then return ch:close() end
  st.ch = ch
  ch:pipeline():add_last("http", core.codec.http_client {
    max_header = st.max_header, max_body = st.max_body, stream = true })
  ch:pipeline():add_last("stream", st.handler)
end

local function stream_request(client, opts, u, method, h, mb, timeout, target)
  local st = { first = 1, last = 0, max_header = client.max_header, max_body = mb }
  local loop = current()
  nstreams = nstreams + 1
  local id = nstreams
  streams[id] = st
  local head_sent, finished = false, false
  local what = string.format("netrun.http: %s %s", method, opts.url)
  local timer
  local function deliver(res, err)
    if head_sent then return end
    head_sent = true
    if timer then timer:cancel(); timer = nil end
    if type(target) == "function" then
      local ok, e = xpcall(target, debug.traceback, res, err)
      if not ok then core.log(3, "netrun.http: a request's callback failed: " .. tostring(e)) end
    elseif res then target:try_success(res) else target:try_failure(err) end
  end
  local function wake()
    local w = st.waiter
    if w then st.waiter = nil; w:try_success(true) end
  end
  local function finish(err)                -- the body ended, or failed
    if finished then return end
    finished = true
    streams[id] = nil
    if err and not st.err then st.err = err end
    st.done = true
    if st.ch and st.ch:is_open() then st.ch:close() end
    if not head_sent then
      return deliver(nil, st.err or (what .. ": the connection closed before a response"))
    end
    if st.each then st.each(nil, st.err) end
    wake()
  end
  -- res:each(fn): the callback form -- fn(piece) as each comes (what
  -- waited first), then fn(nil) at the end or fn(nil, err).
  local function each(_, fn)
    if type(fn) ~= "function" then
      error("res:each(fn): fn must be a function, got " .. type(fn), 2)
    end
    st.each = fn
    for i = st.first, st.last do
      local d = st[i]
      st[i] = nil
      fn(d)
    end
    st.first, st.last = 1, 0
    if st.done then return fn(nil, st.err) end
    if st.ch then st.ch:option("auto_read", true) end
  end
  local function read(_)
    while true do
      if st.first <= st.last then
        local d = st[st.first]
        st[st.first] = nil
        st.first = st.first + 1
        if st.first > st.last then
          st.first, st.last = 1, 0
          if not st.done and st.ch then st.ch:option("auto_read", true) end
        end
        return d
      end
      if st.err then return nil, st.err end
      if st.done then return nil end
      st.waiter = core.promise()
      if st.ch then st.ch:option("auto_read", true) end
      st.waiter:await()
    end
  end
  st.handler = {
    channel_read = function(_, ctx, m)
      if m.type == "body" then
        if st.each then
          if #m.data > 0 then st.each(m.data) end
          if m.last then st.trailers = m.trailers; finish(nil) end
          return
        end
        if #m.data > 0 then
          st.last = st.last + 1
          st[st.last] = m.data
          ctx.channel:option("auto_read", false)   -- until res:read() takes it
        end
        if m.last then
          st.trailers = m.trailers
          st.done = true
          finish(nil)
        end
        wake()
        return
      end
      if m.streaming then
        m.streaming = nil
        m.read, m.each = read, each
        deliver(m)
      else                                  -- no body (204, 304, HEAD, 0 bytes)
        local body = m.body
        m.body = nil
        m.read, m.each = read, each
        if #body > 0 then st.last = 1; st[1] = body end
        deliver(m)
        finish(nil)
      end
    end,
    exception_caught = function(_, ctx, err)
      finish(what .. ": " .. tostring(err))
    end,
    channel_writability_changed = function(_, ctx)
      if st.pump and ctx.channel:is_writable() then st.pump() end
      ctx:fire_channel_writability_changed()
    end,
    channel_inactive = function(_, ctx)
      if not st.done then
        finish(what .. (head_sent and ": the connection closed in the middle of the body"
                                    or ": the connection closed before a response"))
      end
    end,
  }
  local tls = u[1] == "https" and (opts.tls or client.tls or M.default_tls()) or nil
  -- the time for the connect, and for the head once the request is sent
  -- (not while a body function's chunks are going out: an upload takes
  -- what it takes, each chunk paced by the connection)
  local function arm()
    if timer then timer:cancel() end
    timer = nil
    if timeout and timeout > 0 and not head_sent then
      timer = loop:schedule(timeout, function()
        timer = nil
        if not head_sent then finish(what .. ": timeout after " .. timeout .. " s") end
      end)
    end
  end
  arm()
  local ok, f = pcall(require("netrun").connect, {
    group = loop, host = u[2], port = u[3], timeout = timeout > 0 and timeout or nil, tls = tls,
    init = function(ch) require("netrun.http").attach_stream(ch, id) end,
  })
  if not ok then return finish(what .. ": " .. tostring(f)) end
  f:add_listener(function(cf)
    if not cf:is_success() then
      return finish(what .. ": connect: " .. tostring(cf:cause()):gsub("^netrun%.connect: ", ""))
    end
    local ch = cf:result()
    if finished then return ch:close() end
    local body = opts.body
    if type(body) == "function" then        -- chunked, as the connection takes it
      h["transfer-encoding"] = "chunked"
      ch:write({ method = method, path = u[4], headers = h })
      if timer then timer:cancel(); timer = nil end     -- (armed again at its end)
      st.pump = function()
        while st.pump and ch:is_open() do
          local ok, d = pcall(body)
          if not ok then
            st.pump = nil
            return finish(what .. ": the body function failed: " .. tostring(d))
          end
          if d == nil or d == "" then
            st.pump = nil
            arm()
            return ch:write_and_flush("0\r\n\r\n")
          end
          if type(d) ~= "string" then
            st.pump = nil
            return finish(what .. ": the body function returned a " .. type(d) .. ", not a string")
          end
          ch:write(string.format("%x\r\n", #d))
          ch:write(d)
          ch:write("\r\n")
          ch:flush()
          if not ch:is_writable() then return end   -- on when it drains
        end
      end
      return st.pump()
    end
    ch:write_and_flush({ method = method, path = u[4], headers = h, body = body })
      :add_listener(function(wf)
        if not wf:is_success() then finish(what .. ": " .. tostring(wf:cause())) end
      end)
  end)
end

-- On a loop: run the request with this client's pools; a future of the
-- response, or with cb: nothing, and cb(res) or cb(nil, err) later.
function M.request_with(client, opts, cb)
  if opts.upstream ~= nil then          -- a server of the pool per try
    return require("netrun.upstream").request(M, client, opts, cb)
  end
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
  local fwd = opts.forward or nil       -- (false: none)
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
    current():execute(function()      -- (later, as any failure comes)
      local ok, e = xpcall(cb, debug.traceback, nil, err)
      if not ok then core.log(3, "netrun.http: a request's callback failed: " .. tostring(e)) end
    end)
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
  -- a TLS config of the request's own: connections of their own, shared
  -- only with requests whose config has the same identity (the same
  -- settings and files)
  local tls = opts.tls
  if tls ~= nil and scheme == "https" and tls ~= client.tls then
    key = key .. "#" .. tls_identity(tls)
  end
  if opts.stream then
    if fwd or current() == nil then
      local err = string.format("netrun.http: %s %s: stream = true takes a request of " ..
        "its own (no forward), on a loop (netrun.spawn)", method or "forward", tostring(url))
      if p then p:set_failure(err) else cb(nil, err) end
      return p
    end
    stream_request(client, opts, u, method, h, mb, timeout, cb or p)
    return p
  end
  local per = pools[client.id]
  local pool = per and per[key] or pool_of(client, key, scheme, u[2], u[3], mb, tls)
  local target = cb or p
  local follow = not fwd and (opts.follow or client.follow)
  if follow and follow > 0 then
    target = following(client, opts, url, method, math.tointeger(follow), timeout, target)
  end
  if not pool:send(target, method, not fwd and u[4] or false, h or false, opts.body or false,
                   fwd or false, hosthdr or false, url, timeout, tls or false) then
    -- retired: its config was reloaded with other settings; a new pool
    -- for the key (the retired one finishes what it has)
    per = pools[client.id]
    if per and per[key] == pool then per[key] = nil end
    pool = pool_of(client, key, scheme, u[2], u[3], mb, tls)
    pool:send(target, method, not fwd and u[4] or false, h or false, opts.body or false,
              fwd or false, hosthdr or false, url, timeout, tls or false)
  end
  return p
end

-- ---- the public side ------------------------------------------------------------------

local Client = {}
Client.__index = Client
M.Client = Client

-- The group of main-thread requests. Not a daemon: a script ends once
-- nothing of it is alive (netrun.run), and this loop is alive only while
-- a request is under way (an idle pooled connection keeps nothing alive).
-- One per simulated world too (netrun.sim: core.sim_id).
local main_group
local main_world = 0

local function on_loop(client, opts)
  if opts.upstream ~= nil then require("netrun.upstream").check_request(opts) end
  if current() ~= nil then return M.request_with(client, opts) end
  if opts.stream then        -- (res:read() lives in the loop's state)
    error("netrun.http: stream = true runs on a loop: in netrun.spawn, a handler or a task", 3)
  end
  if main_group == nil or main_world ~= core.sim_id() then
    main_group = require("netrun").group { threads = 1, name = "http" }
    main_world = core.sim_id()
  end
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
-- (cheaper: the response is not copied through a future). Client.request
-- is core.http.lane's (set at the end): it checks the options and sends
-- the usual request (a callback, a URL seen before, nothing of its own)
-- itself, in C; any other comes here, checked (errors at the caller of
-- client:request: core.raise names the first line outside netrun).
local function request_other(self, opts, callback)
  if getmetatable(self) ~= Client then
    core.raise("netrun.http client: call it as client:request { ... }")
  end
  if callback == nil then return on_loop(self, opts) end
  if type(callback) ~= "function" then
    core.raise("netrun.http client: the callback must be a function, got " .. type(callback))
  end
  if current() == nil then
    core.raise("netrun.http client: a callback runs on the caller's loop: call request with " ..
      "one on a loop (the main thread is not one: use the future)")
  end
  M.request_with(self, opts, callback)
end

--- An HTTP client, made by `client`.
-- @type client

--- A proxy's request path with its options checked once: returns
-- `forward(req, callback)`, which is `client:request({ url = origin,
-- forward = req, headers = headers }, callback)` for a request `req` of
-- `netrun.codec.http_server`, on a loop. The headers table is read as
-- each request is written. Hop-by-hop fields, Content-Length and Expect
-- stay behind; fields a handler assigned to `req` win.
-- @function client:forwarder
-- @tparam table opts
-- @string opts.url the origin (`http://backend:8080`; no path)
-- @tparam[opt] upstream opts.upstream instead of url: a pool of servers (`netrun.http.upstream`), the server picked per request, an idempotent request that failed sent to another (with `stream`: only while nothing of its answer went to the client and nothing of its body was taken from it)
-- @tparam[opt] table opts.headers fields added, replacing forwarded ones of the same names
-- @bool[opt=false] opts.stream stream the exchange in C: `forward(req, callback, ctx)`
-- takes a request of a `body = "stream"` codec (or any), sends its body to a pooled
-- backend connection as it arrives and writes the response to `ctx` (the client
-- handler's) piece by piece; `callback(true)` when the exchange is over,
-- `callback(nil, err, again)` when nothing was written (answer 502/504; `again`:
-- nothing of the request's body was taken from the client either),
-- `callback(false, err, cut)` when the client's connection is done (closed, or
-- answered by the codec; `cut`: the backend failed after its head went on)
-- @int[opt=65536] opts.buffer with `stream`: the bytes held per direction (the
-- backend connection's write_buffer_high; give the client's the same)
-- @treturn function forward(req, callback)
-- @usage local forward = client:forwarder { url = "http://127.0.0.1:8080" }
-- forward(req, function(res, err) ctx:write(res and res.response or bad_gateway) end)
function Client:forwarder(opts)
  local what = "netrun.http client:forwarder"
  if getmetatable(self) ~= Client then core.raise(what .. ": call it as client:forwarder { ... }") end
  opts = check_forwarder(opts)
  if opts.upstream ~= nil then
    if opts.url ~= nil then core.raise(what .. ": give url or upstream, not both") end
    if opts.stream and self.h2 == true then
      core.raise(what .. ": stream = true speaks HTTP/1.1 to the backend (h2 = true)")
    end
    return require("netrun.upstream").forwarder(self, opts)
  end
  if opts.url == nil then core.option_error(what, "url", nil, "a string (or give upstream)") end
  local url, headers = opts.url, opts.headers
  local u = parsed(url)
  if not u[1] then core.raise(what .. ": bad URL: " .. tostring(u[2])) end
  if u[4] ~= "/" then core.raise(what .. ": the URL names only the origin (no path)") end
  if opts.stream then                   -- (no pool yet, or a stale one: made)
    if self.h2 == true then core.raise(what .. ": stream = true speaks HTTP/1.1 to the backend (h2 = true)") end
    local function pool()
      local per = pools[self.id]
      if per then per[u[6]] = nil end
      return pool_of(self, u[6], u[1], u[2], u[3], self.max_body, nil)
    end
    return core.http.forwarder(self, pools, u[6], u[5], headers, url, pool,
                               math.tointeger(opts.buffer or 65536))
  end
  local function first(req, cb)         -- (no pool yet: the usual path makes it)
    self:request({ url = url, forward = req, headers = headers }, cb)
  end
  return core.http.forwarder(self, pools, u[6], u[5], headers, url, first)
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

--- @section end

--- An HTTP client: its own pools (per loop, origin and TLS settings) and
-- defaults for its requests. Made anywhere, used on any loop.
-- @tparam[opt] table opts
-- @int[opt=64] opts.pool connections per loop, origin and TLS settings
-- @int[opt=1024] opts.max_waiting requests waiting for a connection, per pool; past it a request fails at once
-- @number[opt=60] opts.keepalive seconds an idle pooled connection is kept
-- @number[opt=5] opts.timeout a request's default timeout, seconds (0: none)
-- @int[opt=1048576] opts.max_body the largest response body
-- @int[opt=16384] opts.max_header the largest response head
-- @param[opt] opts.tls a `netrun.tls.client` config for https
-- @int[opt=0] opts.follow redirects to follow
-- @bool[opt=false] opts.follow_downgrade follow https to http redirects
-- @bool[opt=false] opts.raw responses as `netrun.http.raw_response` (proxies): `res.status`, `res.keep_alive`, `res.response` to write
-- @treturn client
-- @usage local client = netrun.http.client { pool = 16, timeout = 2 }
-- local res = client:request { url = "http://127.0.0.1:8080/" }:await()
function M.client(opts)
  opts = check_client(opts) or {}
  local h2 = opts.h2
  if h2 == nil then h2 = M.h2 end
  if h2 ~= "auto" and type(h2) ~= "boolean" then
    core.option_error("netrun.http.client", "h2", h2, '"auto", true or false')
  end
  return setmetatable({
    id = new_id(), pool = opts.pool or M.pool,
    keepalive = opts.keepalive or M.keepalive, timeout = opts.timeout or M.timeout,
    tls = opts.tls, max_body = opts.max_body or M.max_body,
    max_header = opts.max_header or M.max_header, follow = opts.follow,
    raw = opts.raw == true, max_waiting = opts.max_waiting or M.max_waiting,
    follow_downgrade = opts.follow_downgrade == true, h2 = h2,
  }, Client)
end

-- A pool of backends for forwarders and requests: `upstream`, documented
-- in lua/netrun/upstream.lua.
M.upstream = function(opts) return require("netrun.upstream").new(opts) end

local default_client
--- Send a request with the default client.
-- @tparam table opts the request's options (`request_options`)
-- @treturn future of the response `{ status, reason, version, headers, trailers, body, keep_alive }` (header names in lower case)
-- @usage local res = netrun.http.request { url = "https://a.example/x" }:await()
function M.request(opts)
  opts = check_request(opts)
  default_client = default_client or M.client()
  default_client.id = "default"         -- the same pools in every state
  return on_loop(default_client, opts)
end

-- The TLS config of https requests that give none: the system's CAs,
-- the host name verified; ALPN offering h2 unless h2 is false (only h2
-- when it is true).
local default_tls = {}
local ALPN = { [false] = nil, auto = { "h2", "http/1.1" }, [true] = { "h2" } }
function M.default_tls(h2)
  if h2 == nil then h2 = false end
  local t = default_tls[h2]
  if t == nil then
    t = core.tls.client { alpn = ALPN[h2] }
    default_tls[h2] = t
  end
  return t
end

-- For tests: this state's pools as { [client id] = { [origin] = { idle, total, waiting } } }.
function M.stats()
  local out = {}
  for id, per in pairs(pools) do
    out[id] = {}
    for key, pool in pairs(per) do out[id][key] = pool:stats() end
  end
  return out
end

--- @type client

--- Send a request on this client's pools. With a callback, no future is
-- made: `callback(res)` or `callback(nil, err)` runs on the caller's loop.
-- @function client:request
-- @tparam table opts the request's options (`request_options`)
-- @tparam[opt] function callback `callback(res, err)`
-- @treturn future|nil of the response (nil with a callback)
Client.request = core.http.lane { Client = Client, pools = pools, urls = urls,
                                  slow = request_other }

return M
