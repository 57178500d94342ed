-- log_spec.lua -- netrun.log (DESIGN.md §4 "Batteries"): the level comes
-- from NETRUN_LOG and each line names its thread. Checked on the stderr of
-- a child `netrun -e` process.
local H = require "spec.helper"
local BIN = os.getenv("NETRUN_BIN") or (H.build .. "/bin/netrun")

-- Run `netrun -e code` with NETRUN_LOG=level (nil: unset); returns its
-- stderr, stdout and exit status. The code must not contain single quotes.
local function run(code, level)
  assert(not code:find("'", 1, true))
  local err = os.tmpname()
  local env = level and ("NETRUN_LOG=" .. level .. " ") or "env -u NETRUN_LOG "
  local f = assert(io.popen(string.format("%s timeout 30 %s -e '%s' 2>%s; echo \"::status=$?\"",
    env, BIN, code, err)))
  local out = f:read("a")
  f:close()
  local ef = assert(io.open(err))
  local stderr = ef:read("a")
  ef:close()
  os.remove(err)
  return stderr, out:gsub("::status=%d+%s*$", ""), tonumber(out:match("::status=(%d+)%s*$"))
end

local function lines(s)
  local t = {}
  for l in s:gmatch("[^\n]+") do t[#t + 1] = l end
  return t
end

local LOG_ALL = [[
local netrun = require "netrun"
netrun.log.debug("dbg %d", 1)
netrun.log.info("inf %s", "two")
netrun.log.warn("wrn")
netrun.log.error("err %q", "x")
local g = netrun.group { threads = 2, name = "lg" }
for _, l in ipairs(g:loops()) do
  l:submit(function() netrun.log.warn("from %s", netrun.current():name()) end):sync()
end
print(netrun.log.level())
g:shutdown_gracefully(0, 5):sync()
]]

describe("netrun.log", function()
  it("logs at info and above by default, naming the thread of each line", function()
    local err, out, st = run(LOG_ALL)
    assert.equal(0, st)
    assert.equal("info\n", out)
    local l = lines(err)
    assert.equal(5, #l, err)
    local stamp = "^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d%.%d%d%dZ "
    assert.matches(stamp .. "INFO  %[main%] inf two$", l[1])
    assert.matches(stamp .. "WARN  %[main%] wrn$", l[2])
    assert.matches(stamp .. "ERROR %[main%] err \"x\"$", l[3])
    assert.matches(stamp .. "WARN  %[lg%-1%] from lg%-1$", l[4])
    assert.matches(stamp .. "WARN  %[lg%-2%] from lg%-2$", l[5])
  end)

  it("takes its level from NETRUN_LOG", function()
    local err, out = run(LOG_ALL, "debug")
    assert.equal("debug\n", out)
    assert.matches("DEBUG %[main%] dbg 1", err)
    assert.matches("DEBUG %[lg%-1%] lg%-1 terminated", err)   -- the runtime's own lines too
    assert.equal(6, #lines(err:gsub("[^\n]* terminated\n", "")))
    err, out = run(LOG_ALL, "error")
    assert.equal("error\n", out)
    assert.equal(1, #lines(err), err)
    assert.matches("ERROR %[main%] err", err)
    err, out = run(LOG_ALL, "off")
    assert.equal("off\n", out)
    assert.equal("", err)
  end)

  it("can change its level at run time, and rejects unknown levels", function()
    local err, out = run([[
local netrun = require "netrun"
netrun.log.level("error")
netrun.log.warn("hidden")
netrun.log.error("shown")
print(pcall(netrun.log.level, "loud"))
]])
    assert.matches("unknown log level .loud.", out)
    assert.equal(1, #lines(err), err)
    assert.matches("ERROR %[main%] shown", err)
  end)

  it("logs a task that raises with its loop's name, and the loop goes on", function()
    local err, out, st = run([[
local netrun = require "netrun"
local g = netrun.group { threads = 1, name = "raiser" }
g:execute(function() error("task went wrong") end)
print(g:submit(function() return "alive" end):sync())
g:shutdown_gracefully(0, 5):sync()
]])
    assert.equal(0, st)
    assert.equal("alive\n", out)
    assert.matches("ERROR %[raiser%-1%] a task failed: %(command line%):3: task went wrong", err)
    assert.matches("stack traceback", err)
  end)

  it("logs an exception that reaches the tail of a pipeline, with its traceback", function()
    local err, out, st = run([[
local netrun = require "netrun"
local socket = require "socket"
local g = netrun.group { threads = 1, name = "tail" }
local server = netrun.server { group = g, host = "127.0.0.1", port = 0,
  init = function(ch) ch:pipeline():add_last("h", {
    channel_read = function(self, ctx, msg) error("unhandled " .. msg) end,
    channel_read_complete = function(self, ctx) ctx:write_and_flush("x") end }) end }:sync()
local _, port = server:local_address()
local c = assert(socket.connect("127.0.0.1", port))
c:send("oops")
c:settimeout(5)
assert(c:receive(1) == "x")   -- read_complete comes after the read failed
c:close()
g:shutdown_gracefully(0, 5):sync()
print("ok")
]], "warn")
    assert.equal(0, st)
    assert.equal("ok\n", out)
    assert.matches("%[tail%-1%] [^\n]*unhandled oops", err)
    assert.matches("stack traceback", err)
  end)

  it("collapses a repeated line", function()
    local err, _, st = run([[
local netrun = require "netrun"
for i = 1, 1000 do netrun.log.warn("same line") end
netrun.log.warn("other")
]])
    assert.equal(0, st)
    local l = lines(err)
    assert.equal(12, #l, err)
    for i = 1, 10 do assert.matches("WARN  %[main%] same line$", l[i]) end
    assert.matches("WARN  %[main%] other$", l[11])
    assert.matches("WARN  %[log%] message repeated 990 more times: same line$", l[12])
  end)

  it("never loses a line silently: drops while stderr is full are counted", function()
    -- 20000 lines at once, read by a reader that starts late: what the
    -- pipe and the log's ring cannot hold is dropped and counted, and each
    -- count reaches the reader where the drops happened.
    local dir = H.tmpdir()
    local f = assert(io.open(dir .. "/flood.lua", "w"))
    f:write([[
local netrun = require "netrun"
for i = 1, 20000 do netrun.log.warn("line %d", i) end
]])
    f:close()
    local _, st = H.run(string.format("(%s %s/flood.lua 2>&1 >/dev/null) | (sleep 0.3; cat > %s/err)",
      BIN, dir, dir))
    assert.equal(0, st)
    local ef = assert(io.open(dir .. "/err"))
    local l = lines(ef:read("a"))
    ef:close()
    os.execute("rm -rf " .. dir)
    local got, dropped = 0, 0
    for i, line in ipairs(l) do
      local n = line:match("%[main%] line (%d+)$")
      if n then
        got = got + 1                -- every line numbered as counted
        assert.equal(got + dropped, tonumber(n), "line " .. i .. " out of order")
      else
        dropped = dropped + tonumber((assert(line:match("%[log%] (%d+) log lines dropped"), line)))
      end
    end
    assert.is_true(dropped > 0)
    assert.equal(20000, got + dropped)
  end)

  it("serves clients while its stderr is a pipe nobody reads", function()
    -- One distinct WARN line per connection reset (no rate limit helps);
    -- a pipe holds 64 KiB: a loop that wrote its log itself stopped there.
    local dir = H.tmpdir()
    local port = H.free_port()
    assert(os.execute("mkfifo " .. dir .. "/stderr"))
    local f = assert(io.open(dir .. "/server.lua", "w"))
    f:write(([[
local netrun = require "netrun"
local Echo = {}
function Echo:channel_read(ctx, msg) ctx:write_and_flush(msg) end
function Echo:exception_caught(ctx, err)
  netrun.log.warn("channel %d: %s", ctx.channel:id(), err)
  ctx:close()
end
netrun.server { group = netrun.group { threads = 1, name = "stuck" },
  host = "127.0.0.1", port = PORT,
  init = function(ch) ch:pipeline():add_last("echo", Echo) end }:sync()
print("listening")
io.stdout:flush()
]]):gsub("PORT", port) .. "")
    f:close()
    -- stderr opened read-write on a fifo: a pipe whose reader never reads
    local p = assert(io.popen(string.format("%s %s/server.lua > %s/out 2<>%s/stderr & echo $!",
      BIN, dir, dir, dir)))
    local pid = tonumber(p:read("l"))
    p:close()
    local up = H.eventually(function()
      local o = io.open(dir .. "/out")
      local text = o and o:read("a") or ""
      if o then o:close() end
      return text:find("listening", 1, true)
    end, 10)
    local resets = 0
    if up then
      for i = 1, 5000 do
        local c = H.client(port)
        c:send("x")
        if c:receive(1) ~= "x" then c:close() break end
        c:setoption("linger", { on = true, timeout = 0 })
        c:close()                              -- RST: a WARN line on the server
        resets = i
      end
    end
    local answer
    if resets == 5000 then
      local c = H.client(port)
      c:send("hello\n")
      answer = c:receive("*l")
      c:close()
    end
    local stopped = H.stop(pid)
    if not stopped then os.execute("kill -KILL " .. pid) end
    os.execute("rm -rf " .. dir)
    assert.truthy(up)
    assert.equal(5000, resets)
    assert.equal("hello", answer)
    assert.is_true(stopped, "the server did not exit on SIGTERM")
  end)
end)
