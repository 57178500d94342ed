-- netrun: the public Lua module. The C core (netrun.core) provides groups,
-- loops, futures, channels, pipelines and shared dicts; this file adds the
-- parts that are policy rather than mechanism.
local core = require "netrun.core"

-- Only the public API (DESIGN.md §4, §8, §9.7) is copied from the core;
-- what the REPL, the console, reload, metrics and `netrun top` use
-- besides (repl_wait, term_raw, exit_now, forget_caches, groups, ...)
-- stays in netrun.core. spec/module_spec.lua holds the exact key set.
local netrun = {}
for _, k in ipairs { "group", "executor_group", "current", "promise", "void_promise",
                     "spawn", "sleep", "run", "now", "server", "connect", "udp",
                     "channel_group", "embedded", "version" } do
  netrun[k] = core[k]
end

-- netrun.log.debug/info/warn/error(fmt, ...): formatted only when enabled.
local LEVELS = { debug = 0, info = 1, warn = 2, error = 3 }
netrun.log = {}
for name, level in pairs(LEVELS) do
  netrun.log[name] = function(fmt, ...)
    if level >= core.log_level() then
      if select("#", ...) > 0 then
        fmt = string.format(fmt, ...)
      end
      core.log(level, tostring(fmt))
    end
  end
end
function netrun.log.level(name)
  if name ~= nil then
    local level = LEVELS[name] or error("unknown log level '" .. tostring(name) .. "'", 2)
    core.log_level(level)
  end
  local current = core.log_level()
  for k, v in pairs(LEVELS) do
    if v == current then return k end
  end
  return "off"
end

netrun.shared = { dict = core.dict }

-- netrun.all(futures): a future of the array of their results, failed by
-- the first failure. Results are copied into the caller's state.
function netrun.all(futures)
  local all = core.promise()
  local n = #futures
  local results = {}
  if n == 0 then
    all:set_success(results)
    return all
  end
  for i, f in ipairs(futures) do
    f:add_listener(function(done)
      if done:is_success() then
        results[i] = done:result()
        n = n - 1
        if n == 0 then all:try_success(results) end
      else
        all:try_failure(done:cause())
      end
    end)
  end
  return all
end

-- netrun.option(name, default): a script's option, for examples and small
-- servers: `--name value` or `--name=value` in the global `arg` (what
-- `netrun script.lua ...` passes), else the environment variable NAME,
-- else default. A numeric default makes the value a number, and a value
-- that is not one raises.
function netrun.option(name, default)
  local value
  local args = rawget(_G, "arg") or {}
  local flag = "--" .. name
  for i = 1, #args do
    if args[i] == flag then value = args[i + 1] break end
    local v = args[i]:match("^" .. flag:gsub("%-", "%%-") .. "=(.*)$")
    if v then value = v break end
  end
  value = value or os.getenv((name:upper():gsub("%-", "_")))
  if value == nil then return default end
  if type(default) == "number" then
    return tonumber(value) or error("option --" .. name .. ": '" .. value .. "' is not a number", 2)
  end
  return value
end

-- Batteries: native handlers from the C side (core.codec, core.handler).
netrun.codec = core.codec
netrun.handler = core.handler

-- Operating a live process (DESIGN §8.5): this state remembers the files
-- its modules come from, for netrun.reload(); netrun.handler.metrics
-- serves netrun.metrics.text() over HTTP.
require("netrun.reload").watch()
function netrun.reload() return require("netrun.reload").reload() end
if core.handler.metrics == nil then
  core.handler.metrics = function(opts) return require("netrun.metrics").handler(opts) end
end

-- Parts loaded on first use (a state that never calls out pays nothing):
-- netrun.json, netrun.dns, netrun.tcp, netrun.http (the client, and
-- unescape(s): + and %XX decoded), netrun.websocket, netrun.metrics,
-- netrun.redis.
local LAZY = { json = "netrun.json", dns = "netrun.dns", tcp = "netrun.stream",
               http = "netrun.http", websocket = "netrun.websocket",
               metrics = "netrun.metrics", redis = "netrun.redis" }
setmetatable(netrun, { __index = function(t, k)
  local name = LAZY[k]
  if name == nil then return nil end
  local m = require(name)
  if k == "tcp" then m = m.tcp end
  rawset(t, k, m)
  return m
end })

-- TLS (DESIGN §8.1). A config is a handle: the copy an init function
-- carries to a loop is the same config, its SSL_CTX built once.
netrun.tls = {
  server = core.tls.server, client = core.tls.client,
  reload = core.tls.reload, handshake = core.tls.handshake,
}

local function without_tls(opts)
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.tls = nil
  return o
end

local function check_tls(what, cfg)
  if type(cfg) ~= "userdata" or not tostring(cfg):match("^netrun%.tls%.") then
    error(what .. ": tls must be a netrun.tls.server/client config, got "
      .. tostring(cfg), 3)
  end
end

-- netrun.server { tls = config, ... }: TLS first in every child pipeline,
-- before the handlers init adds.
function netrun.server(opts)
  if type(opts) ~= "table" or opts.tls == nil then return core.server(opts) end
  check_tls("netrun.server", opts.tls)
  local o = without_tls(opts)
  local tls, init = opts.tls, opts.init
  o.init = function(ch)
    ch:pipeline():add_first("tls", tls)
    if init then init(ch) end
  end
  return core.server(o)
end

-- netrun.connect { tls = client_config, ... }: the future completes with
-- the channel once the handshake did, and fails with OpenSSL's reason
-- when it failed (a certificate that does not verify, say), or with the
-- connect's when no address answered (then no handshake began).
local NOT_CONNECTED = "channel closed before it connected"   -- runtime/tls/handler.c
function netrun.connect(opts)
  if type(opts) ~= "table" or opts.tls == nil then return core.connect(opts) end
  check_tls("netrun.connect", opts.tls)
  local o = without_tls(opts)
  local tls, init, host, unix = opts.tls, opts.init, opts.host or "127.0.0.1", opts.unix
  local done = core.promise()
  o.init = function(ch)
    ch:pipeline():add_first("tls", tls)
    if not unix and type(host) == "string" then core.tls.set_host(ch, "tls", host) end
    if init then init(ch) end
    core.tls.handshake(ch):add_listener(function(f)
      if f:is_success() then
        done:try_success(ch)
      elseif f:cause() ~= NOT_CONNECTED then   -- else the connect's error says why
        done:try_failure(f:cause())
      end
    end)
  end
  core.connect(o):add_listener(function(f)
    if not f:is_success() then done:try_failure(f:cause()) end
  end)
  return done
end

-- A state made inside a simulation reads its clocks (os.time, ...) there.
if core.sim_state then require("netrun.sim").patch_state() end

return netrun
