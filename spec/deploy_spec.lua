-- deploy_spec.lua -- the deployment model of docs/guide/operating.md: several netrun
-- processes (examples/counter.lua) share state in one Redis through the
-- stream client, whether each has a port of its own (hosts behind a load
-- balancer) or all share one port with reuseport. A real redis-server
-- (scripts/deps.sh) on a free port; skipped where there is none.
local H = require "spec.helper"

local has_redis = H.run("command -v redis-server")
has_redis = has_redis:match("redis%-server") ~= nil

-- Send one line on a fresh connection and return the answer line.
local function ask(port, line)
  local c = H.client(port)
  assert(c:send(line .. "\n"))
  local answer, err = c:receive("*l")
  c:close()
  assert(answer, "no answer to " .. line .. ": " .. tostring(err))
  return answer
end

local function bg(cmd)
  local f = assert(io.popen(cmd .. " & echo $!"))
  local pid = tonumber(f:read("l"))
  f:close()
  return pid
end

local redis_port, redis_pid

local function start_counter(port, name, extra)
  local log = os.tmpname()
  local pid = bg(string.format("%s examples/counter.lua --port %d --redis-port %d --name %s %s > %s 2>&1",
    H.BIN, port, redis_port, name, extra or "", log))
  -- a failed test leaves no process behind (stop's own TERM comes first)
  finally(function() os.execute("kill -KILL " .. pid .. " 2>/dev/null") end)
  local up = H.eventually(function() return H.read_file(log):find("listening", 1, true) end, 10)
  assert(up, name .. " did not start:\n" .. H.read_file(log))
  return pid, log
end

local function stop(pid, log)
  assert.is_true(H.stop(pid))
  os.remove(log)
end

;(has_redis and describe or pending)("examples/counter.lua against one Redis", function()
  setup(function()
    redis_port = H.free_port()
    redis_pid = bg(string.format("redis-server --port %d --bind 127.0.0.1 --save '' " ..
                                 "--appendonly no > /dev/null 2>&1", redis_port))
    assert(H.eventually(function()
      return H.run("redis-cli -p " .. redis_port .. " ping"):match("PONG")
    end, 10), "redis-server did not start")
  end)

  -- SIGKILL: a program started from inside netrun (the sanitizer builds
  -- run busted in it) inherits its blocked SIGINT and SIGTERM.
  teardown(function()
    if redis_pid then os.execute("kill -KILL " .. redis_pid) end
  end)

  it("two processes on two ports count together", function()
    local pa, la = start_counter(H.free_port(), "a")
    local pb, lb = start_counter(H.free_port(), "b")
    local port_a = tonumber(H.read_file(la):match("127%.0%.0%.1:(%d+) "))
    local port_b = tonumber(H.read_file(lb):match("127%.0%.0%.1:(%d+) "))
    local seen = {}
    for i = 1, 50 do
      seen[tonumber(ask(port_a, "incr hits"))] = true
      seen[tonumber(ask(port_b, "incr hits"))] = true
    end
    for n = 1, 100 do assert.is_true(seen[n], "count " .. n .. " never answered") end
    assert.equal("100", ask(port_a, "get hits"))
    assert.equal("100", H.run("redis-cli -p " .. redis_port .. " get hits"):match("%d+"))
    stop(pa, la)
    stop(pb, lb)
  end)

  it("two processes share one port with reuseport and still count together", function()
    local port = H.free_port()
    local pa, la = start_counter(port, "a", "--reuseport yes")
    local pb, lb = start_counter(port, "b", "--reuseport yes")
    local names, seen = {}, {}
    for _ = 1, 60 do
      local c = H.client(port)
      assert(c:send("name\nincr shared\n"))
      names[c:receive("*l")] = true
      seen[tonumber(c:receive("*l"))] = true
      c:close()
    end
    assert.is_true(names.a and names.b, "the kernel gave every connection to one process")
    for n = 1, 60 do assert.is_true(seen[n], "count " .. n .. " never answered") end
    stop(pa, la)
    stop(pb, lb)
  end)

  it("answers ERR when Redis is gone, and counts again once it is back", function()
    local pa, la = start_counter(H.free_port(), "a")
    local port = tonumber(H.read_file(la):match("127%.0%.0%.1:(%d+) "))
    os.execute("kill -KILL " .. redis_pid)
    assert(H.eventually(function()
      return ask(port, "incr x"):match("^ERR")
    end, 10))
    redis_pid = bg(string.format("redis-server --port %d --bind 127.0.0.1 --save '' " ..
                                 "--appendonly no > /dev/null 2>&1", redis_port))
    assert(H.eventually(function() return ask(port, "incr x") == "1" end, 10))
    stop(pa, la)
  end)
end)
