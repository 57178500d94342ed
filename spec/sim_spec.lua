-- The simulation's Lua face (lua/netrun/sim.lua, DESIGN.md §9.4): what
-- sim.run returns and raises, virtual time, hosts and their names, host:run
-- with a function and with a script, world:client, latency, partitions,
-- resets, loss, UDP, the clocks Lua reads inside, the main loop given back,
-- and `netrun --sim` with its seed ranges and its failing seed.
local H = require "spec.helper"
local netrun = H.netrun
local sim = require "netrun.sim"
local core = require "netrun.core"

local FIX = H.root .. "/spec/fixtures/sim/"

-- On host h: an HTTP server answering "<name> <path>" on port.
local function hello(h, port)
  return h:run(function(p, name)
    local netrun = require "netrun"
    local codec = netrun.codec.http_server {}
    netrun.server { port = p, init = function(ch)
      ch:pipeline():add_last("http", codec)
      ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
        ctx:write_and_flush { status = 200, body = name .. " " .. req.path }
      end })
    end }:sync()
    return p
  end, port, h.name)
end

local function wall() return H.socket.gettime() end

describe("netrun.sim.run", function()
  it("returns what fn returns, and raises fn's error with its seed", function()
    local a, b, c = sim.run({ seed = 7 }, function(world) return 1, "two", { 3 } end)
    assert.are.same({ 1, "two", { 3 } }, { a, b, c })
    local ok, err = pcall(sim.run, { seed = 7 }, function() error("boom") end)
    assert.is_false(ok)
    assert.matches("seed 7: .*boom", err)
    assert.has_error(function() sim.run({}, function() end) end,
      "netrun.sim.run: seed must be an integer, got nil")
  end)

  it("lets fn wait on virtual time: an hour passes in far less than a second", function()
    local t0 = wall()
    local passed = sim.run({ seed = 1 }, function(world)
      local n0, o0 = netrun.now(), os.time()
      world:sleep(3600)
      return netrun.now() - n0, os.time() - o0
    end)
    assert.are.same({ 3600, 3600 }, { math.floor(passed + 0.5), 3600 })
    assert.is_true(wall() - t0 < 2)
  end)

  it("gives the main loop back and the clocks too", function()
    local main = core.main_loop()
    local t = os.time()
    sim.run({ seed = 1, epoch = 1000000000 }, function(world)
      assert.are_not.equal(main, core.main_loop())
      assert.are.equal(1000000000, os.time())
      assert.are.equal("2001-09-09", os.date("!%Y-%m-%d"))
      assert.is_truthy(sim.world())
    end)
    assert.are.equal(main, core.main_loop())
    assert.is_true(os.time() >= t)
    assert.is_nil(sim.world())
    assert.is_nil(core.sim_current())
  end)

  it("simulates the groups fn and hosts make, and shuts them down at the end", function()
    local g
    sim.run({ seed = 2 }, function(world)
      g = netrun.group { threads = 2 }
      assert.is_true(core.sim_owns(g))
      local inner = world:host("a"):run(function()
        return require("netrun.core").sim_owns(require("netrun").group { threads = 1 })
      end):await()
      assert.is_true(inner)
      assert.are.equal(2, #g:loops())
    end)
    assert.is_true(g:is_terminated())
    assert.is_false(core.sim_owns(netrun.executor_group { threads = 1 }))
  end)

  it("fails a wait nothing can end instead of hanging", function()
    local ok, err = pcall(sim.run, { seed = 3 }, function()
      netrun.promise():await()
    end)
    assert.is_false(ok)
    assert.matches("seed 3: .*simulation stuck", err)
  end)

  it("refuses to nest", function()
    sim.run({ seed = 4 }, function()
      assert.has_error(function() sim.run({ seed = 5 }, function() end) end)
    end)
  end)
end)

describe("a simulated world", function()
  it("resolves a host's name to its address and serves HTTP between hosts", function()
    local body, addr, resolved = sim.run({ seed = 10 }, function(world)
      local a, b = world:host "a", world:host "b"
      hello(b, 8080):await()
      local res = world:client(a):request { url = "http://b:8080/x" }:await()
      local addrs = a:run(function() return require("netrun").dns.resolve("b"):await() end):await()
      return res.body, b.address, addrs[1]
    end)
    assert.are.equal("b /x", body)
    assert.are.equal(addr, resolved)
    assert.matches("^10%.0%.0%.%d+$", addr)
  end)

  it("has one-way latency: a request's connect and exchange take two round trips", function()
    local took = sim.run({ seed = 11 }, function(world)
      local a, b = world:host "a", world:host "b"
      world:latency(a, b, 0.05)
      hello(b, 80):await()
      local t = netrun.now()
      world:client(a):request { url = "http://b/" }:await()
      return netrun.now() - t
    end)
    assert.is_true(math.abs(took - 0.2) < 0.002, "took " .. took)
  end)

  it("runs a script on a host with its options as arguments", function()
    local body = sim.run({ seed = 12 }, function(world)
      local a, b = world:host "a", world:host "b"
      local port = b:run(FIX .. "hello_server.lua", { port = 9090, name = "bee" }):await()
      assert.are.equal(9090, port)
      return world:client(a):request { url = "http://b:9090/y" }:await().body
    end)
    assert.are.equal("hello from bee /y", body)
  end)

  it("runs examples/proxy.lua between a client and a backend", function()
    local bodies = sim.run({ seed = 13 }, function(world)
      local a, b, c = world:host "a", world:host "b", world:host "c"
      hello(b, 8080):await()
      a:run(H.root .. "/examples/proxy.lua", { port = 80, backend = "b:8080" })
      world:sleep(0.01)
      local out = {}
      for i = 1, 3 do
        out[i] = world:client(c):request { url = "http://a/p" .. i }:await().body
      end
      return out
    end)
    assert.are.same({ "b /p1", "b /p2", "b /p3" }, bodies)
  end)

  it("holds traffic across a partition until it heals, and times connects out", function()
    local cut, late = sim.run({ seed = 14 }, function(world)
      local a, b = world:host "a", world:host "b"
      hello(b, 80):await()
      world:partition(a, b)
      local ok, err = pcall(function()
        world:client(a):request { url = "http://b/", timeout = 10 }:await()
      end)
      assert.is_false(ok)
      local f = world:client(a):request { url = "http://b/late", timeout = 120 }
      world:sleep(30)
      assert.is_false(f:is_done())
      world:heal()
      return tostring(err), f:await().body
    end)
    assert.matches("timeout", cut)
    assert.are.equal("b /late", late)
  end)

  it("resets connections between hosts", function()
    local n, err = sim.run({ seed = 15 }, function(world)
      local a, b = world:host "a", world:host "b"
      local port = b:run(function()
        local netrun = require "netrun"
        return netrun.server { port = 7, init = function(ch) end }:sync()
      end):await()
      local closed = a:run(function(addr)
        local netrun = require "netrun"
        local done = netrun.promise()
        netrun.connect { host = addr, port = 7, init = function(ch)
          ch:pipeline():add_last("watch", { exception_caught = function(_, ctx, e)
            done:try_success(tostring(e)) end })
        end }:sync()
        return done
      end, b.address):await()
      local n = world:reset(a, b)
      return n, closed:await()
    end)
    assert.are.equal(2, n)
    assert.matches("ECONNRESET", err)
  end)

  it("carries UDP with loss", function()
    local got = sim.run({ seed = 16 }, function(world)
      local a, b = world:host "a", world:host "b"
      world:loss(0.5)
      local count = b:run(function()
        local netrun = require "netrun"
        local n = netrun.shared.dict("count")
        netrun.udp { port = 53, init = function(ch)
          ch:pipeline():add_last("count", { channel_read = function() n:incr("n", 1, 0) end })
        end }:sync()
        return true
      end):await()
      a:run(function(addr)
        local netrun = require "netrun"
        local u = netrun.udp { port = 0 }:sync()
        for i = 1, 200 do u:write_and_flush { data = "x", host = addr, port = 53 } end
      end, b.address):await()
      world:sleep(1)
      return b:run(function() return require("netrun").shared.dict("count"):get("n") end):await()
    end)
    assert.is_true(got > 60 and got < 140, "got " .. tostring(got))
  end)

  it("gives each host its own shared dicts", function()
    local x, y = sim.run({ seed = 17 }, function(world)
      local a, b = world:host "a", world:host "b"
      a:run(function() require("netrun").shared.dict("d"):set("k", "a") end):await()
      return a:run(function() return require("netrun").shared.dict("d"):get("k") end):await(),
             b:run(function() return require("netrun").shared.dict("d"):get("k") end):await()
    end)
    assert.are.equal("a", x)
    assert.is_nil(y)
  end)

  -- A timer of no delay re-armed until the clock passes a deadline it
  -- first equals: real time would move on under it; virtual time stood
  -- still while the loop stayed runnable (the run never ended).
  it("lets time pass under loops that never block", function()
    local n, dt = sim.run({ seed = 20 }, function(world)
      return table.unpack(world:host("a"):run(function()
        local netrun = require "netrun"
        local loop, p, t0, n = netrun.current(), netrun.promise(), netrun.now(), 0
        local function again()
          n = n + 1
          if netrun.now() > t0 then p:set_success(n) else loop:schedule(0, again) end
        end
        loop:schedule(0, again)
        p:await()
        return { n, netrun.now() - t0 }
      end):await())
    end)
    assert.is_true(n > 1000 and n < 1000000, tostring(n))
    assert.is_true(dt > 0 and dt < 0.001, tostring(dt))
  end)

  it("reads the virtual clock from Lua on the hosts", function()
    local t, c = sim.run({ seed = 18, epoch = 2000000000 }, function(world)
      world:sleep(100)
      return table.unpack(world:host("a"):run(function()
        local t0 = os.clock()
        require("netrun").sleep(5)
        return { os.time(), os.clock() - t0 }
      end):await())
    end)
    assert.are.equal(2000000105, t)
    assert.is_true(math.abs(c - 5) < 0.001)
  end)

  it("hashes what happened: same seed, same hash; another seed, another", function()
    local function run(seed)
      return sim.run({ seed = seed }, function(world)
        local a, b = world:host "a", world:host "b"
        hello(b, 80):await()
        local fs = {}
        for i = 1, 10 do fs[i] = world:client(a):request { url = "http://b/" .. i } end
        for i = 1, 10 do fs[i]:await() end
        return world:trace_hash()
      end)
    end
    local h1, h2, h3 = run(21), run(21), run(22)
    assert.are.equal(h1, h2)
    assert.are_not.equal(h1, h3)
    assert.matches("^%x+$", h1)
  end)
end)

describe("netrun --sim", function()
  local function sh(cmd)
    local p = io.popen(cmd .. " 2>&1; echo \"rc=$?\"")
    local out = p:read("a")
    p:close()
    return out
  end

  it("runs a script per seed and names the failing seed and how to replay it", function()
    local script = os.tmpname()
    local f = io.open(script, "w")
    f:write([[
      local netrun = require "netrun"
      local sim = require "netrun.sim"
      local w = sim.world()
      netrun.server { port = 80, init = function(ch) end }:sync()
      print("seed " .. w:seed() .. " at " .. os.time())
      if w:seed() == 3 then error("three is bad") end
    ]])
    f:close()
    local ok = sh(H.BIN .. " --sim 1-2 " .. script)
    assert.matches("seed 1 at 1735689600", ok)
    assert.matches("seeds 1%-2 passed", ok)
    assert.matches("rc=0", ok)
    local bad = sh(H.BIN .. " --sim 2-5 " .. script .. " extra")
    assert.matches("seed 3: .*three is bad", bad)
    assert.matches("replay it with: netrun %-%-sim 3 " .. script:gsub("%p", "%%%0") .. " extra", bad)
    assert.matches("rc=1", bad)
    assert.is_nil(bad:find("seed 4 at", 1, true))
    os.remove(script)
  end)

  -- Lua's patches replace os.clock and socket.gettime in the states of a
  -- world; a reference taken before it began still holds the C function,
  -- and the executable's gettimeofday and clock (bin/interpose.c) are
  -- virtual on the world's thread.
  it("reads the virtual clock through references taken before the world", function()
    local script = os.tmpname()
    local f = io.open(script, "w")
    f:write([[
      local sim = require "netrun.sim"
      local gettime, clock = require("socket").gettime, os.clock
      local g0, g, c = sim.run({ seed = 19, epoch = 2000000000 }, function(world)
        local g0, c0 = gettime(), clock()
        world:sleep(3600)
        return g0, gettime() - g0, clock() - c0
      end)
      print(("%d %.3f %.3f %s"):format(g0, g, c, tostring(gettime() > 1.7e9)))
    ]])
    f:close()
    local out = sh(H.BIN .. " " .. script)
    os.remove(script)
    assert.matches("^2000000000 3600%.000 3600%.000 true\n", out)
  end)

  it("replays a seed the same in another process", function()
    local a = sh(H.BIN .. " --sim 1-3 " .. FIX .. "hello_server.lua")
    local b = sh(H.BIN .. " --sim 1-3 " .. FIX .. "hello_server.lua")
    assert.matches("seed 3: trace %x+", a)
    assert.are.equal(a, b)
  end)
end)
