-- check_api.lua -- the API reference's gap check (run by scripts/api_docs.sh,
-- the ctest test docs/api): holds what LDoc documented (the items file
-- docs/ldoc_items.lua writes) against the public API of a live state, and
-- fails on a gap either way.
--
--   lua5.4 docs/check_api.lua ITEMS_FILE BUILD_DIR
--
-- The live API is walked, not listed: every function of the `netrun`
-- module and of its tables (netrun.codec, netrun.tls, ...), every function
-- of each module it loads (netrun.http, netrun.redis, ...), every method
-- of every handle class registered in the registry as "netrun.*", and the
-- methods of the classes written in Lua. So a function added anywhere there
-- fails this check until a doc comment names it; a doc comment left for a
-- function that is gone fails it too. What a live table shows but is not
-- public API is named below, in INTERNAL and in the class tables, each with
-- why.
local items_file, build = arg[1], arg[2]
assert(items_file and build, "usage: lua5.4 docs/check_api.lua ITEMS_FILE BUILD_DIR")
local root = debug.getinfo(1, "S").source:match("^@(.*)/docs/check_api%.lua$") or "."
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. package.path
package.cpath = build .. "/lib/?.so;" .. package.cpath

local netrun = require "netrun"

local failures = {}
local function fail(fmt, ...)
  failures[#failures + 1] = string.format(fmt, ...)
end

---------------------------------------------------------------------------
-- What LDoc documented.
local modules = {}     -- name -> { items = { name -> item }, file = }
for line in io.lines(items_file) do
  local m, name, section, kind, summary, where = line:match(
    "^([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)$")
  assert(m, "bad line in " .. items_file .. ": " .. line)
  modules[m] = modules[m] or { items = {} }
  if section == "module" and name == "" then
    modules[m].file = where
    if summary ~= "yes" then fail("module %s (%s) has no summary", m, where) end
  else
    -- LDoc keeps an item's module prefix when it inferred the name from
    -- `function netrun.log.level`: netrun.log.level is log.level.
    if name:sub(1, #m + 1) == m .. "." then name = name:sub(#m + 2) end
    modules[m].items[name] = { section = section, kind = kind, where = where,
                               summary = summary == "yes", used = false }
  end
end

local function item(module, name)
  local mod = modules[module]
  return mod and mod.items[name]
end

-- A public function must be documented: an item of that name, with a summary.
local function expect(module, name, what)
  local it = item(module, name)
  if it == nil then
    fail("undocumented: %s (module %s, item %s): add a doc comment beside its code", what, module, name)
    return
  end
  it.used = true
  if not it.summary then fail("%s (%s) has a doc comment without a summary", what, it.where) end
end

-- (A name that begins with "_" is private by Lua's convention: a module's
-- parts share it, and no program calls it.)
local function sorted_keys(t)
  local ks = {}
  for k in pairs(t) do
    if type(k) == "string" and k:sub(1, 1) ~= "_" then ks[#ks + 1] = k end
  end
  table.sort(ks)
  return ks
end

---------------------------------------------------------------------------
-- What a live table shows that is not public API, per module: the parts
-- modules share with each other (netrun.redis.cluster uses netrun.redis's
-- internals, the stream server uses netrun.stream's handler), defaults the
-- options override, and tables of constants.
local INTERNAL = {
  ["netrun.http"] = {
    attach = "the pool's hand-over of a new connection (lhttp_pool.c calls it)",
    attach_stream = "a stream = true request's connection init (its codec and handler)",
    request_with = "the request path shared by netrun.http.request and client:request",
    default_tls = "the client's default TLS config, made once per state",
    stats = "the pools' counters, read by netrun.metrics",
    parse_url = "the client's URL parser, kept reachable for its specs and tools",
    Client = "the class table (its methods are documented as client:...)",
  },
  ["netrun.redis"] = {
    conn = "the connection layer shared with netrun.redis.cluster",
    internal = "pools and commands, for specs and netrun.redis.cluster",
    Client = "the class table (methods documented as client:...)",
    Error = "the class of error replies inside arrays (see is_error)",
    Pipeline = "the class of the pipeline object (methods documented as pipeline:...)",
    PipelineMT = "its metatable",
    Subscription = "the class of a callback subscription (sub:close documented)",
    BLOCKING = "the blocking commands, shared with the cluster client",
    SPECIAL = "commands with their own methods, shared with the cluster client",
    KEYS = "the option names, shared with the cluster client",
    blocks = "whether a command blocks, shared with the cluster client",
    fix_scripts = "EVALSHA's fallback, shared with the cluster client",
    give_pipeline = "pipeline plumbing, shared with the cluster client",
    new_pipeline = "pipeline plumbing, shared with the cluster client",
    pipeline_state = "pipeline plumbing, shared with the cluster client",
    new_id = "connection ids, shared with the cluster client",
    on_main = "runs a call from the main thread on a loop, shared with the cluster client",
    parse_url = "URL parsing, shared with the cluster client",
    result = "reply conversion, shared with the cluster client",
    settings = "option reading, shared with the cluster client",
    sha_of = "script digests, shared with the cluster client",
  },
  ["netrun.metrics"] = {
    Handler = "the class of netrun.metrics.handler's handler",
    redis_families = "the Redis client's families, rendered by text()",
  },
  ["netrun.dns"] = {
    connect = "netrun.connect's path for a host name (lchannel.c calls it)",
    listen = "netrun.server's and netrun.udp's path for a host name on a loop",
  },
  ["netrun.sim"] = {
    main = "what `netrun --sim SEEDS script.lua` runs (bin/netrun.c calls it)",
    patch_state = "a state's clocks inside a world, set by netrun's init on each loop's state",
  },
  ["netrun.json"] = {},
  ["netrun.tcp"] = {},      -- (the table netrun.tcp holds only connect)
  ["netrun.websocket"] = {},
}

-- Handle classes made in C, by their registry name: the LDoc module and
-- class documenting them, or false and why not.
local C_CLASSES = {
  ["netrun.group"] = { "netrun", "group" },
  ["netrun.loop"] = { "netrun", "loop" },
  ["netrun.future"] = { "netrun", "future" },
  ["netrun.channel"] = { "netrun", "channel" },
  ["netrun.channel_group"] = { "netrun", "channel_group" },
  ["netrun.pipeline"] = { "netrun", "pipeline" },
  ["netrun.ctx"] = { "netrun", "ctx" },
  -- A handler on an executor group (pipeline:add_last(group, ...)) gets a
  -- ctx of its own kind with a subset of ctx's methods.
  ["netrun.xctx"] = { "netrun", "ctx" },
  ["netrun.embedded"] = { "netrun", "embedded" },
  ["netrun.dict"] = { "netrun", "dict" },
  ["netrun.metric"] = { "netrun.metrics", "metric" },
  ["netrun.http.pool"] = false,      -- the C half of netrun.http's pools
  ["netrun.upstream_state"] = false, -- the C half of netrun.http.upstream (shared counts)
  ["netrun.redis.codec"] = false,    -- the C half of netrun.redis's connections
  ["netrun.nats.wire"] = false,      -- the C half of netrun.nats's connections
  ["netrun.ctx.handle"] = false,     -- a ctx's anchor, no methods
  -- (the world and host a program uses are Lua objects wrapping these:
  -- lua_classes; their C methods are what those call, not public)
  ["netrun.sim.world"] = false,      -- the C half of netrun.sim's world
  ["netrun.sim.host"] = false,       -- the C half of netrun.sim's hosts
}

-- Classes written in Lua: where their methods are, from live objects or
-- the class tables their modules keep. (Nothing finds a new one: a module
-- that adds a class adds its row here, and documents it with `@type`.)
local function lua_classes()
  local redis = netrun.redis
  local stream = require "netrun.stream"
  local cluster = require "netrun.redis.cluster"
  local nats = netrun.nats
  local sim = require "netrun.sim"
  -- A connection's publish is a field of each connection (a C function
  -- around its wire, made by connect), not of its class: a connection
  -- cannot be made here without a server, so it is added by hand.
  local nats_connection = { publish = require("netrun.core").nats.publisher }
  for k, v in pairs(nats.Conn) do nats_connection[k] = v end
  return {
    { "netrun.http", "client", getmetatable(netrun.http.client {}).__index },
    { "netrun.http", "upstream", require("netrun.upstream").Upstream },
    { "netrun.tcp", "stream", stream.Stream },
    { "netrun.redis", "client", getmetatable(redis.connect { host = "127.0.0.1", port = 1 }).__index },
    { "netrun.redis", "pipeline", redis.PipelineMT.__index },
    { "netrun.redis", "subscription", redis.Subscription.__index },
    { "netrun.redis", "cluster", cluster.Cluster },
    -- (a cluster's pipeline records what a client's encodes: the same methods)
    { "netrun.redis", "pipeline", cluster.CPipe },
    { "netrun.nats", "connection", nats_connection },
    { "netrun.nats", "subscription", nats.Sub },
    { "netrun.nats", "msg", nats.Msg },
    -- (a context is made without I/O: Conn.jetstream's object, on no connection)
    { "netrun.nats", "jetstream", getmetatable(nats.Conn.jetstream({})).__index },
    { "netrun.sim", "world", sim.World },
    { "netrun.sim", "host", sim.Host },
    { "netrun.sim", "client", sim.Client },
  }
end

---------------------------------------------------------------------------
local counts = { functions = 0, methods = 0 }

-- Functions of a module's table, and of its tables that are not modules of
-- their own (netrun.codec, netrun.log, ...), as items "prefix.name".
local function walk(module, t, prefix, internal, depth)
  for _, k in ipairs(sorted_keys(t)) do
    local v = rawget(t, k) or t[k]
    local name = prefix .. k
    if internal and internal[k] then
      -- not public
    elseif type(v) == "function" then
      counts.functions = counts.functions + 1
      expect(module, name, (module == "netrun" and "netrun." or module .. ".") .. name)
    elseif type(v) == "table" and depth == 0 and module == "netrun" then
      if modules["netrun." .. k] then
        walk("netrun." .. k, v, "", INTERNAL["netrun." .. k], 1)
      elseif INTERNAL["netrun." .. k] then
        fail("netrun.%s is listed in INTERNAL but LDoc documents no module netrun.%s", k, k)
      else
        walk(module, v, name .. ".", nil, depth + 1)
      end
    elseif type(v) == "table" and depth == 1 and module == "netrun" then
      walk(module, v, name .. ".", nil, depth + 1)
    end
  end
end

-- The parts netrun loads on first use (netrun.http, ...): the table LAZY,
-- an upvalue of its __index, so that a part added there is walked without
-- a line here.
local function lazy_parts()
  local mt = getmetatable(netrun)
  local index = mt and rawget(mt, "__index")
  if type(index) == "function" then
    for i = 1, 255 do
      local name, v = debug.getupvalue(index, i)
      if name == nil then break end
      if name == "LAZY" and type(v) == "table" then return v end
    end
  end
  fail("netrun's lazily loaded parts (LAZY, an upvalue of its metatable's __index) " ..
       "are not where docs/check_api.lua looks for them")
  return {}
end
local LAZY = lazy_parts()

-- The netrun module; its lazily loaded parts first, so pairs shows them.
for _, k in ipairs(sorted_keys(LAZY)) do
  local _ = netrun[k]
end
walk("netrun", netrun, "", nil, 0)

-- Every file lua/netrun/X.lua is a part of netrun walked above (LAZY), a
-- module of its own that a program requires (documented with `@module
-- netrun.X`: walked here), or one of these, with why. Files under
-- lua/netrun/X/ are parts of netrun.X, documented under its @module.
local PRIVATE_MODULES = {
  init = "the netrun module itself, walked above",
  console = "the console socket of `netrun --console`, reached through the CLI",
  pretty = "the REPL's printer",
  reload = "hot reload's machinery (netrun.reload is documented)",
  repl = "the REPL, reached through the CLI",
  top = "`netrun top`, reached through the CLI",
  upstream = "netrun.http.upstream's Lua half (documented in netrun.http)",
}
local lazy_modules = {}
for _, name in pairs(LAZY) do lazy_modules[name] = true end
local files = {}
local ls = assert(io.popen("ls '" .. root .. "/lua/netrun'"))
for file in ls:lines() do
  local x = file:match("^(.+)%.lua$")
  if x then files[#files + 1] = x end
end
ls:close()
local seen = {}
for _, x in ipairs(files) do
  local name = "netrun." .. x
  seen[x] = true
  if PRIVATE_MODULES[x] or lazy_modules[name] then
    -- not public, or walked as a part of netrun
  elseif modules[name] then
    walk(name, require(name), "", INTERNAL[name], 1)
  else
    fail("lua/netrun/%s.lua (%s) is neither loaded by netrun (its LAZY table) nor documented " ..
         "(`@module %s`) nor in docs/check_api.lua's PRIVATE_MODULES", x, name, name)
  end
end
for x in pairs(PRIVATE_MODULES) do
  if not seen[x] then fail("docs/check_api.lua's PRIVATE_MODULES names lua/netrun/%s.lua, which is gone", x) end
end

local classes = {}    -- "module class" -> true, the classes seen live
local function class_methods(module, class, methods, what)
  classes[module .. " " .. class] = true
  for _, k in ipairs(sorted_keys(methods)) do
    if type(methods[k]) == "function" then
      counts.methods = counts.methods + 1
      expect(module, class .. ":" .. k, what .. ":" .. k)
    end
  end
end

for name, mt in pairs(debug.getregistry()) do
  if type(name) == "string" and name:match("^netrun%.") and type(mt) == "table" then
    local methods = type(rawget(mt, "__index")) == "table" and rawget(mt, "__index")
                    or type(rawget(mt, "methods")) == "table" and rawget(mt, "methods") or nil
    local doc = C_CLASSES[name]
    if doc == nil and methods and next(methods) then
      fail("handle class %s has methods but is not in docs/check_api.lua's C_CLASSES: "
           .. "document it (a @type section) and map it there", name)
    elseif doc and methods then
      class_methods(doc[1], doc[2], methods, name)
    elseif doc then
      classes[doc[1] .. " " .. doc[2]] = true
    end
  end
end
for name in pairs(C_CLASSES) do
  if debug.getregistry()[name] == nil then
    fail("docs/check_api.lua's C_CLASSES names %s, which no state registers", name)
  end
end
for _, c in ipairs(lua_classes()) do
  class_methods(c[1], c[2], c[3], c[1] .. "." .. c[2])
end

---------------------------------------------------------------------------
-- The other way: every documented function is live, and every method sits
-- in its class's section.
for mname, mod in pairs(modules) do
  for name, it in pairs(mod.items) do
    local class, method = name:match("^([%w_]+):([%w_]+)$")
    if class then
      if it.section ~= "Class " .. class then
        fail("%s (%s) is in section '%s', not 'Class %s': put it after a `@type %s` block",
             name, it.where, it.section, class, class)
      end
      if not classes[mname .. " " .. class] then
        fail("%s (%s): module %s has no live class %s (docs/check_api.lua knows it as?)",
             name, it.where, mname, class)
      end
    elseif it.kind == "function" and it.section:match("^Class ") then
      fail("%s (%s) is a function in %s: name it class:method, or end the class with `@section end`",
           name, it.where, it.section)
    end
    if it.kind == "function" and not it.used then
      fail("documented but not in the live API: %s (%s) in module %s", name, it.where, mname)
    end
  end
end

if #failures > 0 then
  table.sort(failures)
  for _, f in ipairs(failures) do io.stderr:write("check_api: ", f, "\n") end
  io.stderr:write(string.format("check_api: %d problem(s)\n", #failures))
  os.exit(1)
end
print(string.format("check_api: %d public functions documented (%d functions, %d methods)",
                    counts.functions + counts.methods, counts.functions, counts.methods))
os.exit(0)
