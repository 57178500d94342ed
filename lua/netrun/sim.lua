--- Whole servers on virtual time: `require "netrun.sim"`. `run` makes a
-- simulated world: every group made meanwhile runs all its loops on this
-- one thread, stepped in an order drawn from a seed, on a virtual clock
-- that jumps to the next deadline when nothing can run (`netrun.now()`,
-- timers, `os.time`, `os.date`, `os.clock`, LuaSocket's `gettime`), its
-- sockets and name lookups on an in-memory network of hosts with TCP's
-- semantics (refused, half-close, reset, bounded buffers) and UDP's
-- (loss, duplication, reordering). The code under test runs unchanged;
-- the same seed replays the same run, step for step
-- (`world:trace_hash`). Inside a world `math.random` is seeded from the
-- seed, and shared dicts and the default groups are each host's own.
-- `netrun --sim SEEDS script.lua` runs a script, or a file of scenarios
-- (a table of functions of a world), in a world per seed. See
-- docs/guide/simulation.md.
-- @module netrun.sim
-- @usage
-- local sim = require "netrun.sim"
-- local status = sim.run({ seed = 42 }, function(world)
--   world:host("b"):run("examples/http_hello.lua", { port = 80, host = "0.0.0.0" }):await()
--   return world:client(world:host "a"):request { url = "http://b/" }:await().status
-- end)

-- netrun.sim: whole servers on virtual time (DESIGN.md §9.4).
--
--   local sim = require "netrun.sim"
--   local hash = sim.run({ seed = 42 }, function(world)
--     local a, b = world:host "a", world:host "b"
--     a:run("examples/proxy.lua", { port = 80, backend = "b:8080" })
--     b:run(function() ... netrun.server { port = 8080, ... } end):await()
--     world:latency(a, b, 0.002); world:loss(0.01)
--     world:partition(a, b); world:sleep(30); world:heal()
--     local res = world:client(a):request { url = "http://a/" }:await()
--     return world:trace_hash()
--   end)
--
-- sim.run(opts, fn) runs fn(world) on the main thread inside a new world:
-- every group made meanwhile (by fn, or by code running on a host) is
-- simulated -- all loops on this one thread, stepped in an order drawn
-- from opts.seed, on a virtual clock that jumps to the next deadline when
-- nothing can run, their sockets and name lookups on an in-memory network.
-- fn may wait (future:await(), :sync(), world:sleep): waiting is what lets
-- the world run. When fn returns, every simulated group is shut down (on
-- virtual time), the world ends, and sim.run returns what fn returned. An
-- error in fn, or a wait nothing can end ("simulation stuck"), fails
-- sim.run with the seed in the message: the same seed replays the same run.
--
-- Options: seed (integer, required), latency (one-way between hosts,
-- seconds, default 0.0001), epoch (wall-clock seconds at the start,
-- default 2025-01-01T00:00:00Z), sndbuf and rcvbuf (TCP buffers, bytes,
-- default 64 KiB and 128 KiB).
--
-- The world:
--   world:host(name) --> host         a machine: "a" resolves to its address
--   world:latency(a, b, seconds)      one-way, both ways (a == b: loopback)
--   world:loss(p)                     TCP segments resent later, UDP dropped
--   world:duplicate(p); world:reorder(p)             UDP datagrams
--   world:partition(a [, b])          nothing between a and b (a and every
--                                     other host when b is nil); a or b may
--                                     be an array of hosts
--   world:heal()                      every partition ends
--   world:reset([a [, b]]) --> n      reset TCP connections (a-b, a-any, all)
--   world:sleep(seconds)              virtual seconds pass
--   world:now(), world:time()         netrun.now()'s and os.time()'s clocks
--   world:client(host [, opts])       an HTTP client on that host:
--                                     :request { url = ... } --> future
--   world:trace_hash() --> "hex"      digest of every step and packet so far
--   world:seed(), world:random(), world:stats()
-- A host:
--   host.name, host.address
--   host:run(fn, ...) --> future      fn(...) runs on the host (fn copied as
--                                     any function sent to a loop; it may
--                                     block, as on an executor)
--   host:run("script.lua", opts)      the script runs there, opts as its
--                                     arguments: { port = 80 } is
--                                     --port=80 for netrun.option
--   host:client([opts])               world:client(host, opts)
--
-- Inside a world, os.time, os.date, os.clock and LuaSocket's gettime read
-- the virtual clock, math.random is seeded from the seed, and shared dicts
-- and the default groups are each host's own.
--
-- Time passes only when nothing can run: a run that spins on the clock
-- (busy work timed by os.clock, a loop waiting for netrun.now() to move)
-- sees it move on (10 us per read past 10,000 reads in one run), and the
-- stall watchdog (stall_threshold, stall_timeout) watches such runs in
-- virtual time. A loop spinning without reading the clock stops the
-- world (there is no other thread to interrupt it).
--
-- sim.main(seeds, script, args): what `netrun --sim SEEDS script.lua ...`
-- runs -- the script in a world per seed ("42", or a range "1-100"), then
-- its groups until they end, the world is quiet, or NETRUN_SIM_TIME virtual
-- seconds (3600) pass; a failure names its seed and the command that
-- replays it. A script that returns a table of functions is a file of
-- scenarios: each function runs as fn(world) in a world of its own per
-- seed, in name order (NETRUN_SIM_ONLY=name runs one). With a range (or
-- NETRUN_SIM_REPORT set) each run's trace hash is printed:
-- spec/sim/determinism.sh compares two processes' lines.
local core = require "netrun.core"

local sim = {}

-- ---- clocks of a state inside a world ----------------------------------------------------

-- os.time, os.date, os.clock and LuaSocket's gettime on the virtual clock
-- (core.now and core.sim_wall are the world's on its thread), math.random
-- seeded by the world. Returns what undoes it (for the main state).
function sim.patch_state()
  local saved = { time = os.time, date = os.date, clock = os.clock, require = require }
  local real_time, real_date = os.time, os.date
  local start = core.now()
  os.time = function(t)
    if t ~= nil then return real_time(t) end
    return math.floor(core.sim_wall())
  end
  os.date = function(fmt, t)
    return real_date(fmt, t or math.floor(core.sim_wall()))
  end
  os.clock = function() return core.now() - start end
  math.randomseed(core.sim_random(), core.sim_random())
  local function patch_socket(m)
    if type(m) == "table" and type(m.gettime) == "function" and saved[m] == nil then
      saved[m] = m.gettime
      m.gettime = core.sim_wall
    end
  end
  patch_socket(package.loaded["socket"])       -- (LuaSocket's socket is
  patch_socket(package.loaded["socket.core"])  -- socket.core: saved once)
  local req = saved.require
  require = function(name, ...)
    local m, extra = req(name, ...)
    if name == "socket" or name == "socket.core" then patch_socket(m) end
    return m, extra
  end
  return function()
    os.time, os.date, os.clock, require = saved.time, saved.date, saved.clock, saved.require
    for m, f in pairs(saved) do
      if type(m) == "table" then m.gettime = f end
    end
    math.randomseed()
  end
end

-- ---- hosts --------------------------------------------------------------------------------

local World, Host, Client = {}, {}, {}
World.__index, Host.__index, Client.__index = World, Host, Client
-- (the classes, where docs/check_api.lua finds their methods)
sim.World, sim.Host, sim.Client = World, Host, Client

function Host:__tostring() return "netrun.sim.host(" .. self.name .. " " .. self.address .. ")" end

-- The host named or given (a Host, a name, or the C host).
local function host_of(world, x, what)
  if getmetatable(x) == Host then return x end
  if type(x) == "string" then return world:host(x) end
  error(("world:%s: expected a host (world:host \"name\") or a host name, got %s")
    :format(what, type(x)), 3)
end

-- The hosts of x (a host, a name, or an array of them), as C hosts.
local function hosts_of(world, x, what)
  if type(x) == "table" and getmetatable(x) ~= Host then
    local v = {}
    for i, h in ipairs(x) do v[i] = host_of(world, h, what)._h end
    return v
  end
  return { host_of(world, x, what)._h }
end

--- A simulated world, made by `run` and given to its function. Its calls
-- run on the main thread (the function's), hosts and names given either
-- as `host` objects or by name.
-- @type world

--- A host: a machine of the world, made on first use, whose name
-- resolves to its address (`"b:8080"`). The world's function runs on the
-- first host, `"main"`.
-- @function world:host
-- @string name a word of at most 63 bytes, without spaces, `:`, `/`, `[` or `]`
-- @treturn host the same object for the same name
-- @raise on a bad name, or once the world has ended
function World:host(name)
  local h = self._hosts[name]
  if h == nil then
    local ch = self._w:host(name)
    h = setmetatable({ world = self, name = ch:name(), address = ch:address(), _h = ch,
                       _n = 0 }, Host)
    self._hosts[name] = h
    self._hosts[ch:name()] = h
  end
  return h
end

-- A group made on host h (not the main context's default host).
local function group_on(h, make, opts)
  local prev = h.world._w:set_host(h._h)
  local ok, g = pcall(make, opts)
  h.world._w:set_host(prev)
  if not ok then error(g, 3) end
  return g
end

-- The command-line arguments of a script's options: an array as it is,
-- else --key=value for each key, in key order (the same every run).
local function argv_of(opts)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    error("host:run: a script's options are a table, got " .. type(opts), 3)
  end
  if #opts > 0 then
    local v = {}
    for i, a in ipairs(opts) do v[i] = tostring(a) end
    return v
  end
  local keys = {}
  for k in pairs(opts) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  local v = {}
  for i, k in ipairs(keys) do v[i] = "--" .. k .. "=" .. tostring(opts[k]) end
  return v
end

-- On the host's executor: the script, as `netrun script.lua args` runs it.
local function run_script(path, argv)
  local dir = path:match("^(.*)/[^/]*$")
  if dir then package.path = dir .. "/?.lua;" .. dir .. "/?/init.lua;" .. package.path end
  local a = { [0] = path }
  for i, s in ipairs(argv) do a[i] = s end
  arg = a
  local chunk = assert(loadfile(path))
  return chunk(table.unpack(argv))
end

-- On the host's executor: fn(...) as a coroutine (netrun.spawn: it may
-- await and sleep), its outcome into `done`.
local function run_there(fn, done, ...)
  require("netrun").spawn(fn, ...):add_listener(function(f)
    if f:is_success() then done:set_success(f:result()) else done:set_failure(f:cause()) end
  end)
end

--- @section end

--- A machine of a world, made by `world:host`. Its fields: `name`, and
-- `address` (its IPv4 address: `10.0.0.1` for the first host, ...).
-- @type host

--- Run a function, or a script, on this host: in a coroutine
-- (`netrun.spawn`, so it may await and sleep) on an executor group of
-- one thread made on the host (so it may block, as on an executor); the
-- groups it makes are this host's. A function is copied as any function
-- sent to a loop. A script runs as `netrun script.lua args` would run
-- it, its options as the arguments: `{ port = 80 }` is `--port=80` for
-- `netrun.option` (keys in order), an array as it is.
-- @function host:run
-- @tparam function|string what the function, or the script's path
-- @param ... the function's arguments, or the script's options (a table)
-- @treturn future completed with the function's (or the script's) result, or failed with its error
-- @raise when `what` is neither a function nor a string, on options that are not a table
-- @usage server:run("examples/http_hello.lua", { port = 80, host = "0.0.0.0" }):await()
function Host:run(what, ...)
  if type(what) ~= "function" and type(what) ~= "string" then
    error("host:run: expected a function or a script's path, got " .. type(what), 2)
  end
  local args = table.pack(...)
  if type(what) == "string" then
    args = table.pack(what, argv_of(args[1]))
    what = run_script
  end
  self._n = self._n + 1
  local g = group_on(self, require("netrun").executor_group,
                     { threads = 1, name = self.name .. (self._n > 1 and "." .. self._n or "") })
  local done = core.promise()
  g:next():execute(run_there, what, done, table.unpack(args, 1, args.n))
  return done
end

-- ---- HTTP clients on a host -----------------------------------------------------------------

local clients = {}          -- (in a host's loop state) client id -> netrun.http.client
local next_client = 0

--- An HTTP client on this host (`world:client(host, opts)`): a
-- `netrun.http.client` made with `opts` on a loop of the host.
-- @function host:client
-- @tparam[opt] table opts `netrun.http.client`'s options
-- @treturn client
function Host:client(opts)
  if self._group == nil then
    self._group = group_on(self, require("netrun").group, { threads = 1, name = self.name .. ".http" })
  end
  next_client = next_client + 1
  return setmetatable({ host = self, id = next_client, opts = opts or {} }, Client)
end

--- @section end

--- @type world

--- An HTTP client on a host (`host:client`).
-- @function world:client
-- @tparam host|string host the host, or its name
-- @tparam[opt] table opts `netrun.http.client`'s options
-- @treturn client
function World:client(h, opts) return host_of(self, h, "client"):client(opts) end

-- On the host's loop: the request on this state's client of that id.
local function request_there(id, opts, req, done)
  local sim_m = require "netrun.sim"
  local c = sim_m._clients[id]
  if c == nil then
    c = require("netrun").http.client(opts)
    sim_m._clients[id] = c
  end
  c:request(req):add_listener(function(f)
    if f:is_success() then done:set_success(f:result()) else done:set_failure(f:cause()) end
  end)
end
sim._clients = clients

--- @section end

--- An HTTP client on a host of a world, made by `world:client` or
-- `host:client`: its requests run there, on a `netrun.http.client`.
-- @type client

--- Make a request from the client's host.
-- @function client:request
-- @tparam table req the request, as `netrun.http`'s `client:request` takes it (`{ url = "http://b/" }`, ...)
-- @treturn future of the response, or failed with the error
-- @raise when `req` is not a table
function Client:request(req)
  if type(req) ~= "table" then
    error("client:request: expected a table { url = ... }, got " .. type(req), 2)
  end
  local done = core.promise()
  self.host._group:next():execute(request_there, self.id, self.opts, req, done)
  return done
end

-- ---- the world's network and clocks ----------------------------------------------------------

--- @section end

--- @type world

--- The one-way latency between two hosts, both ways (`a == b`: its
-- loopback); `run`'s `latency` until set.
-- @function world:latency
-- @tparam host|string a a host
-- @tparam host|string b another (or the same)
-- @number seconds one way
function World:latency(a, b, seconds)
  self._w:latency(host_of(self, a, "latency")._h, host_of(self, b, "latency")._h, seconds)
end
--- Packet loss between all hosts: a lost TCP segment is resent later (a
-- retransmission timeout), a lost UDP datagram is gone.
-- @function world:loss
-- @number p the probability, 0 to 1
-- @raise on a probability outside 0 to 1
function World:loss(p) self._w:loss(p) end

--- UDP datagrams delivered twice.
-- @function world:duplicate
-- @number p the probability, 0 to 1
-- @raise on a probability outside 0 to 1
function World:duplicate(p) self._w:duplicate(p) end

--- UDP datagrams delivered out of order.
-- @function world:reorder
-- @number p the probability, 0 to 1
-- @raise on a probability outside 0 to 1
function World:reorder(p) self._w:reorder(p) end

--- End every partition: what they held (TCP segments) goes on.
-- @function world:heal
function World:heal() self._w:heal() end

--- Partition: nothing passes between `a` and `b` until `world:heal`. TCP
-- segments are held back (nothing lost: a SYN is retried as Linux does,
-- and a sender held for 15 minutes gives up with a timeout); UDP
-- datagrams are lost.
-- @function world:partition
-- @tparam host|string|table a a host, its name, or an array of them
-- @tparam[opt] host|string|table b likewise; nil: every other host
function World:partition(a, b)
  local as = hosts_of(self, a, "partition")
  local bs = b ~= nil and hosts_of(self, b, "partition") or { false }
  for _, x in ipairs(as) do
    for _, y in ipairs(bs) do self._w:partition(x, y or nil) end
  end
end

--- Reset TCP connections, as a peer's RST would: those between `a` and
-- `b`, between `a` and any host, or all.
-- @function world:reset
-- @tparam[opt] host|string a a host
-- @tparam[opt] host|string b another
-- @treturn int the connections reset
function World:reset(a, b)
  return self._w:reset(a and host_of(self, a, "reset")._h, b and host_of(self, b, "reset")._h)
end

--- Let virtual seconds pass (the world runs meanwhile). On a host's
-- loop, `netrun.sleep`.
-- @function world:sleep
-- @number seconds
function World:sleep(seconds)
  local netrun = require "netrun"
  if core.current() ~= nil then return netrun.sleep(seconds) end   -- on a loop
  local p = core.promise()
  core.main_loop():schedule(seconds, function() p:set_success(true) end)
  p:sync()
end

--- The virtual clock of `netrun.now()`.
-- @function world:now
-- @treturn number seconds
function World:now() return core.now() end

--- Virtual seconds since the world began.
-- @function world:elapsed
-- @treturn number seconds
function World:elapsed() return core.now() - self._t0 end

--- The virtual wall clock of `os.time()` (from `run`'s `epoch`).
-- @function world:time
-- @treturn int seconds since 1970
function World:time() return math.floor(core.sim_wall()) end

--- The world's seed.
-- @function world:seed
-- @treturn int
function World:seed() return self._w:seed() end

--- A number from the world's generator (drawn from the seed: the same in
-- every run of it).
-- @function world:random
-- @treturn int
function World:random() return self._w:random() end

--- A digest of every step and packet so far: two runs of one seed that
-- went the same way have the same.
-- @function world:trace_hash
-- @treturn string 16 hexadecimal digits
function World:trace_hash() return self._w:trace_hash() end

--- The world's counters.
-- @function world:stats
-- @treturn table `{ steps, events, connections, bytes, datagrams, resets }`
function World:stats() return self._w:stats() end

--- @section end

-- ---- running --------------------------------------------------------------------------------

-- Every simulated group: shut down (virtual time passes), then waited for.
local function shut_all(world)
  local live = {}
  for _, g in ipairs(core.groups()) do
    if core.sim_owns(g) then
      live[#live + 1] = g
      g:shutdown_gracefully(0, 5)
    end
  end
  for _, g in ipairs(live) do
    local ok, err = pcall(function() g:termination_future():sync() end)
    if not ok then return nil, tostring(err) end
  end
  return true
end

local current_world

--- Run `fn(world)` on the main thread in a new world. `fn` may wait
-- (`future:await()`, `:sync()`, `world:sleep`): waiting is what lets the
-- world run. When it returns, every simulated group is shut down (on
-- virtual time) and the world ends. A wait that nothing can end fails
-- with "simulation stuck" instead of hanging.
-- @function run
-- @tparam table opts
-- @int opts.seed the seed: the same seed replays the same run
-- @number[opt=0.0001] opts.latency one-way latency between hosts, seconds
-- @int[opt] opts.epoch the virtual wall clock at the start, seconds since 1970 (2025-01-01T00:00:00Z)
-- @int[opt=65536] opts.sndbuf a TCP socket's send buffer, bytes
-- @int[opt=131072] opts.rcvbuf a TCP socket's receive buffer, bytes
-- @tparam function fn `fn(world)`
-- @return what `fn` returns
-- @raise `fn`'s error, or the shutdown's, as `"netrun.sim: seed N: ..."`; on bad options; on a loop, or inside a world
function sim.run(opts, fn)
  if type(opts) ~= "table" then
    error("netrun.sim.run: expected a table of options { seed = n }, got " .. type(opts), 2)
  end
  if type(fn) ~= "function" then
    error("netrun.sim.run: expected a function(world), got " .. type(fn), 2)
  end
  if math.type(opts.seed) ~= "integer" then
    error("netrun.sim.run: seed must be an integer, got " .. tostring(opts.seed), 2)
  end
  local w = core.sim_begin(opts)
  local world = setmetatable({ _w = w, _hosts = {}, _t0 = core.now() }, World)
  world:host(w:set_host(nil):name())           -- the first host ("main")
  local restore = sim.patch_state()
  local outer = current_world
  current_world = world
  local r = table.pack(xpcall(fn, debug.traceback, world))
  local shut, why = shut_all(world)
  current_world = outer
  restore()
  core.sim_end(w)
  if not r[1] then
    error(("netrun.sim: seed %d: %s"):format(opts.seed, tostring(r[2])), 0)
  end
  if not shut then
    error(("netrun.sim: seed %d: shutting the world down: %s"):format(opts.seed, why), 0)
  end
  return table.unpack(r, 2, r.n)
end

--- The world running, or nil: for a script that runs in one (run by
-- `netrun --sim`) rather than making its own.
-- @function world
-- @treturn world|nil
function sim.world() return current_world end

local function seeds_of(spec)
  local a, b = tostring(spec):match("^(%d+)%-(%d+)$")
  if a then return math.tointeger(a), math.tointeger(b) end
  local s = math.tointeger(tonumber(spec))
  if s == nil then error("netrun --sim: a seed is an integer or a range N-M, got " .. tostring(spec), 0) end
  return s, s
end

-- The functions of a table of scenarios, by name.
local function scenario_names(t)
  local names = {}
  for k, v in pairs(t) do
    if type(k) == "string" and type(v) == "function" then names[#names + 1] = k end
  end
  table.sort(names)
  return names
end

local function failed(seed, err, replay, only)
  io.stderr:write(tostring(err), "\n",
    ("netrun: the simulation failed with seed %d; replay it with: %s%s\n")
      :format(seed, only and ("NETRUN_SIM_ONLY=" .. only .. " ") or "", replay:format(seed)))
  return 1
end

-- `netrun --sim SEEDS script.lua args...`: 0 if every seed's run passed.
-- A script that returns a table of functions is a file of scenarios: each
-- runs in a world of its own, per seed, in name order (NETRUN_SIM_ONLY
-- names one); any other script runs as netrun would run it.
function sim.main(spec, script, args, cmdline)
  local first, last = seeds_of(spec)
  local limit = tonumber(os.getenv("NETRUN_SIM_TIME") or "") or 3600
  local only = os.getenv("NETRUN_SIM_ONLY")
  if only == "" then only = nil end
  local report = first ~= last or os.getenv("NETRUN_SIM_REPORT")
  local chunk = assert(loadfile(script))
  local replay = cmdline or ("netrun --sim %d " .. script)
  local function finish(world)
    return world:trace_hash(), world:elapsed(), world:stats()
  end
  for seed = first, last do
    local scenarios
    local ok, err, elapsed, stats = pcall(sim.run, { seed = seed }, function(world)
      local a = { [0] = script }
      for i, s in ipairs(args) do a[i] = s end
      arg = a
      local r = chunk(table.unpack(args))
      if type(r) == "table" and getmetatable(r) == nil and #scenario_names(r) > 0 then
        scenarios = r
        return finish(world)
      end
      -- then, as netrun does, its groups run: until they end, for
      -- NETRUN_SIM_TIME virtual seconds at most, or until nothing can
      -- happen any more (netrun.run returns when the world is stuck)
      world._w:limit(limit)
      core.run()
      world._w:limit(nil)
      return finish(world)
    end)
    if not ok then return failed(seed, err, replay) end
    if scenarios then
      for _, name in ipairs(scenario_names(scenarios)) do
        if only == nil or only == name then
          ok, err, elapsed, stats = pcall(sim.run, { seed = seed, epoch = scenarios.epoch },
            function(world)
            scenarios[name](world)
            return finish(world)
          end)
          if not ok then return failed(seed, err, replay, name) end
          if report then
            io.stderr:write(("netrun --sim: seed %d %s: trace %s, %.3f s virtual, %d steps\n")
              :format(seed, name, err, elapsed, stats.steps))
          end
        end
      end
    elseif report then
      io.stderr:write(("netrun --sim: seed %d: trace %s, %.3f s virtual, %d steps\n")
        :format(seed, err, elapsed, stats.steps))
    end
  end
  if report then io.stderr:write(("netrun --sim: seeds %d-%d passed\n"):format(first, last)) end
  return 0
end

return sim
