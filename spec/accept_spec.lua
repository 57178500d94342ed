-- accept_spec.lua -- accepting when the descriptors run out: a server whose
-- descriptor table is full of connections that drip a request head a byte
-- a second (slowloris), of idle keep-alive connections, or of TLS
-- handshakes dripped in, still lets other clients in, by closing the
-- oldest connections that have not completed a request head, wait idle,
-- or are in their handshake. The server is a netrun process of its own
-- (examples/http_hello.lua, spec/fixtures/tls_lines.lua) with a small
-- descriptor limit, so the attack is bounded: 300 descriptors, 320
-- attacking clients. (The C tests in spec/c/test_channel.c cover the other
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

local function drip(d, port, head)
  head = head or HEAD
  local i = d.sent + 1
  local byte = i <= #head and head:sub(i, i) or "a"
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

-- An idle keep-alive client: connected, one whole request, its answer
-- read, then nothing (until the keep-alive timeout, 75 s); one the server
-- closed connects again and does the same (the attack goes on).
local function idle_connect(port)
  local c = assert(socket.tcp())
  c:settimeout(0)
  c:connect("127.0.0.1", port)
  return { c = c, out = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", got = "" }
end

local function idle_step(d, port)
  if #d.out > 0 then
    local sent, _, partial = d.c:send(d.out)
    d.out = d.out:sub((sent or partial or 0) + 1)
  end
  local data, err, partial = d.c:receive(65536)
  d.got = d.got .. (data or partial or "")
  if err == "closed" then
    if d.got:find("Hello, World!", 1, true) then d.answers = (d.answers or 0) + 1 end
    d.c:close()
    local fresh = idle_connect(port)
    d.c, d.out, d.got = fresh.c, fresh.out, ""
    d.reconnects = (d.reconnects or 0) + 1
  end
end

-- Ten normal clients come; how many were served within 10 s of their
-- connect, and the slowest of those. step() goes on with the attack.
local function serve_normal(port, step)
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
    step()
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
  return served, slowest
end

-- DRIPPERS dripping clients (head: what they drip, HEAD unless given)
-- and drip_all(), which drips a byte on each once a second.
local function dripping(port, head)
  local drippers = {}
  for i = 1, DRIPPERS do drippers[i] = drip_connect(port) end
  local next_drip = socket.gettime()
  local function drip_all()
    if socket.gettime() >= next_drip then
      for _, d in ipairs(drippers) do drip(d, port, head) end
      next_drip = next_drip + 1
    end
  end
  return drippers, drip_all
end

-- Two seconds of the attack: the server's table fills, the rest of the
-- attackers wait in its listen queue.
local function two_seconds_of(step)
  local t0 = socket.gettime()
  while socket.gettime() < t0 + 2 do
    step()
    socket.select(nil, nil, 0.05)
  end
end

-- How many times the server closed the attackers; closes them all.
local function closed_by_server(clients)
  local n = 0
  for _, d in ipairs(clients) do
    n = n + (d.reconnects or 0)
    d.c:close()
  end
  return n
end

describe("accept with the descriptors all taken", function()
  it("lets clients in past 320 idle keep-alive connections in 300 descriptors", function()
    local port = H.free_port()
    local pid, log = H.start("examples/http_hello.lua", port, "",
      ("sh -c 'ulimit -n %d && exec \"$0\" \"$@\"'"):format(NOFILE))
    finally(function() H.stop(pid); os.remove(log) end)
    local idlers = {}
    for i = 1, DRIPPERS do idlers[i] = idle_connect(port) end
    local function step() for _, d in ipairs(idlers) do idle_step(d, port) end end
    -- Until those that got in have their answers (the server's table is
    -- full of idle connections, the rest wait in its listen queue): 2 s
    two_seconds_of(step)
    local served, slowest = serve_normal(port, step)
    local answered = 0                      -- (those closed after theirs too)
    for _, d in ipairs(idlers) do
      if d.got:find("Hello, World!", 1, true) then answered = answered + 1 end
      answered = answered + (d.answers or 0)
    end
    local reconnects = closed_by_server(idlers)
    print(("  %d answers to idle clients; %d of %d served within 10 s (slowest %.2f s); %d idle closed")
      :format(answered, served, NORMAL, slowest, reconnects))
    assert.is_true(H.alive(pid), "the server died: " .. H.read_file(log))
    assert.is_true(answered >= NOFILE / 2, answered .. " idle clients got an answer")
    assert.is_true(served >= 9, served .. " of " .. NORMAL .. " served within 10 s")
    assert.matches("out of descriptors: closed %d+ connection", H.read_file(log))
  end)

  it("lets clients in past 320 connections dripping a head into 300 descriptors", function()
    local port = H.free_port()
    local pid, log = H.start("examples/http_hello.lua", port, "",
      ("sh -c 'ulimit -n %d && exec \"$0\" \"$@\"'"):format(NOFILE))
    finally(function() H.stop(pid); os.remove(log) end)
    local drippers, drip_all = dripping(port)
    two_seconds_of(drip_all)
    -- Ten clients come; each must be served within 10 s of its connect.
    local served, slowest = serve_normal(port, drip_all)
    local reconnects = closed_by_server(drippers)
    print(("  %d of %d served within 10 s (slowest %.2f s); %d drippers closed by the server")
      :format(served, NORMAL, slowest, reconnects))
    assert.is_true(H.alive(pid), "the server died: " .. H.read_file(log))
    assert.is_true(served >= 9, served .. " of " .. NORMAL .. " served within 10 s")
    assert.matches("out of descriptors: closed %d+ connection", H.read_file(log))
  end)

  it("lets TLS clients in past 320 connections dripping a TLS handshake into 300 descriptors", function()
    -- (a protocol other than HTTP over TLS: the handshake's first byte is
    -- no longer fresh, the handshake under way is what may be shed)
    local dir = H.tmpdir()
    assert(os.execute("bash spec/fixtures/tls/make_certs.sh " .. dir))
    local port = H.free_port()
    local pid, log = H.start("spec/fixtures/tls_lines.lua", port,
      ("--cert %s/server.crt --key %s/server.key"):format(dir, dir),
      ("sh -c 'ulimit -n %d && exec \"$0\" \"$@\"'"):format(NOFILE))
    local out = dir .. "/clients.out"
    finally(function() H.stop(pid); os.remove(log); os.execute("rm -rf " .. dir) end)
    -- a ClientHello's record header and the start of its handshake header
    local HELLO = "\22\3\1\0\200\1\0\0\196\3\3"
    local drippers, drip_all = dripping(port, HELLO)
    two_seconds_of(drip_all)
    -- Ten TLS clients come (Python's ssl), each to be answered within 10 s.
    os.execute(("python3 spec/fixtures/tls_clients.py %d %d 10 > %s.tmp 2>&1 && mv %s.tmp %s &")
      :format(port, NORMAL, out, out, out))
    local deadline = socket.gettime() + 15
    while socket.gettime() < deadline and not H.read_file(out):find("\n") do
      drip_all()
      socket.select(nil, nil, 0.05)
    end
    local reconnects = closed_by_server(drippers)
    local served, slowest = H.read_file(out):match("^(%d+) ([%d.]+)")
    print(("  %s of %d served within 10 s (slowest %s s); %d drippers closed by the server")
      :format(tostring(served), NORMAL, tostring(slowest), reconnects))
    assert.is_true(H.alive(pid), "the server died: " .. H.read_file(log))
    assert.is_true(tonumber(served or 0) >= 9, tostring(served) .. " of " .. NORMAL .. " served within 10 s")
    assert.matches("out of descriptors: closed %d+ connection", H.read_file(log))
  end)
end)
