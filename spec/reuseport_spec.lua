-- reuseport_spec.lua -- netrun.server { reuseport = true }: one listener
-- per child loop, all on one address (SO_REUSEPORT); the kernel spreads
-- connections over them and each loop accepts for itself.
local H = require "spec.helper"
local netrun = H.netrun

-- The accept queue lengths (rx_queue) of the TCP listeners on
-- 127.0.0.1:port, from /proc/net/tcp (state 0A): one per listener.
local function listener_queues(port)
  local f = assert(io.open("/proc/net/tcp"))
  local queues = {}
  for line in f:lines() do
    local lport, state, rx = line:match("^%s*%d+: 0100007F:(%x+) %x+:%x+ (%x%x) %x+:(%x+)")
    if lport and tonumber(lport, 16) == port and state == "0A" then
      queues[#queues + 1] = tonumber(rx, 16)
    end
  end
  f:close()
  return queues
end

local function listeners(port) return #listener_queues(port) end

-- Connections waiting in those queues: their sum, and the shortest queue.
local function queued(port)
  local n, least = 0, math.huge
  for _, q in ipairs(listener_queues(port)) do
    n, least = n + q, math.min(least, q)
  end
  return n, least
end

local function open_fds()
  local p = io.popen("ls /proc/self/fd | wc -l")
  local n = tonumber(p:read("a"))
  p:close()
  return n
end

-- An echo server whose init counts the connections of each loop in a
-- shared dict (key: the loop's name).
local function counting_server(opts)
  local o = {
    host = "127.0.0.1", port = 0,
    init = function(ch)
      local nr = require "netrun"
      nr.shared.dict("reuseport_spec"):incr(nr.current():name(), 1, 0)
      ch:pipeline():add_last("echo", {
        channel_read = function(_, ctx, msg) ctx:write_and_flush(msg) end,
      })
    end,
  }
  for k, v in pairs(opts) do o[k] = v end
  return netrun.server(o):sync()
end

local function round_trips(port, n)
  for i = 1, n do
    local c = H.client(port)
    assert(c:send("ping " .. i .. "\n"))
    assert.equal("ping " .. i, c:receive("*l"))
    c:close()
  end
end

describe("netrun.server reuseport", function()
  local dict
  before_each(function()
    dict = netrun.shared.dict("reuseport_spec")
    dict:flush_all()
  end)

  it("opens one listener per child loop and every loop accepts", function()
    local g = netrun.group { threads = 4, name = "rp" }
    local server = counting_server { group = g, reuseport = true }
    local _, port = server:local_address()
    assert.is_true(port > 0)
    assert.equal(4, listeners(port))           -- port 0 chosen once, shared
    round_trips(port, 200)
    local total = 0
    for i = 1, 4 do
      local n = H.eventually(function() return dict:get("rp-" .. i) end) or 0
      assert.is_true(n > 0, "loop rp-" .. i .. " accepted nothing")
      total = total + n
    end
    assert.equal(200, total)
    H.shutdown(g)
  end)

  it("with a boss group and a child group: listeners on the child loops only", function()
    local boss = netrun.group { threads = 1, name = "rpboss" }
    local workers = netrun.group { threads = 3, name = "rpw" }
    local server = counting_server { group = boss, child_group = workers, reuseport = true }
    local _, port = server:local_address()
    assert.equal(3, listeners(port))
    round_trips(port, 60)
    assert.is_nil(dict:get("rpboss-1"))
    local total = 0
    for i = 1, 3 do total = total + (dict:get("rpw-" .. i) or 0) end
    assert.equal(60, total)
    H.shutdown(workers)
    H.shutdown(boss)
  end)

  it("keeps one listener without reuseport", function()
    local g = netrun.group { threads = 4, name = "norp" }
    local server = counting_server { group = g }
    local _, port = server:local_address()
    assert.equal(1, listeners(port))
    H.shutdown(g)
  end)

  it("close closes every listener and leaks no descriptor", function()
    local g = netrun.group { threads = 4, name = "rpclose" }
    local fds = open_fds()
    local server = counting_server { group = g, reuseport = true }
    local _, port = server:local_address()
    round_trips(port, 20)
    H.sync(server:close())
    assert.equal(0, listeners(port))             -- all closed once close is done
    local c = H.socket.tcp()
    c:settimeout(2)
    assert.is_nil(c:connect("127.0.0.1", port))
    c:close()
    assert.equal(fds, H.eventually(function() return open_fds() == fds and fds end))
    H.shutdown(g)
  end)

  it("shutting the group down closes every listener", function()
    local g = netrun.group { threads = 3, name = "rpshut" }
    local server = counting_server { group = g, reuseport = true }
    local _, port = server:local_address()
    round_trips(port, 10)
    H.shutdown(g)
    assert.equal(0, listeners(port))
    assert.is_false(server:is_open())
  end)

  it("a fixed port taken by a socket without SO_REUSEPORT fails the future", function()
    local taken = assert(H.socket.bind("127.0.0.1", 0))
    local _, port = taken:getsockname()
    local g = netrun.group { threads = 2, name = "rpbusy" }
    local f = netrun.server { group = g, host = "127.0.0.1", port = tonumber(port),
                              reuseport = true, init = function() end }
    local ok, err = pcall(H.sync, f)
    assert.is_false(ok)
    assert.matches("EADDRINUSE", err)
    taken:close()
    H.shutdown(g)
  end)

  it("a unix socket with reuseport fails with a clear error", function()
    local g = netrun.group { threads = 2, name = "rpunix" }
    local dir = H.tmpdir()
    local ok, err = pcall(H.sync, netrun.server { group = g, unix = dir .. "/s",
                                                  reuseport = true, init = function() end })
    assert.is_false(ok)
    assert.matches("reuseport needs a TCP address", err)
    os.execute("rm -rf " .. dir)
    H.shutdown(g)
  end)

  -- What a stalled loop's listener does (measured: bench/RESULTS.md, "A
  -- stalled loop and new connections"). The group chooser passes over a
  -- stalled loop, but with reuseport nothing is chosen: the kernel hashes
  -- each new connection to one of the listeners, the stuck loop's
  -- included, and queues it there (the handshake completes; the backlog
  -- holds it). So while one of two loops is stuck about half of the new
  -- connections wait -- none is lost: each is served once the loop runs
  -- again (at the latest after stall_timeout, when one is set).
  it("a stalled loop's listener keeps its share: those connections wait in its queue and are served once it runs again", function()
    local g = netrun.group { threads = 2, name = "rpstall", stall_threshold = 0.1 }
    local server = netrun.server {
      group = g, reuseport = true, host = "127.0.0.1", port = 0,
      init = function(ch)
        local nr = require "netrun"
        nr.shared.dict("reuseport_spec"):incr(nr.current():name(), 1, 0)
        ch:pipeline():add_last("hold", require("hold")("reuseport_spec"))
      end,
    }:sync()
    local _, port = server:local_address()
    -- hold whichever loop the kernel gives this connection
    local held = H.client(port)
    assert(held:send("hold\n"))
    local stuck = H.eventually(function()
      for i, st in ipairs(g:stats()) do if st.stalls > 0 then return "rpstall-" .. i end end
    end)
    assert(stuck, "no loop was reported stalled")
    local other = stuck == "rpstall-1" and "rpstall-2" or "rpstall-1"
    local before_stuck, before_other = dict:get(stuck), dict:get(other) or 0
    -- 20 new connections: the kernel spreads them over both listeners
    local N, clients = 20, {}
    for i = 1, N do
      clients[i] = H.client(port)                  -- connects, even to the stuck loop
      assert(clients[i]:send("ping\n"))
    end
    local waiting, served = {}, 0
    for i = 1, N do waiting[i] = clients[i] end
    local deadline = H.socket.gettime() + 10
    -- the other loop serves its share (its queue empties); the rest waits
    -- in the stuck listener's accept queue
    local function settled()
      local n, least = queued(port)
      return served + n == N and least == 0
    end
    while not settled() and H.socket.gettime() < deadline do
      local list = {}
      for _, c in pairs(waiting) do list[#list + 1] = c end
      for _, c in ipairs((H.socket.select(list, nil, 0.05))) do
        assert.equal("pong", c:receive("*l"))
        for i, w in pairs(waiting) do if w == c then waiting[i] = nil end end
        served = served + 1
      end
    end
    assert.equal(N, served + queued(port))
    assert.equal(served, dict:get(other) - before_other)
    assert.equal(before_stuck, dict:get(stuck))     -- the stuck loop accepted none
    assert.is_true(served > 0 and served < N, served .. " of " .. N .. " served while a loop is stuck")
    -- release the loop: it accepts its queue and serves every one
    dict:set("stop", true)
    assert.equal("pong", held:receive("*l"))
    for _, c in pairs(waiting) do assert.equal("pong", c:receive("*l")) end
    assert.equal(N - served, dict:get(stuck) - before_stuck)
    for i = 1, N do clients[i]:close() end
    held:close()
    H.sync(server:close())
    H.shutdown(g)
  end)

  it("two servers share a port with reuseport, as two processes would", function()
    local g = netrun.group { threads = 2, name = "rptwo" }
    local a = counting_server { group = g, reuseport = true }
    local _, port = a:local_address()
    local b = counting_server { group = g, reuseport = true, port = port }
    assert.equal(4, listeners(port))
    H.sync(a:close())
    assert.equal(2, listeners(port))
    round_trips(port, 10)                         -- b still serves
    H.sync(b:close())
    H.shutdown(g)
  end)
end)
