-- netrun.dns: host names resolved without blocking a loop (DESIGN.md §8.3).
--
-- resolve(name [, { family = "inet" | "inet6" }]) --> future of an array of
-- address strings, in getaddrinfo's order. A numeric address resolves at
-- once, on the caller's thread. A name is looked up by getaddrinfo on the
-- resolver pool (core.dns_pool(): two threads shared by the process), never
-- on a loop thread, and the answer is cached for every state in the shared
-- dict "netrun.dns":
--   - answers for dns.ttl seconds (30: getaddrinfo tells no TTL),
--   - failures for dns.negative_ttl seconds (5),
--   - at most dns.max_entries names (1024; the least recently used go).
-- A lookup that has not answered after dns.timeout seconds (10) fails the
-- future (the lookup itself runs on; its answer is still cached). While a
-- name is being looked up, a state asking again gets the same future.
--
-- connect(opts) is netrun.connect for a host name: lchannel.c calls it
-- once the options are checked. It resolves the name, then connects to
-- each address in turn until one answers ("localhost" may be ::1 first
-- while the server listens on 127.0.0.1).
local core = require "netrun.core"

local dns = { ttl = 30, negative_ttl = 5, max_entries = 1024, timeout = 10 }

local cache, pool
local pending = {}               -- this state's lookups in flight: key -> future

local function lookup(name, family)   -- on a resolver thread
  local addrs, err = core.getaddrinfo(name, family)
  return { addrs = addrs, err = err }
end

local function fail_after(p, seconds, msg)   -- on a resolver thread
  p:try_failure(msg)
end

local function done(p, key, value)
  if type(value) == "table" then
    p:try_success(value)
  else
    p:try_failure(value)
  end
  if pending[key] == p then pending[key] = nil end
end

local function split(s)
  local t = {}
  for a in s:gmatch("%S+") do t[#t + 1] = a end
  return t
end

local FAMILIES = { inet = true, inet6 = true }

function dns.resolve(name, opts)
  if type(name) ~= "string" or name == "" then
    error("netrun.dns.resolve: name must be a non-empty string, got " ..
      (name == "" and "an empty string" or type(name)), 2)
  end
  if opts ~= nil and type(opts) ~= "table" then
    error("netrun.dns.resolve: options must be a table, got " .. type(opts), 2)
  end
  local family = opts and opts.family
  if family ~= nil and not FAMILIES[family] then
    error("netrun.dns.resolve: family must be \"inet\", \"inet6\" or nil, got " ..
      tostring(family), 2)
  end
  local p = core.promise()
  local numeric = core.dns_numeric(name)
  if numeric then
    if family and family ~= numeric then
      return p:set_failure(string.format("netrun.dns.resolve: %s is an %s address, not %s",
        name, numeric, family))
    end
    return p:set_success({ name })
  end
  local key = (family or "any") .. " " .. name:lower()
  cache = cache or core.dict("netrun.dns", { capacity = dns.max_entries })
  local hit = cache:get(key)
  if hit then
    if hit:sub(1, 1) == "!" then return p:set_failure(hit:sub(2)) end
    return p:set_success(split(hit))
  end
  if pending[key] then return pending[key] end
  pending[key] = p
  pool = pool or core.dns_pool()
  local what = "netrun.dns.resolve: " .. name .. ": "
  local timer = pool:schedule(dns.timeout, fail_after, p, dns.timeout,
    what .. "timed out after " .. dns.timeout .. " s")
  p:add_listener(function()
    timer:cancel()
    if pending[key] == p then pending[key] = nil end
  end)
  pool:submit(lookup, name, family):add_listener(function(f)
    local r = f:is_success() and f:result() or { err = f:cause() }
    if r.addrs then
      cache:set(key, table.concat(r.addrs, " "), dns.ttl)
      done(p, key, r.addrs)
    else
      local msg = what .. tostring(r.err)
      cache:set(key, "!" .. msg, dns.negative_ttl)
      done(p, key, msg)
    end
  end)
  return p
end

function dns.connect(opts)
  local p = core.promise()
  local host, port = opts.host, opts.port
  local what = string.format("netrun.connect: %s:%d: ", host, port)
  dns.resolve(host):add_listener(function(f)
    if not f:is_success() then
      p:try_failure("netrun.connect: " .. tostring(f:cause()))
      return
    end
    local addrs, i = f:result(), 0
    local function try(last)
      i = i + 1
      if addrs[i] == nil then
        p:try_failure(what .. tostring(last))
        return
      end
      local o = {}
      for k, v in pairs(opts) do o[k] = v end
      o.host = addrs[i]
      local ok, cf = pcall(core.connect, o)
      if not ok then
        p:try_failure(what .. tostring(cf))
        return
      end
      cf:add_listener(function(c)
        if c:is_success() then
          p:try_success(c:result())
        else
          try(c:cause())
        end
      end)
    end
    try()
  end)
  return p
end

-- listen(opts, kind) is netrun.server (kind "server") or netrun.udp
-- ("udp") for a host name asked on a loop: lchannel.c calls it once the
-- options are checked. It resolves the name off the loop, then binds the
-- first address, as getaddrinfo's first answer is what a bind on the
-- main thread takes.
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
