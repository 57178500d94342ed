-- stall_spec.lua -- the stall detector (DESIGN.md §8.4) and what a stuck
-- loop does to signals and exits (the `netrun` command, §5): a second
-- netrun process runs spec/fixtures/stall_server.lua, whose log we read.
local H = require "spec.helper"
local netrun, socket = H.netrun, H.socket

local FIXTURE = "spec/fixtures/stall_server.lua"

local read_file = H.read_file

-- Start netrun in the background through a shell that records its exit
-- status in log .. ".status"; returns its pid (told by the fixture), log.
-- Whatever happens, the process is gone when the test ends.
local function spawn(args, env)
  local log = os.tmpname()
  os.execute(string.format("(%s %s %s > %s 2>&1; echo $? > %s.status) &",
    env or "", H.BIN, args, log, log))
  local pid
  local deadline = socket.gettime() + 10
  repeat
    pid = read_file(log):match("starting (%d+)")
    if not pid then socket.select(nil, nil, 0.02) end
  until pid or socket.gettime() > deadline
  assert(pid, "netrun did not start:\n" .. read_file(log))
  finally(function() os.execute("kill -KILL " .. pid .. " 2>/dev/null") end)
  return pid, log
end

local function wait_for(log, pattern, secs)
  local deadline = socket.gettime() + (secs or 10)
  repeat
    local m = read_file(log):match(pattern)
    if m then return m end
    socket.select(nil, nil, 0.02)
  until socket.gettime() > deadline
  error("timed out waiting for " .. pattern .. " in:\n" .. read_file(log))
end

-- Seconds until the process wrote its status (bounded), and the status.
local function wait_status(log, secs)
  local t0 = socket.gettime()
  local st = wait_for(log .. ".status", "(%d+)", secs)
  return socket.gettime() - t0, tonumber(st)
end

local function count(s, pattern)
  local n = 0
  for _ in s:gmatch(pattern) do n = n + 1 end
  return n
end

-- The first line of path at or after line `from` that holds text.
local function line_of(path, text, from)
  local i = 0
  for l in io.lines(path) do
    i = i + 1
    if i >= (from or 1) and l:find(text, 1, true) then return i end
  end
end

local function spin_line() return line_of(FIXTURE, "while true do end") end

local function ask(port, what)
  local c = H.client(port)
  assert(c:send(what .. "\n"))
  local line, err = c:receive("*l")
  c:close()
  return line, err
end

