-- group_spec.lua -- DESIGN.md §4 "Groups and loops": the chooser, tasks,
-- schedules, tail tasks, stats, netrun.current() and graceful shutdown.
local H = require "spec.helper"
local netrun = H.netrun

describe("groups and loops", function()
  local group
  setup(function() group = netrun.group { threads = 3, name = "grp" } end)
  teardown(function() H.shutdown(group) end)

  it("has #group loops, named after the group, and next() goes round-robin", function()
    assert.equal(3, #group)
    local loops = group:loops()
    assert.equal(3, #loops)
    for i, l in ipairs(loops) do assert.equal("grp-" .. i, l:name()) end
    local fresh = netrun.group { threads = 3, name = "rr" }
    local seen = {}
    for i = 1, 6 do seen[i] = fresh:next():name() end
    H.shutdown(fresh)
    -- every loop once per round, in the same order each round
    assert.equal(seen[1], seen[4]); assert.equal(seen[2], seen[5]); assert.equal(seen[3], seen[6])
    local set = {}
    for i = 1, 3 do set[seen[i]] = true end
    assert.same({ ["rr-1"] = true, ["rr-2"] = true, ["rr-3"] = true }, set)
    assert.matches("netrun.group%(grp, 3 loops%)", tostring(group))
    assert.matches("netrun.loop%(grp%-1%)", tostring(loops[1]))
  end)

  it("spreads group:submit over the loops and runs loop:submit on that loop", function()
    local names = {}
    for _ = 1, 6 do
      local n = group:submit(function() return netrun.current():name() end):sync()
      names[n] = (names[n] or 0) + 1
    end
    assert.same({ ["grp-1"] = 2, ["grp-2"] = 2, ["grp-3"] = 2 }, names)
    local l2 = group:loops()[2]
    assert.equal("grp-2", l2:submit(function() return netrun.current():name() end):sync())
    assert.equal(l2, l2:submit(function() return netrun.current() end):sync())
  end)

  it("execute runs fn with its arguments transferred", function()
    local p = netrun.promise()
    group:execute(function(pp, a, b) pp:set_success(a .. b) end, p, "x", 7)
    assert.equal("x7", p:sync())
    local p2 = netrun.promise()
    group:loops()[3]:execute(function(pp) pp:set_success(netrun.current():name()) end, p2)
    assert.equal("grp-3", p2:sync())
  end)

  it("submit fails its future with the error a task raises, and the loop goes on", function()
    local l = group:loops()[1]
    local f = l:submit(function() error("boom in a task") end)
    local ok, err = pcall(f.sync, f)
    assert.is_false(ok)
    assert.matches("boom in a task", err)
    assert.is_false(f:is_success())
    assert.matches("boom in a task", f:cause())
    l:execute(function() error("boom in execute") end)   -- logged, see log_spec
    assert.equal("still here", l:submit(function() return "still here" end):sync())
  end)

  it("netrun.current() is nil on the main thread and the loop on a loop", function()
    assert.is_nil(netrun.current())
    for _, l in ipairs(group:loops()) do
      assert.equal(l, l:submit(function() return netrun.current() end):sync())
    end
  end)

  it("in_event_loop is true only on the loop's own thread", function()
    local l1, l2 = group:loops()[1], group:loops()[2]
    assert.is_false(l1:in_event_loop())
    local a, b = table.unpack(l1:submit(function(x, y) return { x:in_event_loop(), y:in_event_loop() } end, l1, l2):sync())
    assert.is_true(a)
    assert.is_false(b)
  end)

  it("schedule runs after the delay and returns the result; cancel stops it", function()
    local l = group:loops()[1]
    local t0 = H.socket.gettime()
    local f = l:schedule(0.05, function(x) return x * 2, netrun.current():name() end, 21)
    assert.equal(42, f:sync())
    assert.is_true(H.socket.gettime() - t0 >= 0.045)
    -- a cancelled task never runs: a later task on the same loop checks
    local c = l:schedule(0.05, function() _G.cancelled_ran = true end)
    assert.is_true(c:cancel())
    assert.is_true(c:is_cancelled())
    assert.is_true(c:is_done())
    local ran = l:schedule(0.15, function() return _G.cancelled_ran == true end):sync()
    assert.is_false(ran)
    -- group:schedule picks a loop itself
    assert.equal("g", group:schedule(0.01, function() return "g" end):sync())
  end)

  it("schedule_at_fixed_rate repeats until cancelled", function()
    local l = group:loops()[2]
    local done = netrun.promise()
    local f = l:schedule_at_fixed_rate(0, 0.01, function(p)
      _G.rate_n = (_G.rate_n or 0) + 1
      if _G.rate_n == 5 then p:set_success(_G.rate_n) end
    end, done)
    assert.equal(5, done:sync())
    assert.is_true(f:cancel())
    local before = l:submit(function() return _G.rate_n end):sync()
    local after = l:schedule(0.1, function() return _G.rate_n end):sync()
    assert.equal(before, after)          -- nothing ran after the cancel
    assert.is_true(before >= 5)
    assert.has_error(function() l:schedule_at_fixed_rate(0, 0, function() end) end,
      "schedule_at_fixed_rate: period must be > 0")
  end)

  it("schedule_with_fixed_delay waits the delay between runs", function()
    local l = group:loops()[3]
    local done = netrun.promise()
    local f = l:schedule_with_fixed_delay(0.01, 0.02, function(p)
      local now = require("socket").gettime()
      _G.delay_t = _G.delay_t or {}
      table.insert(_G.delay_t, now)
      if #_G.delay_t == 4 then p:set_success(_G.delay_t) end
    end, done)
    local ts = done:sync()
    f:cancel()
    for i = 2, 4 do assert.is_true(ts[i] - ts[i - 1] >= 0.018, "runs too close") end
    assert.has_error(function() l:schedule_with_fixed_delay(0, 0, function() end) end,
      "schedule_with_fixed_delay: delay must be > 0")
  end)

  it("a periodic task that raises is logged, stops, and fails its future", function()
    local l = group:loops()[1]
    local f = l:schedule_at_fixed_rate(0, 0.01, function()
      _G.raise_n = (_G.raise_n or 0) + 1
      if _G.raise_n == 3 then error("periodic boom") end
    end)
    local ok, err = pcall(f.sync, f)
    assert.is_false(ok)
    assert.matches("periodic boom", err)
    assert.is_false(f:cancel())                  -- already done
    assert.equal(3, l:schedule(0.1, function() return _G.raise_n end):sync())
  end)

  it("after_iteration runs a tail task on that loop after the current iteration", function()
    local l = group:loops()[2]
    local order = l:submit(function(loop)
      local p = netrun.promise()
      _G.order = { "task" }
      loop:after_iteration(function(pp)
        table.insert(_G.order, "tail")
        pp:set_success(_G.order)
      end, p)
      table.insert(_G.order, "after queueing")
      return p
    end, l):sync():sync()
    assert.same({ "task", "after queueing", "tail" }, order)
  end)

  it("reports stats for each loop", function()
    local all = group:stats()
    assert.equal(3, #all)
    local st = group:loops()[1]:stats()
    assert.equal("grp-1", st.name)
    assert.equal("started", st.state)
    for _, k in ipairs { "pending_tasks", "scheduled_tasks", "channels", "tasks_run", "io_events",
                         "wakeups", "selector_rebuilds", "lua_memory" } do
      assert.equal("integer", math.type(st[k]), k)
      assert.is_true(st[k] >= 0, k)
    end
    assert.equal("float", math.type(st.io_time))
    assert.equal("float", math.type(st.task_time))
    assert.is_true(st.lua_memory > 0)
    local l = group:loops()[1]
    -- tasks are counted by the batch, after they return: poll, bounded
    local before = l:stats().tasks_run
    for _ = 1, 5 do l:submit(function() end):sync() end
    assert.is_truthy(H.eventually(function() return l:stats().tasks_run >= before + 5 end, 5))
    local sch = l:schedule(30, function() end)
    assert.is_true(l:submit(function(loop) return loop:stats().scheduled_tasks end, l):sync() >= 1)
    sch:cancel()
  end)

  it("keeps a loop state's values whole in blocks of every size, and counts them", function()
    -- A loop state's allocator has three tiers (small pooled blocks,
    -- medium ones kept for reuse, large ones from malloc): values grown
    -- and shrunk across them keep their contents, and lua_memory goes
    -- back down when they are collected.
    local l = group:loops()[2]
    local result = l:submit(function()
      local function check()
        local strs = {}
        for k = 0, 18 do                       -- 1 B .. 256 KiB, off the class sizes
          strs[k] = string.rep(string.char(65 + k), (1 << k) + k)
        end
        local t = {}                           -- an array grown through every tier
        for i = 1, 100000 do t[i] = i * 3 end
        local h = {}                           -- a hash grown, emptied, rehashed smaller
        for i = 1, 20000 do h["k" .. i] = i end
        for i = 1, 20000 do h["k" .. i] = nil end
        collectgarbage()
        for i = 1, 50 do h[i] = -i end
        local parts = {}                       -- a buffer grown by one block's realloc
        for i = 1, 20000 do parts[i] = tostring(i) end
        local joined = table.concat(parts, ",")
        collectgarbage()
        for k = 0, 18 do
          local s = strs[k]
          if #s ~= (1 << k) + k or s:sub(1, 1) ~= string.char(65 + k) or
             s:sub(-1) ~= string.char(65 + k) then
            return false, "string " .. k
          end
        end
        for i = 1, 100000 do if t[i] ~= i * 3 then return false, "array " .. i end end
        for i = 1, 50 do if h[i] ~= -i then return false, "hash " .. i end end
        if #joined ~= 108893 or joined:sub(-6) ~= ",20000" then return false, "concat" end
        return true
      end
      for _ = 1, 3 do                          -- again, from blocks kept for reuse
        local good, err = check()
        if not good then return err end
      end
      return "whole"
    end):sync()
    assert.equal("whole", result)
    local function settled()
      return l:submit(function(loop)
        collectgarbage(); collectgarbage()
        return loop:stats().lua_memory
      end, l):sync()
    end
    local before = settled()
    l:submit(function()
      local keep = {}
      for i = 1, 2000 do keep[i % 100 + 1] = string.rep("x", 300 + i * 17) end
    end):sync()
    assert.is_true(math.abs(settled() - before) < 256 * 1024)
  end)

  it("checks its arguments", function()
    assert.has_error(function() netrun.group { threads = -1 } end,
      "netrun.group: threads must be an integer from 0 to 1024, got -1")
    assert.has_error(function() netrun.group { io_ratio = 0 } end,
      "netrun.group: io_ratio must be an integer from 1 to 100, got 0")
    assert.has_error(function() group:execute("not a function") end)
    assert.has_error(function() group:schedule(-1, function() end) end)
  end)
end)

describe("executor groups", function()
  it("run tasks on named threads without a selector, and may block", function()
    local blocking = netrun.executor_group { threads = 2, name = "blocking" }
    assert.equal(2, #blocking)
    local names = {}
    for _ = 1, 4 do names[blocking:submit(function() return netrun.current():name() end):sync()] = true end
    assert.same({ ["blocking-1"] = true, ["blocking-2"] = true }, names)
    -- an executor thread may wait for a future (that is what it is for)
    local p, started = netrun.promise(), netrun.promise()
    local f = blocking:submit(function(pp, st) st:set_success(true); return pp:sync() end, p, started)
    started:sync()
    p:set_success("unblocked")
    assert.equal("unblocked", f:sync())
    H.shutdown(blocking)
  end)
end)

describe("graceful shutdown", function()
  it("goes through the states and completes the termination future last", function()
    local g = netrun.group { threads = 2, name = "sd" }
    g:submit(function() end):sync()
    assert.is_false(g:is_shutting_down())
    assert.is_false(g:is_shutdown())
    assert.is_false(g:is_terminated())
    local term = g:termination_future()
    assert.is_false(term:is_done())
    local f = g:shutdown_gracefully(0.05, 5)
    assert.is_true(g:is_shutting_down())
    f:sync()
    assert.is_true(term:is_done())
    assert.is_true(term:is_success())
    assert.is_true(g:is_shutdown())
    assert.is_true(g:is_terminated())
    assert.equal("terminated", g:loops()[1]:stats().state)
  end)

  it("rejects tasks after shutdown with a clear error", function()
    local g = netrun.group { threads = 1, name = "rej" }
    H.shutdown(g)
    assert.has_error(function() g:execute(function() end) end, "rej-1: loop is shut down: task rejected")
    assert.has_error(function() g:submit(function() end) end, "rej-1: loop is shut down: task rejected")
    assert.has_error(function() g:schedule(0.1, function() end) end, "rej-1: loop is shut down: task rejected")
    assert.has_error(function() g:loops()[1]:after_iteration(function() end) end,
      "rej-1: loop is shut down: task rejected")
  end)

  it("refuses tasks past max_pending_tasks with a clear error, and runs the rest", function()
    local g = netrun.group { threads = 1, name = "full", max_pending_tasks = 1000 }
    local l = g:next()
    local accepted_ch = netrun.promise()          -- a channel on that loop
    local server = netrun.server {
      group = g, host = "127.0.0.1", port = 0,
      init = function(ch) accepted_ch:set_success(ch) end,
    }:sync()
    local client = H.client(select(2, server:local_address()))
    local ch = H.sync(accepted_ch)
    local started, release = netrun.promise(), netrun.promise()
    l:execute(function(st, rel)           -- keeps the loop busy until released
      st:set_success(true)
      local deadline = os.clock() + 10
      while not rel:is_done() and os.clock() < deadline do end
    end, started, release)
    H.sync(started)
    local accepted, refused, err = {}, 0, nil
    for i = 1, 3000 do
      local ok, f = pcall(l.submit, l, function(x) return x end, i)
      if ok then accepted[#accepted + 1] = f else refused, err = refused + 1, f end
    end
    local ok, xerr = pcall(l.execute, l, function() end)
    local w = ch:write_and_flush("x")             -- from another thread: a task too
    release:set_success(true)
    assert.has_error(function() H.sync(w) end)
    assert.matches("task queue full", w:cause())
    assert.equal(1000, #accepted)
    assert.equal(2000, refused)
    assert.matches("full%-1: task queue full %(max_pending_tasks = 1000%): task rejected", err)
    assert.is_false(ok)
    assert.matches("task queue full", xerr)
    for i, f in ipairs(accepted) do assert.equal(i, H.sync(f)) end
    -- drained: it takes tasks again
    assert.equal("again", l:submit(function() return "again" end):sync())
    assert.has_error(function() netrun.group { max_pending_tasks = 0 } end,
      "netrun.group: max_pending_tasks must be an integer >= 1, got 0")
    client:close()
    server:close():sync()
    H.shutdown(g)
  end)

  it("still runs a task submitted during the quiet period", function()
    local g = netrun.group { threads = 1, name = "quiet" }
    g:submit(function() end):sync()
    local term = g:shutdown_gracefully(0.3, 5)
    assert.is_true(g:is_shutting_down())
    assert.is_false(g:is_terminated())
    assert.equal("ran", g:submit(function() return "ran" end):sync())
    term:sync()
    assert.is_true(g:is_terminated())
  end)

  it("cancels scheduled tasks when it shuts down", function()
    local g = netrun.group { threads = 1, name = "sched" }
    local f = g:schedule(60, function() return "never" end)
    H.shutdown(g)
    assert.is_true(f:is_done())
    assert.is_false(f:is_success())
  end)
end)
