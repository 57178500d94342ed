--- netrun.http.upstream's policy: a pool of backends a forwarder or a
-- client's request may target (DESIGN.md §9.2).
--
-- The counts every loop shares (each server up or out, its recent
-- failures, its requests in flight) live in C (runtime/bindings/http/
-- lupstream.c), in one block that each copy of the upstream table points
-- at: an upstream made once in the main chunk and copied into every loop
-- is one pool. This file decides what a request's outcome means:
--  - passive: a failure (a refused or failed connect, a reset or close
--    before the whole response came, a timeout; a 5xx if fail_5xx) counts
--    against its server, and `fails` of them within `fail_timeout` take it
--    out. Without health probes it comes back after `fail_timeout` (the
--    next request tries it; nginx's max_fails/fail_timeout); with them,
--    only `health.passes` probes in a row bring it back;
--  - active: one prober (a daemon loop of its own, made with the upstream)
--    GETs `health.path` on every server each `health.interval`; a 2xx or
--    3xx passes, anything else (or no answer within `health.timeout`)
--    fails, and `health.fails` failures in a row take a server out;
--  - retries: a request whose server failed before anything of its
--    response went on (bodies are held whole: nothing goes on before the
--    whole response is in) is sent to another server, up to `retries`
--    times, when it is idempotent (GET, HEAD, OPTIONS, TRACE, PUT,
--    DELETE) and its body is not a stream; any other gets the failure
--    (a proxy answers 502). A streamed forwarder's (stream = true) is
--    sent again on the same terms only while nothing of its answer went
--    to the client and nothing of its body was taken from the client's
--    connection (a bodyless GET, or one whose server could not be
--    reached); past that the failure stands (before the head: 502/504;
--    after it: the client's connection closes).
-- Round robin's turn is per loop (as nginx's is per worker).
-- @module netrun.http
local core = require "netrun.core"

local M = {}

local Upstream = {}
Upstream.__index = Upstream
M.Upstream = Upstream

local WHAT = "netrun.http.upstream"
local BALANCE = { round_robin = 0, least_conn = 1, hash = 2 }
local IDEMPOTENT = { GET = true, HEAD = true, OPTIONS = true, TRACE = true, PUT = true,
                     DELETE = true }
local DEFAULT_PORT = { http = 80, https = 443 }

local check = core.options(WHAT, {
  servers = "table!", balance = "enum round_robin least_conn hash", hash = "any",
  health = "table", retries = "integer 0 63", tls = "tls.client", fails = "integer 1",
  fail_timeout = "seconds", fail_5xx = "boolean" })
local check_health = core.options(WHAT .. " health", {
  path = "string!", interval = "seconds", timeout = "seconds", fails = "integer 1",
  passes = "integer 1" })

-- "host:port", "[v6]:port", "http://host[:port]", "https://host[:port]"
-- (a trailing "/" allowed) --> the origin URL, or nil.
local function origin(s)
  local scheme, rest = s:match("^(https?)://(.*)$")
  local explicit = scheme ~= nil
  if not explicit then scheme, rest = "http", s end
  rest = rest:gsub("/$", "")
  local host, port = rest:match("^%[([%x:.]+)%]:?(%d*)$")
  if host then host = "[" .. host .. "]" else host, port = rest:match("^([%w.%-_]+):?(%d*)$") end
  if not host or (port == "" and not explicit) then return nil end
  port = port == "" and DEFAULT_PORT[scheme] or tonumber(port)
  if port < 1 or port > 65535 then return nil end
  return scheme .. "://" .. host:lower() .. ":" .. math.tointeger(port), scheme == "https"
end

--- A pool of backends (DESIGN.md §9.2): made once (in the main chunk),
-- used from every loop as the target of `client:forwarder { upstream =
-- up }` or `client:request { upstream = up, path = ... }`. What the loops
-- share (each server up or out, its failures, its requests in flight) is
-- counted in C with atomics. Limits: docs/guide/limits.md.
-- @function upstream
-- @tparam table opts
-- @tparam {string,...} opts.servers the backends, 1 to 64: `"host:port"`, `"[::1]:port"`, `"http://host:port"`, `"https://host:port"`
-- @string[opt="round_robin"] opts.balance `"round_robin"` (a turn per loop), `"least_conn"` (the server with the fewest requests in flight, over all loops) or `"hash"` (a key sticks to a server while it is up)
-- @param[opt] opts.hash with `balance = "hash"`: a function of the request (a server request for a forwarder, the options for `client:request`) returning its key, or the name of a header field whose value is the key (no key: round robin)
-- @tparam[opt] table opts.health active probes, by one prober for all loops: `path` (required: GET it), `interval` (5 s), `timeout` (the interval, at most 5 s), `fails` (1: failed probes in a row that take a server out), `passes` (1: passed probes in a row that bring it back)
-- @int[opt=1] opts.retries other servers an idempotent request is sent to when its server fails before its response (0 to 63)
-- @int[opt=1] opts.fails failures within `fail_timeout` that take a server out (nginx's max_fails)
-- @number[opt=10] opts.fail_timeout seconds: the failure window, and how long a server stays out when nothing probes it
-- @bool[opt=false] opts.fail_5xx a 5xx response counts as a failure (and is retried elsewhere when it may be; the last one is passed on)
-- @param[opt] opts.tls a `netrun.tls.client` config for the `https://` servers (else the client's, else the system's CAs with the host name verified)
-- @treturn upstream
-- @usage local up = netrun.http.upstream { servers = { "10.0.0.1:80", "10.0.0.2:80" },
--   health = { path = "/health", interval = 2 }, retries = 1 }
-- local forward = client:forwarder { upstream = up }
function M.new(opts)
  if type(opts) ~= "table" then core.option_error(WHAT, "opts", opts, "a table") end
  opts = check(opts)
  local servers, tls_servers = {}, false
  for i, s in ipairs(opts.servers) do
    local url, tls = type(s) == "string" and origin(s)
    if not url then
      core.raise(string.format('%s: servers[%d] must be "host:port", "http://host:port" or ' ..
        '"https://host:port", got %s', WHAT, i, type(s) == "string" and string.format("%q", s)
        or type(s)))
    end
    servers[i], tls_servers = url, tls_servers or tls
  end
  if #servers == 0 then core.raise(WHAT .. ": servers must list at least one server") end
  if #servers > 64 then core.raise(WHAT .. ": servers: at most 64, got " .. #servers) end
  local balance = BALANCE[opts.balance or "round_robin"]
  local hash = opts.hash
  if balance == 2 and type(hash) ~= "function" and type(hash) ~= "string" then
    core.option_error(WHAT, "hash", hash, 'a function or a header name (with balance = "hash")')
  end
  local health = opts.health and check_health(opts.health)
  if health then
    health = { path = health.path, interval = health.interval or 5, timeout = health.timeout,
               fails = health.fails or 1, passes = health.passes or 1 }
    if health.interval <= 0 then core.option_error(WHAT .. " health", "interval", 0, "> 0 seconds") end
    if health.path:sub(1, 1) ~= "/" then
      core.option_error(WHAT .. " health", "path", health.path, 'a path ("/health")')
    end
    health.timeout = health.timeout or math.min(health.interval, 5)
  end
  local fails, window = opts.fails or 1, opts.fail_timeout or 10
  local up = setmetatable({
    servers = servers, balance = balance, hash = type(hash) == "string" and hash:lower() or hash,
    retries = opts.retries or 1, tls = opts.tls, fail_5xx = opts.fail_5xx == true,
    health = health,
    state = core.upstream_state(#servers, fails, window, health and health.passes or 1,
                                health and health.fails or 1, health ~= nil),
  }, Upstream)
  if health then M.start_prober(up) end
  return up
end

-- ---- the prober ------------------------------------------------------------------

-- One round: every server whose last probe is done gets a GET of the
-- path (on the prober's loop; pending is this state's).
local pending = setmetatable({}, { __mode = "k" })
local probe_client
function M.probe_round(up)
  local st = up.state
  local busy = pending[st]
  if busy == nil then busy = {}; pending[st] = busy end
  probe_client = probe_client or require("netrun.http").client { pool = 4, keepalive = 60 }
  for i, url in ipairs(up.servers) do
    if not busy[i] then
      busy[i] = true
      probe_client:request({ url = url .. up.health.path, timeout = up.health.timeout,
                             tls = url:sub(1, 6) == "https:" and up.tls or nil },
        function(res, err)
          busy[i] = nil
          local ok = res ~= nil and res.status >= 200 and res.status < 400
          local change = st:probe(i, ok)
          if change then
            core.log(change == "down" and 2 or 1, string.format("%s: %s %s (probe: %s)", WHAT,
              url, change, ok and "passed" or (err or ("status " .. res.status))))
          end
        end)
    end
  end
end

function M.start_prober(up)
  local netrun = require "netrun"
  local g = netrun.group { threads = 1, name = "upstream", daemon = true }
  up.prober = g:schedule_at_fixed_rate(up.health.interval, up.health.interval,
    function(u) require("netrun.upstream").probe_round(u) end, up)
  up.prober_group = g
end

-- ---- picking and outcomes --------------------------------------------------------

-- This state's round-robin turn per upstream, the server picked last (the
-- state's own: a table keyed by the upstream's handle, one proxy per state).
local turns = setmetatable({}, { __mode = "k" })

-- The server for a request (r: what a hash function gets; headers: where
-- a hash field is read), none of those in `tried`; nil when all were.
local function pick(up, r, headers, tried)
  local st = up.state
  if up.balance == 2 then
    local h, key = up.hash, nil
    if type(h) == "function" then key = h(r) elseif headers then key = headers[h] end
    if key ~= nil then return st:pick(2, tostring(key), tried) end
  end
  -- the turn goes on from the server picked last (so a server out of use
  -- does not double its follower's share)
  local i = st:pick(up.balance == 1 and 1 or 0, (turns[st] or 0) + 1, tried)
  if i then turns[st] = i end
  return i
end

-- What an answer or a failure means: the outcome for the server's counts
-- (0 answered, 1 failed, 2 neither) and whether another server may take
-- the request.
local function outcome(up, res, err)
  if res then
    if up.fail_5xx and res.status >= 500 then return 1, true end
    return 0, false
  end
  if err:find("over max_body", 1, true) or err:find("too large", 1, true) or
     err:find("bad URL", 1, true) then
    return 2, false                      -- the answer's fault or ours: not the server's
  end
  if err:find("(max_waiting)", 1, true) then return 2, true end   -- our pool is full
  return 1, true
end

-- The end of a try on server i: counted; a server this took out is logged.
local function done(up, i, how, err)
  if up.state:done(i, how) then
    core.log(2, string.format("%s: %s down (%s)", WHAT, up.servers[i],
      err or "a 5xx answer"))
  end
end

-- ---- client:request { upstream = up, path = ... } ----------------------------------

-- On a loop: request_with's path for a request with an upstream: each try
-- a request of its own to a server, with the options given.
-- A request's upstream options checked (on the caller's thread: raises
-- at its line).
function M.check_request(opts)
  if getmetatable(opts.upstream) ~= Upstream then
    core.option_error("netrun.http client:request", "upstream", opts.upstream,
                      "a netrun.http.upstream")
  end
  if opts.url ~= nil then
    core.raise("netrun.http client:request: give url or upstream (with path), not both")
  end
  local path = opts.path
  if path ~= nil and path:sub(1, 1) ~= "/" then
    core.option_error("netrun.http client:request", "path", path, 'a path ("/x?y=1")')
  end
  if opts.forward or opts.stream then
    core.raise("netrun.http client:request: upstream takes neither forward (use " ..
               "client:forwarder { upstream }) nor stream")
  end
end

function M.request(http, client, opts, cb)
  local up = opts.upstream
  M.check_request(opts)
  local path = opts.path or "/"
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.upstream, o.path = nil, nil
  local method = (opts.method or "GET"):upper()
  local again_ok = IDEMPOTENT[method] and type(opts.body) ~= "function"
  local p
  if cb == nil then p = core.promise() end
  local tried, tries, st = 0, 0, up.state
  local function try(last_err)
    local i = pick(up, opts, up.balance == 2 and opts.headers, tried)
    if i == nil then                   -- (only after a failure: one server at least)
      if p then return p:set_failure(last_err) end
      return cb(nil, last_err)
    end
    tried, tries = tried | (1 << (i - 1)), tries + 1
    local url = up.servers[i]
    o.url = url .. path
    if up.tls and o.tls == nil and url:sub(1, 6) == "https:" then o.tls = up.tls end
    st:begin(i)
    http.request_with(client, o, function(res, err)
      local how, again = outcome(up, res, err)
      done(up, i, how, err)
      if again and again_ok and tries <= up.retries then return try(err) end
      if p then
        if res then p:set_success(res) else p:set_failure(err) end
      else
        cb(res, err)
      end
    end)
  end
  try("netrun.http: no server")
  return p
end

-- ---- client:forwarder { upstream = up } ------------------------------------------

-- forward(req, callback, ctx) with stream = true: each try a streamed
-- exchange (lhttp_xfer.c) on the picked server's stream forwarder. Its
-- callback says what a failure means: cb(nil, err, again) -- nothing went
-- to the client, and `again` when nothing of the request's body was taken
-- from it either: another server may take an idempotent request --;
-- cb(false, err, cut) -- the client's side is over, `cut` when the
-- backend failed after its head went on (its failure; else the client's:
-- neither). fail_5xx does not apply: the answer goes on as it comes.
local function stream_forwarder(client, opts, up)
  local headers, st, retries = opts.headers, up.state, up.retries
  for _, url in ipairs(up.servers) do
    if up.tls and url:sub(1, 6) == "https:" and up.tls ~= client.tls then
      core.raise("netrun.http client:forwarder: stream = true takes the client's tls: give " ..
                 "the client the upstream's tls config")
    end
  end
  local fwd = {}                          -- each server's stream forwarder, made on first use
  local by_field = up.balance == 2 and type(up.hash) == "string"
  return function(req, cb, ctx)
    local tried, tries = 0, 0
    local again_ok = IDEMPOTENT[req.method]
    local function try(last_err)
      local i = pick(up, req, by_field and req.headers, tried)
      if i == nil then return cb(nil, last_err) end
      tried, tries = tried | (1 << (i - 1)), tries + 1
      local f = fwd[i]
      if f == nil then
        f = client:forwarder { url = up.servers[i], headers = headers, stream = true,
                               buffer = opts.buffer }
        fwd[i] = f
      end
      st:begin(i)
      f(req, function(ok, err, flag)
        if ok then
          done(up, i, 0)
          return cb(true)
        elseif ok == false then
          done(up, i, flag and 1 or 2, err)
          return cb(false, err)
        end
        local how, again = outcome(up, nil, err)
        done(up, i, how, err)
        if again and flag and again_ok and tries <= retries then return try(err) end
        cb(nil, err)
      end, ctx)
    end
    try()
  end
end

-- forward(req, callback) to the servers of an upstream: `client:forwarder`'s
-- path when given `upstream` (http.lua checked the options).
function M.forwarder(client, opts)
  local up = opts.upstream
  if getmetatable(up) ~= Upstream then
    core.option_error("netrun.http client:forwarder", "upstream", up, "a netrun.http.upstream")
  end
  if opts.stream then return stream_forwarder(client, opts, up) end
  local headers, st = opts.headers, up.state
  local fwd = {}                          -- each server's forwarder, made on first use
  for i, url in ipairs(up.servers) do
    if up.tls and url:sub(1, 6) == "https:" and up.tls ~= client.tls then
      -- a TLS config of the upstream's own: the request path, which takes one
      fwd[i] = function(req, cb)
        client:request({ url = url, forward = req, headers = headers, tls = up.tls }, cb)
      end
    end
  end
  local retries = up.retries
  local by_field = up.balance == 2 and type(up.hash) == "string"
  return function(req, cb)
    local tried, tries = 0, 0
    local function try(last_err)
      local i = pick(up, req, by_field and req.headers, tried)   -- (read only then)
      if i == nil then return cb(nil, last_err) end
      tried, tries = tried | (1 << (i - 1)), tries + 1
      local f = fwd[i]
      if f == nil then
        f = client:forwarder { url = up.servers[i], headers = headers }
        fwd[i] = f
      end
      st:begin(i)
      f(req, function(res, err)
        local how, again = outcome(up, res, err)
        done(up, i, how, err)
        if again and tries <= retries and IDEMPOTENT[req.method] and not req.streaming then
          return try(err)
        end
        cb(res, err)
      end)
    end
    try()
  end
end

--- @type upstream

--- Each server's state, as every loop sees it.
-- @function upstream:status
-- @treturn {table,...} per server, in the order given: `{ url, up, in_flight, fails, requests, failures }`
-- @usage for _, s in ipairs(up:status()) do print(s.url, s.up) end
function Upstream:status()
  local out = {}
  for i, url in ipairs(self.servers) do
    local s = self.state:server(i)
    s.url = url
    out[i] = s
  end
  return out
end

--- Stop the health probes (the upstream stays usable; servers then come
-- back after `fail_timeout`).
-- @function upstream:close
-- @usage up:close()
function Upstream:close()
  if self.prober then self.prober:cancel(); self.prober = nil end
  if self.prober_group then self.prober_group:shutdown_gracefully(); self.prober_group = nil end
end

function Upstream:__tostring()
  return string.format("netrun.http.upstream(%d servers)", #self.servers)
end

return M