describe("the stall detector", function()
  it("logs a spinning handler once per stall: the loop's name, how long, and the traceback of the spinning code", function()
    local pid, log = spawn(FIXTURE .. " --stall_timeout 0.6")
    local port = tonumber(wait_for(log, "ready (%d+)"))
    for _ = 1, 2 do
      local line = ask(port, "spin")
      assert.matches("stalled for", line)
    end
    assert.equal("pong", ask(port, "ping"))
    os.execute("kill -TERM " .. pid)
    wait_status(log, 10)
    local text = read_file(log)
    -- one report per stall, each with the spinning function and its line
    assert.equal(2, count(text, "stall%-1: stalled: one run has lasted %d+%.%d s, in Lua:"), text)
    assert.equal(2, count(text, "stall_server%.lua:" .. spin_line() .. ": in [^\n]*'spin'"), text)
    local call = line_of(FIXTURE, "then spin() end")          -- in channel_read
    assert.equal(2, count(text, "stall_server%.lua:" .. call .. ": in "), text)
  end)

  it("with stall_timeout interrupts the stuck call: exception_caught gets 'stalled for N s' and the loop serves the next connection", function()
    local g = netrun.group { threads = 1, name = "stall-in", stall_threshold = 0.1, stall_timeout = 0.3 }
    local Spin = {}
    function Spin:channel_read(ctx, msg)
      if msg:find("spin", 1, true) then while true do end end
      ctx:write_and_flush("pong\n")
    end
    function Spin:exception_caught(ctx, err)
      ctx:write_and_flush("error: " .. err:match("[^\n]*") .. "\n")
    end
    local server, port = H.echo_server(g, Spin)
    local c = H.client(port)
    assert(c:send("spin\n"))
    local t0 = socket.gettime()
    local line = assert(c:receive("*l"))
    assert.matches("^error: .*stalled for %d+%.%d s$", line)
    assert.is_true(socket.gettime() - t0 < 3)
    c:close()
    assert.equal("pong", ask(port, "ping"))       -- the same (only) loop
    local st = g:stats()[1]
    assert.equal(1, st.stalls)
    assert.is_true(st.max_busy >= 0.25 and st.max_busy < 3, "max_busy " .. st.max_busy)
    server:close():sync()
    H.shutdown(g)
  end)

  it("interrupts a spinning task: its future fails, stats count the stall", function()
    local g = netrun.group { threads = 1, name = "stall-task", stall_threshold = 0.1, stall_timeout = 0.2 }
    assert.equal(0, g:stats()[1].stalls)
    assert.equal(0, g:stats()[1].max_busy)
    local ok, err = pcall(H.sync, g:submit(function() while true do end end))
    assert.is_false(ok)
    assert.matches("stall_spec%.lua:%d+: stalled for %d+%.%d s", err)
    assert.equal(42, H.sync(g:submit(function() return 42 end)))
    local st = g:stats()[1]
    assert.equal(1, st.stalls)
    assert.is_true(st.max_busy >= 0.15 and st.max_busy < 3, "max_busy " .. st.max_busy)
    H.shutdown(g)
  end)

  it("counts a slow run as a stall only when one run lasts past the threshold", function()
    local g = netrun.group { threads = 1, name = "stall-ok", stall_threshold = 1.5 }
    -- 64 tasks of 25 ms (CPU time; the loop checks its task deadline every
    -- 64): one iteration busy for 1.6 s or more, but no single run near
    -- the threshold, with room for a busy machine to stretch a run's wall
    -- time (10 ms runs against 0.45 s were once not enough)
    local fs = {}
    for i = 1, 64 do
      fs[i] = g:submit(function() local t = os.clock() while os.clock() - t < 0.025 do end end)
    end
    H.sync(netrun.all(fs))
    assert.equal(0, g:stats()[1].stalls)
    H.shutdown(g)
  end)

  it("describes a run stuck outside Lua code (a blocking C call) once, from the watchdog", function()
    local out, status = H.run("timeout -s KILL 30 " .. H.BIN .. " -e 'local g = require(\"netrun\").group{threads = 1, name = \"cwait\", stall_threshold = 0.1} "
      .. "g:submit(function() os.execute(\"sleep 0.6\") end):sync() g:shutdown_gracefully(0, 1)'")
    assert.equal(0, status)
    assert.equal(1, count(out, "stalled"), out)
    assert.matches("%[watchdog%] cwait%-1: stalled: one run has lasted %d+%.%d s, in the C task at netrun%+0x%x+ %(no Lua code answered", out)
  end)

  -- max_busy is the longest run timed on the loop itself, not the
  -- watchdog's sample (which, a quarter of the threshold apart, read 0.25
  -- for a run of 0.4 s). Runs spin on the wall clock (netrun.now).
  it("gives the longest run as max_busy, timed on the loop: a handler's, a task's alone, one of several queued together", function()
    local g = netrun.group { threads = 1, name = "busy-max" }   -- threshold 1 s: no stall
    local Busy = {}
    function Busy:channel_read(ctx, msg)
      local now = require("netrun").now
      local t = now()
      while now() - t < tonumber(msg:match("[%d.]+")) do end
      ctx:write_and_flush("done\n")
    end
    local server, port = H.echo_server(g, Busy)
    -- read once the run is over: a task that runs after it has run (the
    -- answer, or a future, comes while its run still goes on)
    local function max_busy()
      H.sync(g:submit(function() end))
      return g:stats()[1].max_busy
    end
    assert.equal("done", ask(port, "0.4"))
    local busy = max_busy()
    assert.is_true(busy >= 0.4 and busy < 0.6, "a handler's 0.4 s read " .. busy)
    local function spin(s)
      return function()
        local now = require("netrun").now
        local t = now()
        while now() - t < s do end
      end
    end
    H.sync(g:submit(spin(0.5)))
    busy = max_busy()
    assert.is_true(busy >= 0.5 and busy < 0.7, "a task's 0.5 s read " .. busy)
    -- queued together, run in one pass: 0.3 s, 0.3 s, then the longest
    H.sync(g:submit(function()
      local nr = require "netrun"
      local loop = nr.current()
      local function spin(s) local t = nr.now() while nr.now() - t < s do end end
      loop:execute(function() spin(0.3) end)
      loop:execute(function() spin(0.3) end)
      loop:execute(function() spin(0.6) end)
    end))
    busy = max_busy()
    assert.is_true(busy >= 0.6 and busy < 0.85, "the third of three queued read " .. busy)
    assert.equal(0, g:stats()[1].stalls)
    server:close():sync()
    H.shutdown(g)
  end)

  it("checks its options", function()
    assert.has_error(function() netrun.group { stall_threshold = -1 } end)
    assert.has_error(function() netrun.group { stall_timeout = "soon" } end,
      'netrun.group: stall_timeout must be a number of seconds from 0 to 1e9, got "soon"')
  end)
