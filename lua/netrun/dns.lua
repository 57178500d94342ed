--- Host names resolved without blocking a loop:
-- `netrun.dns`, loaded on first use. `netrun.connect`, `netrun.tcp.connect`
-- and URLs use it. Per-state settings are fields of the module: `ttl`
-- (30 s, the most an answer is cached), `negative_ttl` (5 s),
-- `max_entries` (1024 names, process-wide), `timeout` (10 s a lookup).
-- @module netrun.dns

-- netrun.dns: host names resolved without blocking a loop (DESIGN.md §8.3).
--
-- resolve(name [, { family = "inet" | "inet6" }]) --> future of an array of
-- address strings, in the resolver's order (RFC 6724). A numeric address,
-- "localhost" and names under it (RFC 6761: ::1 then 127.0.0.1, with or
-- without /etc/hosts) resolve at once, on the caller's thread. Other names
-- are looked up by c-ares on the resolver's own thread (runtime/resolver.c:
-- one lookup for all the callers of a name meanwhile, lookups in parallel,
-- at most max_inflight at once), never on a loop, and the answer is cached
-- for every state in the shared dict "netrun.dns":
--   - answers for their TTL, at most dns.ttl seconds (30),
--   - failures for dns.negative_ttl seconds (5),
--   - at most dns.max_entries names (1024; the least recently used go).
-- A lookup that has not answered after dns.timeout seconds (10) fails the
-- future. While a name is being looked up, a state asking again gets the
-- same future.
--
-- configure { servers = { "127.0.0.1:5353", ... } | "a,b" | false,
--             max_inflight = 256, max_waiting = 4096 }: the process's
-- resolver settings, from the next lookup on (servers false: the system's,
-- or the environment's NETRUN_DNS_SERVERS).
--
-- connect(opts) is netrun.connect for a host name: lchannel.c calls it
-- once the options are checked. It resolves the name, then connects to its
-- addresses, which the core tries in turn on one channel (RFC 8305: IPv6
-- and IPv4 interleaved; "localhost" is ::1 first while the server may
-- listen on 127.0.0.1 only).
local core = require "netrun.core"

local dns = { ttl = 30, negative_ttl = 5, max_entries = 1024, timeout = 10 }

local cache
local pending = {}               -- this state's lookups in flight: key -> future

local function split(s)
  local t = {}
  for a in s:gmatch("%S+") do t[#t + 1] = a end
  return t
end

-- Whether a failure says something of the name, to be cached: not the
-- resolver's bound on lookups (runtime/resolver.c) nor its cancelling
-- them as the process shuts down.
local function of_the_name(cause)
  return not (cause:find("(max_inflight, max_waiting)", 1, true) or cause:find("^cancelled"))
end

local check_resolve = core.options("netrun.dns.resolve", { family = "enum inet inet6" })

local function check(name, opts)
  if type(name) ~= "string" or name == "" then
    core.option_error("netrun.dns.resolve", "name", name, "a non-empty string")
  end
  return opts ~= nil and check_resolve(opts).family or nil
end

-- The cache's answer, then the resolver's, into promise p.
local function lookup(p, name, family, key)
  cache = cache or core.dict("netrun.dns", { capacity = dns.max_entries })
  local hit = cache:get(key)
  if hit then
    if hit:sub(1, 1) == "!" then return p:set_failure(hit:sub(2)) end
    return p:set_success(split(hit))
  end
  if pending[key] then return pending[key] end
  pending[key] = p
  local what = "netrun.dns.resolve: " .. name .. ": "
  core.dns_lookup(name, family, dns.timeout):add_listener(function(f)
    if pending[key] == p then pending[key] = nil end
    if f:is_success() then
      local addrs = f:result()
      local ttl = addrs.ttl
      addrs.ttl = nil
      ttl = (ttl > 0 and ttl < dns.ttl) and ttl or dns.ttl
      if ttl > 0 then cache:set(key, table.concat(addrs, " "), ttl) end
      p:try_success(addrs)
    else
      local cause = tostring(f:cause())
      local msg = what .. cause
      if dns.negative_ttl > 0 and of_the_name(cause) then
        cache:set(key, "!" .. msg, dns.negative_ttl)
      end
      p:try_failure(msg)
    end
  end)
  return p
end

--- Resolve a host name without blocking a loop: a numeric address and
-- "localhost" at once, other names by c-ares on the resolver's thread,
-- answers cached for every state (their TTL, at most `ttl` seconds;
-- failures `negative_ttl`). Callers of one name share one lookup.
-- @string name the host name
-- @tparam[opt] table opts
-- @string[opt] opts.family "inet" (IPv4) or "inet6" (IPv6); default both
-- @treturn future of an array of address strings, in the resolver's order (RFC 6724)
-- @usage local addrs = netrun.dns.resolve("example.com"):await()
function dns.resolve(name, opts)
  local family = check(name, opts)
  local p = core.promise()
  local addrs, err = core.dns_local(name, family)
  if addrs then return p:set_success(addrs) end
  if err then return p:set_failure("netrun.dns.resolve: " .. err) end
  return lookup(p, name, family, (family or "any") .. " " .. name:lower())
end

--- The process's resolver settings, from the next lookup on.
-- @tparam table opts
-- @param[opt] opts.servers name servers, `{ "127.0.0.1:5353", ... }` or `"a,b"`; false: the system's (or `NETRUN_DNS_SERVERS`)
-- @int[opt=256] opts.max_inflight distinct names looked up at once
-- @int[opt=4096] opts.max_waiting names waiting for a slot; past it a lookup fails at once
function dns.configure(opts)
  core.dns_configure(opts)
end

function dns.connect(opts)
  local p = core.promise()
  local host, port = opts.host, opts.port
  dns.resolve(host):add_listener(function(f)
    if not f:is_success() then
      p:try_failure("netrun.connect: " .. tostring(f:cause()))
      return
    end
    local o = {}
    for k, v in pairs(opts) do o[k] = v end
    o.host = f:result()
    local ok, cf = pcall(core.connect, o)
    if not ok then
      p:try_failure(string.format("netrun.connect: %s:%d: %s", host, port, tostring(cf)))
      return
    end
    cf:add_listener(function(c)
      if c:is_success() then
        p:try_success(c:result())
      else
        p:try_failure(string.format("netrun.connect: %s:%d: %s", host, port,
          tostring(c:cause())))
      end
    end)
  end)
  return p
end

-- listen(opts, kind) is netrun.server (kind "server") or netrun.udp
-- ("udp") for a host name asked on a loop: lchannel.c calls it once the
-- options are checked. It resolves the name off the loop, then binds the
-- first address, as a bind on the main thread takes getaddrinfo's first.
-- (localhost never comes here: the core binds 127.0.0.1 for it.)
function dns.listen(opts, kind)
  local p = core.promise()
  local what = string.format("netrun.%s: %s:%d: ", kind, opts.host, opts.port)
  dns.resolve(opts.host):add_listener(function(f)
    if not f:is_success() then
      p:try_failure("netrun." .. kind .. ": " .. tostring(f:cause()))
      return
    end
    local o = {}
    for k, v in pairs(opts) do o[k] = v end
    o.host = f:result()[1]
    local ok, bf = pcall(core[kind], o)
    if not ok then
      p:try_failure(what .. tostring(bf))
      return
    end
    bf:add_listener(function(b)
      if b:is_success() then
        p:try_success(b:result())
      else
        p:try_failure(b:cause())
      end
    end)
  end)
  return p
end

return dns
