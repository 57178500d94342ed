-- netrun: the public Lua module. The C core (netrun.core) provides groups,
-- loops, futures, channels, pipelines and shared dicts; this file adds the
-- parts that are policy rather than mechanism.

--- A Lua-scriptable network runtime: Netty's event loops in C, handlers in Lua.
--
-- `local netrun = require "netrun"` (preloaded in every loop's state and in
-- the `netrun` executable). Groups of single-threaded event loops run
-- channels (TCP, UDP, Unix sockets) through pipelines of handlers; each
-- loop thread runs its handlers in its own `lua_State`, and values cross
-- between states by copy. Durations are seconds as Lua
-- numbers. Programmer mistakes (a wrong type, an unknown option or handler
-- name, use after shutdown) raise; runtime failures (a refused connect, a
-- peer's reset) fail futures or reach `exception_caught`.
--
-- `netrun.version` is the version string (`"0.1.0"`). The parts loaded on
-- first use have pages of their own: `netrun.http`, `netrun.websocket`,
-- `netrun.tcp` (streams), `netrun.dns`, `netrun.json`, `netrun.metrics`,
-- `netrun.redis`.
-- @module netrun
local core = require "netrun.core"
-- Option errors name the caller's line, past netrun's own modules: those
-- are the files of this directory (runtime/bindings/lopts.c).
core.options_home()

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

--- Logging: `netrun.log`.
-- @section log

--- Log a line at level debug, formatted with `string.format(fmt, ...)` only
-- when the level is enabled (`NETRUN_LOG=debug`, or `log.level "debug"`).
-- Each line names its thread; lines are written by a log thread, off the loops.
-- @function log.debug
-- @string fmt a format, or the message itself when no argument follows
-- @param ... the format's arguments

--- Log a line at level info (the default level); as `log.debug`.
-- @function log.info
-- @string fmt a format, or the message
-- @param ... the format's arguments

--- Log a line at level warn; as `log.debug`.
-- @function log.warn
-- @string fmt a format, or the message
-- @param ... the format's arguments

--- Log a line at level error; as `log.debug`.
-- @function log.error
-- @string fmt a format, or the message
-- @param ... the format's arguments

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

--- Get or set the process's log level (every state and thread shares it).
-- @string[opt] name `"debug"`, `"info"`, `"warn"` or `"error"`; an unknown name raises
-- @treturn string the level now in force, or `"off"`
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

--- @section end

netrun.shared = { dict = core.dict }

--- A future of the results of several futures, in their order; it fails
-- with the first failure's cause. Results are copied into the caller's state.
-- @tparam {future,...} futures the futures (an empty array succeeds at once with `{}`)
-- @treturn future of the array of results
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

--[[--
A script's option: `--name value` or `--name=value` in the global `arg`
(what `netrun script.lua ...` passes; loop and executor states get the
command line of the state that made their group), else the environment
variable `NAME` (upper case, `-` as `_`), else `default`.
@string name the option's name
@param[opt] default its default; a number makes the value a number, and a value that is not one raises
@return the value
@usage local port = netrun.option("port", 7000)
]]
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

--[[--
Every value of a script's option given several times (`--backend a
--backend b`, or `--backend=a`), in order; else the environment variable
`NAME` split at commas (`BACKEND=a,b`); else an empty array.
@string name the option's name
@treturn {string,...} the values
@usage local backends = netrun.options("backend")
]]
function netrun.options(name)
  local values = {}
  local args = rawget(_G, "arg") or {}
  local flag = "--" .. name
  local eq = "^" .. flag:gsub("%-", "%%-") .. "=(.*)$"
  local i = 1
  while i <= #args do
    if args[i] == flag and args[i + 1] ~= nil then
      values[#values + 1] = args[i + 1]
      i = i + 1
    else
      local v = args[i]:match(eq)
      if v then values[#values + 1] = v end
    end
    i = i + 1
  end
  if #values == 0 then
    local env = os.getenv((name:upper():gsub("%-", "_")))
    if env then
      for v in env:gmatch("[^,%s]+") do values[#values + 1] = v end
    end
  end
  return values
end

-- Batteries: native handlers from the C side (core.codec, core.handler).
netrun.codec = core.codec
netrun.handler = core.handler

-- Operating a live process (DESIGN §8.5): this state remembers the files
-- its modules come from, for netrun.reload(); netrun.handler.metrics
-- serves netrun.metrics.text() over HTTP.
require("netrun.reload").watch()
--- Hot reload: re-require, in every loop's state and this one, the Lua
-- modules whose files changed (also SIGHUP, `netrun reload
-- CONSOLE_PATH` and the REPL's `:reload`). New connections get the new
-- code, live ones keep theirs; a module that fails to load leaves the old
-- one running and says why. Server inits are re-run from their modules.
-- @return a report of what was reloaded and what failed
function netrun.reload() return require("netrun.reload").reload() end
if core.handler.metrics == nil then
  --- Handlers: `netrun.handler`.
  -- @section handler

  --- Serves `netrun.metrics.text()` over HTTP: put it after
  -- `codec.http_server`; a request for its path gets the metrics, others
  -- go on to the next handler.
  -- @function handler.metrics
  -- @tparam[opt] table opts
  -- @string[opt="/metrics"] opts.path the path it answers
  -- @return a handler
  core.handler.metrics = function(opts) return require("netrun.metrics").handler(opts) end
end

--- @section end

-- Parts loaded on first use (a state that never calls out pays nothing):
-- netrun.json, netrun.dns, netrun.tcp, netrun.http (the client, and
-- unescape(s): + and %XX decoded), netrun.websocket, netrun.metrics,
-- netrun.redis, netrun.nats (the NATS client), netrun.limit.
local LAZY = { json = "netrun.json", dns = "netrun.dns", tcp = "netrun.stream",
               http = "netrun.http", websocket = "netrun.websocket",
               metrics = "netrun.metrics", redis = "netrun.redis", nats = "netrun.nats",
               limit = "netrun.limit" }
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

-- A copy of opts, its init checked: the copy's init is the caller's
-- (core.server and core.connect check the rest, tls among them).
local function copy(what, opts)
  local init = opts.init
  if init ~= nil and type(init) ~= "function" then
    core.option_error(what, "init", init, "a function")
  end
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  return o, init
end

--- Start a server: a listening channel on a boss loop whose accepted
-- channels each live on a child loop for life (Netty's ServerBootstrap).
-- The result is a future of the server channel (`channel:local_address`,
-- `channel:close`, `channel:set_init`).
-- @tparam table opts the options; an unknown key raises
-- @tparam[opt] group opts.group the boss group (default: 1 boss loop made once per process); a loop may be given
-- @tparam[opt] group opts.child_group the loops of the accepted channels (default: the process's workers, #CPUs or `netrun -t N`; `group` alone serves both roles)
-- @string[opt="0.0.0.0"] opts.host the address or host name to bind (a name is resolved without blocking a loop)
-- @int[opt] opts.port the port (0 binds an ephemeral one: see `channel:local_address`); a numeric string is taken
-- @string[opt] opts.unix a Unix socket path instead of host and port
-- @int[opt] opts.mode the Unix socket file's mode (default: the umask's)
-- @int[opt=1024] opts.backlog the listen backlog
-- @bool[opt=false] opts.reuseport one listener per child loop (SO_REUSEPORT), no boss hop
-- @tparam[opt] table opts.child_options the accepted channels' options: `tcp_nodelay` (true), `keepalive`, `auto_read` (true), `allow_half_closure`, `write_buffer_low` (32768), `write_buffer_high` (65536), `sndbuf`, `rcvbuf`, `send_timeout` (60 s; 0: none)
-- @tparam[opt] function opts.init `init(ch)`, run on the child's loop for each accepted channel (copied there); it builds the pipeline
-- @tparam[opt] function opts.stream `fn(s)`, run as a coroutine per connection with a `netrun.tcp` stream (instead of `init`)
-- @param[opt] opts.tls a `tls.server` config: TLS first in every child pipeline, before what `init` adds
-- @param[opt] opts.metrics a label for this server's connection counts in `netrun.metrics`
-- @treturn future of the server channel; it fails when the bind does (`netrun.server: port 80: EACCES: permission denied`)
-- @usage netrun.server { host = "127.0.0.1", port = 7000,
--   init = function(ch) ch:pipeline():add_last("echo", Echo) end }:sync()
function netrun.server(opts)
  if type(opts) ~= "table" or opts.tls == nil then return core.server(opts) end
  local o, init = copy("netrun.server", opts)
  local tls = opts.tls
  o.init = function(ch)
    ch:pipeline():add_first("tls", tls)
    if init then init(ch) end
  end
  return core.server(o)
end

local NOT_CONNECTED = "channel closed before it connected"   -- runtime/tls/handler.c

--- Connect a TCP (or Unix) channel: Netty's Bootstrap. A host name is
-- resolved off the loop and its addresses tried in turn (RFC 8305).
-- @tparam table opts the options; an unknown key raises
-- @tparam[opt] group opts.group where the channel lives (its next loop; a loop may be given, e.g. `ctx:loop()`; default: the process's workers)
-- @string[opt="127.0.0.1"] opts.host a name, an address, or an array of addresses tried in turn
-- @int opts.port the port
-- @string[opt] opts.unix a Unix socket path instead
-- @number[opt=30] opts.timeout seconds for the whole connect (0: none)
-- @tparam[opt] table opts.options the channel's options, as `child_options` of `netrun.server` (`send_timeout` none by default)
-- @tparam[opt] function opts.init `init(ch)`, run on the channel's loop before it connects
-- @param[opt] opts.tls a `tls.client` config: TLS first in the pipeline, the server name checked against `host`; the future then completes after the handshake
-- @treturn future of the connected channel; it fails with the connect's (or the handshake's) error
function netrun.connect(opts)
  -- With tls, the future completes with the channel once the handshake
  -- did, and fails with OpenSSL's reason when it failed (a certificate
  -- that does not verify, say), or with the connect's when no address
  -- answered (then no handshake began).
  if type(opts) ~= "table" or opts.tls == nil then return core.connect(opts) end
  local o, init = copy("netrun.connect", opts)
  local tls, host, unix = opts.tls, opts.host or "127.0.0.1", opts.unix
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