end)

describe("a stall inside a coroutine", function()
  -- Spins for at most 10 s of CPU (bounded, were the watchdog to miss it).
  local SPIN = [[local t = os.clock() while os.clock() - t < 10 do end]]

  local function watched(name)
    return netrun.group { threads = 1, name = name, stall_threshold = 0.1, stall_timeout = 0.3 }
  end

  it("leaves coroutine.resume, wrap and close behaving as Lua's own (a loop state's are netrun's, to know the running coroutine)", function()
    local src = read_file("spec/fixtures/coroutine_probe.lua")
    local here = load(src, "=probe")()
    local g = netrun.group { threads = 1, name = "co-lib" }
    local there = H.sync(g:submit(load(src, "=probe")))
    assert.equal(here, there)
    assert.is_true(select(2, here:gsub("\n", "")) > 25)
    H.shutdown(g)
  end)

  it("is logged with the coroutine's traceback (a spawn resumed after an await), then interrupted: its future fails", function()
    local pid, log = spawn(FIXTURE .. " --stall_timeout 0.6")
    local port = tonumber(wait_for(log, "ready (%d+)"))
    local t0 = socket.gettime()
    local line = ask(port, "cospin")
    assert.matches("^spawned: .*stall_server%.lua:" .. spin_line() .. ": stalled for %d+%.%d s$", line)
    assert.is_true(socket.gettime() - t0 < 4)
    assert.equal("pong", ask(port, "ping"))
    os.execute("kill -TERM " .. pid)
    wait_status(log, 10)
    local text = read_file(log)
    assert.equal(1, count(text, "stall%-1: stalled: one run has lasted %d+%.%d s, in Lua %(a coroutine%):"), text)
    assert.equal(1, count(text, "stall_server%.lua:" .. spin_line() .. ": in [^\n]*'spin'"), text)
    local call = line_of(FIXTURE, "spin()", line_of(FIXTURE, "local function cospin") + 1)
    assert.equal(1, count(text, "stall_server%.lua:" .. call .. ": in "), text)
    assert.equal(0, count(text, "no Lua code answered"), text)
  end)

  it("interrupts a stream function that spins: its connection is closed and the loop serves the next one", function()
    local g = watched("co-stream")
    local server = netrun.server { group = g, host = "127.0.0.1", port = 0, stream = load([[
      return function(s)
        while true do
          local line = s:receive("*l")
          if not line then return end
          if line == "spin" then ]] .. SPIN .. [[ end
          s:send(line == "ping" and "pong\n" or "?\n")
        end
      end]])() }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    assert(c:send("spin\n"))
    local t0 = socket.gettime()
    local line, err = c:receive("*l")
    assert.is_nil(line)
    assert.equal("closed", err)
    assert.is_true(socket.gettime() - t0 < 3, "closed after " .. socket.gettime() - t0 .. " s")
    c:close()
    assert.equal("pong", ask(port, "ping"))          -- the same (only) loop
    assert.equal(1, g:stats()[1].stalls)
    server:close():sync()
    H.shutdown(g)
  end)

  it("interrupts a spawned coroutine that spins, and one resumed after an await: each future fails where it spun", function()
    local g = watched("co-spawn")
    local first = H.sync(g:submit(load([[
      local netrun = require "netrun"
      return netrun.spawn(function() ]] .. SPIN .. [[ end):cause()]], "=spin")))
    assert.matches("^spin:%d+: stalled for %d+%.%d s\nstack traceback:", first)
    local later = H.sync(g:submit(load([[
      local netrun = require "netrun"
      local p = netrun.promise()
      local f = netrun.spawn(function() p:await() ]] .. SPIN .. [[ end)
      netrun.current():execute(function() p:set_success(1) end)
      local done = netrun.promise()
      f:add_listener(function() done:set_success(f:cause()) end)
      return done]], "=await")))
    assert.matches("^await:%d+: stalled for %d+%.%d s\nstack traceback:", H.sync(later))
    assert.equal(42, H.sync(g:submit(function() return 42 end)))
    assert.equal(2, g:stats()[1].stalls)
    H.shutdown(g)
  end)

  it("interrupts a coroutine.wrap inside a handler, and one nested in a spawn: the error reaches exception_caught", function()
    local g = watched("co-wrap")
    local Wrap = load([[
      local netrun = require "netrun"
      local Wrap = {}
      function Wrap:channel_read(ctx, msg)
        if msg:find("nested", 1, true) then
          local f = netrun.spawn(function()
            coroutine.wrap(function() coroutine.wrap(function() ]] .. SPIN .. [[ end)() end)()
          end)
          error(f:cause(), 0)
        elseif msg:find("wrap", 1, true) then
          coroutine.wrap(function() ]] .. SPIN .. [[ end)()
        end
        ctx:write_and_flush("pong\n")
      end
      function Wrap:exception_caught(ctx, err)
        ctx:write_and_flush("error: " .. err:match("[^\n]*") .. "\n")
      end
      return Wrap]], "=wrap")()
    local server, port = H.echo_server(g, Wrap)
    for _, what in ipairs { "wrap", "nested" } do
      local t0 = socket.gettime()
      local line = ask(port, what)
      assert.matches("^error: .*wrap:%d+: stalled for %d+%.%d s$", line)
      assert.is_true(socket.gettime() - t0 < 3)
    end
    assert.equal("pong", ask(port, "ping"))
    assert.equal(2, g:stats()[1].stalls)
    server:close():sync()
    H.shutdown(g)
  end)
end)

