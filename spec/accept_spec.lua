-- accept_spec.lua -- accepting when the descriptors run out: a server whose
-- descriptor table is full of connections that drip a request head a byte
-- a second (slowloris) still lets other clients in, by closing the oldest
-- connections that have not completed a request head. The server is a
-- netrun process of its own (examples/http_hello.lua) with a small
-- descriptor limit, so the attack is bounded: 300 descriptors, 320
-- dripping clients. (The C tests in spec/c/test_channel.c cover the other
-- cases: a silent connection of another protocol, nothing to close, no
-- reserve descriptor.)
local H = require "spec.helper"
local socket = H.socket

local NOFILE, DRIPPERS, NORMAL = 300, 320, 10
local HEAD = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Drip: "

-- A dripping client: connected, it sends one more byte of a head that
-- never ends every second; one the server closed connects again (the
-- attack goes on).
local function drip_connect(port)
  local c = assert(socket.tcp())
  c:settimeout(0)
  c:connect("127.0.0.1", port)          -- (in progress, or done)
  return { c = c, sent = 0 }
end

local function drip(d, port)
  local i = d.sent + 1
  local byte = i <= #HEAD and HEAD:sub(i, i) or "a"
  local n, err = d.c:send(byte)
  if n == 1 then
    d.sent = i
  elseif err == "closed" or (err and err ~= "timeout") then
    d.c:close()
    local fresh = drip_connect(port)
    d.c, d.sent = fresh.c, 0
    d.reconnects = (d.reconnects or 0) + 1
  end
end

-- A normal client: one whole request, then its answer read to the close.
local function normal_start(port)
  local c = assert(socket.tcp())
  c:settimeout(0)
  c:connect("127.0.0.1", port)
  return { c = c, out = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
           got = {}, start = socket.gettime() }
end

-- Advance a normal client: send what is left, read what came; true once
-- its answer is whole.
local function normal_step(n)
  if n.done then return true end
  if #n.out > 0 then
    local sent, _, partial = n.c:send(n.out)
    local k = sent or partial or 0
    n.out = n.out:sub(k + 1)
  end
  local data, err, partial = n.c:receive(65536)
  data = data or partial
  if data and #data > 0 then n.got[#n.got + 1] = data end
  if err == "closed" then
    local text = table.concat(n.got)
    n.done = true
    n.ok = text:match("^HTTP/1%.1 200 ") ~= nil and text:find("Hello, World!", 1, true) ~= nil
    n.took = socket.gettime() - n.start
  end
  return n.done
end

describe("accept with the descriptors all taken", function()
  it("lets clients in past 320 connections dripping a head into 300 descriptors", function()
    local port = H.free_port()
    local pid, log = H.start("examples/http_hello.lua", port, "",
      ("sh -c 'ulimit -n %d && exec \"$0\" \"$@\"'"):format(NOFILE))
    finally(function() H.stop(pid); os.remove(log) end)
    local drippers = {}
    for i = 1, DRIPPERS do drippers[i] = drip_connect(port) end
    -- Two seconds of dripping: the server's table is full, the rest of
    -- the drippers wait in its listen queue.
    local t0 = socket.gettime()
    local next_drip = t0
    local function drip_all()
      local now = socket.gettime()
      if now >= next_drip then
        for _, d in ipairs(drippers) do drip(d, port) end
        next_drip = next_drip + 1
      end
    end
    while socket.gettime() < t0 + 2 do
      drip_all()
      socket.select(nil, nil, 0.05)
    end
    -- Ten clients come; each must be served within 10 s of its connect.
    local normal = {}
    for i = 1, NORMAL do normal[i] = normal_start(port) end
    local deadline = socket.gettime() + 10
    while socket.gettime() < deadline do
      local all = true
      local rs = {}
      for _, n in ipairs(normal) do
        if not normal_step(n) then all = false; rs[#rs + 1] = n.c end
      end
      if all then break end
      drip_all()
      socket.select(rs, nil, 0.05)     -- (a wait for their answers, bounded)
    end
    local served, slowest = 0, 0
    for _, n in ipairs(normal) do
      if n.ok and n.took <= 10 then
        served = served + 1
        slowest = math.max(slowest, n.took)
      end
      n.c:close()
    end
    local reconnects = 0
    for _, d in ipairs(drippers) do
      reconnects = reconnects + (d.reconnects or 0)
      d.c:close()
    end
    print(("  %d of %d served within 10 s (slowest %.2f s); %d drippers closed by the server")
      :format(served, NORMAL, slowest, reconnects))
    assert.is_true(H.alive(pid), "the server died: " .. H.read_file(log))
    assert.is_true(served >= 9, served .. " of " .. NORMAL .. " served within 10 s")
    assert.matches("out of descriptors: closed %d+ connection", H.read_file(log))
  end)
end)