describe("a stalled loop and new work", function()
  local dict
  before_each(function()
    dict = netrun.shared.dict("stall_spec")
    dict:flush_all()
  end)

  -- "pong", and on "hold" a spin until the shared dict says stop, then
  -- "held" (spec/fixtures/hold.lua).
  local function hold(ch) ch:pipeline():add_last("hold", require("hold")("stall_spec", "held")) end

  -- Make loop `i`... whichever loop takes a "hold" connection stuck, and
  -- wait until the watchdog reports it; returns the connection, the stuck
  -- loop's index.
  local function stick(g, port)
    local c = H.client(port)
    assert(c:send("hold\n"))
    local stuck = H.eventually(function()
      for i, st in ipairs(g:stats()) do
        if st.stalls > 0 then return i end
      end
    end)
    assert(stuck, "no loop was reported stalled")
    return c, stuck
  end

  local function release(c)
    dict:set("stop", true)
    assert.equal("held", c:receive("*l"))
    c:close()
  end

  it("gets no new connections: 6 of 6 are served while one of two loops is stuck in a handler", function()
    local boss = netrun.group { threads = 1, name = "nc-boss" }
    local g = netrun.group { threads = 2, name = "nc", stall_threshold = 0.1 }
    local server = netrun.server {
      group = boss, child_group = g, host = "127.0.0.1", port = 0,
      init = hold,
    }:sync()
    local _, port = server:local_address()
    local held = stick(g, port)
    local served = 0
    for i = 1, 6 do
      local c = H.client(port)
      c:settimeout(2)
      assert(c:send("ping " .. i .. "\n"))
      if c:receive("*l") == "pong" then served = served + 1 end
      c:close()
    end
    assert.equal(6, served)
    release(held)
    -- once the watchdog has seen the run end, the loop takes its turns again
    assert.is_true(H.eventually(function() return g:next():name() ~= g:next():name() end))
    server:close():sync()
    H.shutdown(g)
    H.shutdown(boss)
  end)

  it("is not chosen for connects or the group's tasks while it is stuck", function()
    local g = netrun.group { threads = 2, name = "cn", stall_threshold = 0.1 }
    local server = netrun.server {
      group = g, host = "127.0.0.1", port = 0,
      init = hold,
    }:sync()
    local _, port = server:local_address()
    local held, stuck = stick(g, port)
    local other = "cn-" .. (3 - stuck)
    for _ = 1, 6 do
      local ch = H.sync(netrun.connect { group = g, host = "127.0.0.1", port = port }, 2)
      assert.equal(other, ch:loop():name())
      ch:close():sync()
      assert.equal(other, H.sync(g:submit(function() return require("netrun").current():name() end), 2))
    end
    release(held)
    server:close():sync()
    H.shutdown(g)
  end)

  it("with group = g alone, stuck on the listener's loop, accepts nothing until it runs again; none is lost", function()
    -- (docs/guide/limits.md: the listener lives on one of g's loops; the chooser cannot
    -- help a stall there. The default boss group, or child_group, keeps
    -- it off the workers.)
    local g = netrun.group { threads = 2, name = "ls", stall_threshold = 0.1 }
    local server = netrun.server { group = g, host = "127.0.0.1", port = 0, init = hold }:sync()
    local _, port = server:local_address()
    local stuck = server:loop()
    stuck:execute(function()                       -- spins until told to stop
      local d, t = require("netrun").shared.dict("stall_spec"), os.clock()
      while not d:get("stop") and os.clock() - t < 20 do end
    end)
    assert.is_truthy(H.eventually(function() return stuck:stats().stalls > 0 end))
    local clients = {}
    for i = 1, 4 do
      clients[i] = H.client(port)                  -- (the kernel's backlog takes them)
      clients[i]:settimeout(0.3)
      assert(clients[i]:send("ping " .. i .. "\n"))
    end
    for i = 1, 4 do
      local line, err = clients[i]:receive("*l")
      assert.same({ nil, "timeout" }, { line, err })                -- not accepted
    end
    dict:set("stop", true)
    for i = 1, 4 do
      clients[i]:settimeout(5)
      assert.equal("pong", clients[i]:receive("*l"))                 -- every one served
      clients[i]:close()
    end
    server:close():sync()
    H.shutdown(g)
  end)
end)

describe("a stuck loop and the process", function()
  -- The fixture with a shutdown timeout of 1 s, stuck by `what`, sent
  -- SIGTERM once the stall is logged: it exits after the timeout (checked);
  -- returns its exit status, its log and the connection's last line.
  local function terminate_stuck(what)
    local pid, log = spawn(FIXTURE, "NETRUN_SHUTDOWN_TIMEOUT=1")
    local port = tonumber(wait_for(log, "ready (%d+)"))
    local c = H.client(port)
    assert(c:send(what .. "\n"))
    wait_for(log, "stall%-1: stalled")
    os.execute("kill -TERM " .. pid)
    local secs, status = wait_status(log, 10)
    local line = c:receive("*l")
    c:close()
    assert.is_true(secs >= 0.9 and secs < 4, "exited after " .. secs .. " s")
    return status, read_file(log), line
  end

  it("SIGTERM interrupts a spinning handler once the shutdown timeout has passed, and the process exits 0", function()
    local status, text, line = terminate_stuck("spin")
    assert.matches("stalled for", line)
    assert.equal(0, status)
    assert.matches("stall%-1: shutdown timed out while a run is stuck: interrupting it", text)
  end)

  it("SIGTERM interrupts a coroutine spinning after an await once the shutdown timeout has passed, and the process exits 0", function()
    local status, text = terminate_stuck("cospin")
    assert.equal(0, status)
    assert.matches("stall%-1: stalled: one run has lasted %d+%.%d s, in Lua %(a coroutine%):", text)
    assert.matches("stall%-1: shutdown timed out while a run is stuck: interrupting it", text)
    assert.is_nil(text:find("has not terminated", 1, true), text)
  end)

  it("SIGTERM exits after the shutdown timeout even when a loop is stuck in C, naming the stuck loop", function()
    local status, text = terminate_stuck("block")
    assert.equal(1, status)
    assert.matches("loop stall%-1 has not terminated %(shutting_down, busy for %d+%.%d s%)", text)
    assert.matches("shutdown did not finish within 1%.0 s: exiting now", text)
    assert.equal(1, count(text, "shutdown timed out while a run is stuck"), text)
  end)

  it("a script that raises after starting a busy loop exits with status 1 and the traceback", function()
    local t0 = socket.gettime()
    local out, status = H.run("timeout -s KILL 30 " .. H.BIN .. " -e 'local g = require(\"netrun\").group{threads = 1, name = \"busy\"} "
      .. "g:execute(function() while true do end end) local function f() error(\"boom\") end f()'")
    assert.equal(1, status)
    assert.matches("boom\nstack traceback:\n", out)
    assert.matches("busy%-1: shutdown timed out while a run is stuck: interrupting it", out)
    assert.is_true(socket.gettime() - t0 < 10)
  end)

  it("a SIGTERM while the script still runs takes effect once it returns", function()
    local pid, log = spawn(FIXTURE .. " --startup 1", "NETRUN_SHUTDOWN_TIMEOUT=1")
    os.execute("kill -TERM " .. pid)
    local secs, status = wait_status(log, 10)
    assert.equal(0, status)
    assert.is_true(secs < 5, "exited after " .. secs .. " s")
    local text = read_file(log)
    assert.matches("signal 15: shutting down gracefully", text)
    assert.matches("ready %d+", text)          -- it had started the server
  end)

  it("children start with SIGPIPE at its default", function()
    local out, status = H.run(H.BIN .. " -e 'local f = io.popen(\"(yes | head -1) 2>&1\") io.write(f:read(\"a\")) f:close()'")
    assert.equal(0, status)
    assert.equal("y\n", out)
    out = H.run(H.BIN .. " -e 'local f = io.popen(\"grep SigIgn /proc/self/status\") io.write(f:read(\"a\")) f:close()'")
    local ignored = tonumber(out:match("SigIgn:%s*(%x+)"), 16)
    assert.equal(0, ignored & (1 << 12), "SIGPIPE ignored in the child: " .. out)
  end)
end)
