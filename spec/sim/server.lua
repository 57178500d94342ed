-- spec/sim/server.lua -- the HTTP server's timeouts on virtual time: the
-- simulated counterparts of http_spec's keep-alive, header, body and idle
-- timeout tests, which wait on the wall clock there (seconds, at their
-- shortest settings) and take milliseconds here at nginx's defaults.
--
-- A file of scenarios (each a function of a fresh world): run by
-- spec/sim_scenarios_spec.lua, and by `netrun --sim 1-100
-- spec/sim/server.lua` twice for the determinism check.
local S = {}

-- On host h: an HTTP server on port with the codec options given; it
-- answers "ok <path>" (or, for /slow, after `slow` seconds).
local function server(h, port, codec_opts, slow)
  return h:run(function(p, o, delay)
    local netrun = require "netrun"
    local codec = netrun.codec.http_server(o)
    netrun.server { port = p, init = function(ch)
      ch:pipeline():add_last("http", codec)
      ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
        local res = { status = 200, body = "ok " .. req.path .. " " .. #(req.body or "") }
        if req.path == "/slow" then
          ctx:loop():schedule(delay, function() ctx:write_and_flush(res) end)
        else
          ctx:write_and_flush(res)
        end
      end })
    end }:sync()
    return true
  end, port, codec_opts or {}, slow or 1):await()
end

-- On host h, in a coroutine: fn(s, now) with a stream to addr:port; what
-- fn returns comes back.
local function client(h, addr, port, fn)
  return h:run(function(a, p, f)
    local netrun = require "netrun"
    local s = assert(netrun.tcp.connect(a, p):await())
    return f(s, netrun.now)
  end, addr, port, fn):await()
end

local function near(x, want, slack)
  assert(math.abs(x - want) <= (slack or 0.01), ("%.6f is not %.3f"):format(x, want))
end

-- Read a response: status line, headers, then Content-Length bytes.
local function response(s)
  local line, err = s:receive("*l")
  if not line then return nil, err end
  local len = 0
  while true do
    local h = assert(s:receive("*l"))
    if h == "" then break end
    local n = h:match("^[Cc]ontent%-[Ll]ength:%s*(%d+)")
    if n then len = tonumber(n) end
  end
  return line, len > 0 and assert(s:receive(len)) or ""
end

function S.keepalive_timeout_closes_an_idle_connection_at_75_s(world)
  local a, b = world:host "a", world:host "b"
  server(b, 80)
  local r = client(a, b.address, 80, function(s, now)
    s:settimeout(1000)
    assert(s:send("GET /x HTTP/1.1\r\nHost: b\r\n\r\n"))
    local line, body = response(s)
    local t0 = now()
    local more, err = s:receive(1)
    return { line, body, more, err, now() - t0 }
  end)
  assert(r[1] == "HTTP/1.1 200 OK" and r[2] == "ok /x 0", tostring(r[1]))
  assert(r[3] == nil and r[4] == "closed", tostring(r[4]))
  near(r[5], 75, 0.01)
end

function S.a_request_before_the_keepalive_timeout_keeps_the_connection(world)
  local a, b = world:host "a", world:host "b"
  server(b, 80, { keepalive_timeout = 10 })
  local r = client(a, b.address, 80, function(s, now)
    s:settimeout(1000)
    local lines = {}
    for i = 1, 5 do                     -- 9 s apart: never idle for 10
      assert(s:send("GET /" .. i .. " HTTP/1.1\r\nHost: b\r\n\r\n"))
      local line, body = response(s)
      lines[i] = body
      require("netrun").sleep(9)
    end
    local t0 = now()
    local more, err = s:receive(1)
    return { table.concat(lines, ","), err, now() - t0 }
  end)
  assert(r[1] == "ok /1 0,ok /2 0,ok /3 0,ok /4 0,ok /5 0", r[1])
  assert(r[2] == "closed")
  near(r[3], 1, 0.01)                   -- 10 s after the last answer
end

-- A server on b with codec_opts, a client on a that sends `bytes` and
-- reads one line: the line, and how long after the send it came.
local function line_after(world, codec_opts, bytes)
  local a, b = world:host "a", world:host "b"
  server(b, 80, codec_opts)
  local r = client(a, b.address, 80, function(s, now)
    s:settimeout(1000)
    local t0 = now()
    assert(s:send(bytes))
    local line = s:receive("*l")
    return { line, now() - t0 }
  end)
  return r[1], r[2]
end

function S.a_head_that_never_ends_gets_408_at_the_header_timeout(world)
  local line, t = line_after(world, nil, "GET / HTTP/1.1\r\nHost: b\r\n")  -- never the blank line
  assert(line == "HTTP/1.1 408 Request Timeout", tostring(line))
  near(t, 60, 0.01)
end

function S.a_head_dripped_a_byte_every_10_s_is_timed_from_its_first_byte(world)
  local a, b = world:host "a", world:host "b"
  server(b, 80, { header_timeout = 30 })
  local r = client(a, b.address, 80, function(s, now)
    s:settimeout(1000)
    local t0 = now()
    local head = "GET / HTTP/1.1\r\nHost: b\r\nX: 1234567890\r\n\r\n"
    local got
    for i = 1, #head do                  -- slowloris: never idle, never done
      if not s:send(head:sub(i, i)) then break end
      got = s:receive(1) and "answered" or nil
      if got then break end
      require("netrun").sleep(10)
    end
    return { now() - t0 }
  end)
  assert(r[1] < 45, "the slow head was not cut: " .. r[1])
end

function S.a_connection_that_says_nothing_is_closed_at_the_header_timeout(world)
  local a, b = world:host "a", world:host "b"
  server(b, 80)
  local r = client(a, b.address, 80, function(s, now)
    s:settimeout(1000)
    local t0 = now()
    local data, err, partial = s:receive(1)
    return { err, partial, now() - t0 }
  end)
  assert(r[1] == "closed" and r[2] == "", tostring(r[1]))
  near(r[3], 60, 0.01)
end

function S.a_body_that_stops_gets_408_at_the_body_timeout(world)
  local line, t = line_after(world, { body_timeout = 20 },
    "POST /up HTTP/1.1\r\nHost: b\r\nContent-Length: 10\r\n\r\n12345")
  assert(line == "HTTP/1.1 408 Request Timeout", tostring(line))
  near(t, 20, 0.01)
end

function S.a_slow_answer_is_waited_for_and_counts_no_idle_time(world)
  local a, b = world:host "a", world:host "b"
  server(b, 80, { keepalive_timeout = 5 }, 30)
  local r = client(a, b.address, 80, function(s, now)
    s:settimeout(1000)
    assert(s:send("GET /x HTTP/1.1\r\nHost: b\r\n\r\n"))
    local _, first = response(s)        -- now idle, for 5 s at most...
    require("netrun").sleep(math.random() * 4.9)
    local t0 = now()                    -- ...when the slow request comes
    assert(s:send("GET /slow HTTP/1.1\r\nHost: b\r\n\r\n"))
    local line, body = response(s)
    return { first, body, now() - t0 }
  end)
  assert(r[1] == "ok /x 0" and r[2] == "ok /slow 0", tostring(r[2]))
  near(r[3], 30, 0.01)                  -- 30 s of handler, no 5 s idle cut
end

-- An answer computed by another group reaches the connection's loop as a
-- task (the future's listener): the loop, blocked until its timeouts' next
-- deadline (60 s away), is woken for it at once.
function S.an_answer_computed_by_another_group_goes_out_at_once(world)
  local a, b = world:host "a", world:host "b"
  local delay = 1 + math.random()          -- (math.random: seeded by the world)
  b:run(function(d)
    local netrun = require "netrun"
    local compute = netrun.group { threads = 1, name = "compute" }
    netrun.server { group = netrun.group { threads = 1, name = "web" }, port = 80,
      init = function(ch)
        ch:pipeline():add_last("http", netrun.codec.http_server {})
        ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
          compute:schedule(d, function(p) return "done " .. p end, req.path):add_listener(function(f)
            ctx:write_and_flush { status = 200, body = f:result() }
          end)
        end })
      end }:sync()
  end, delay):await()
  local r = client(a, b.address, 80, function(s, now)
    s:settimeout(1000)
    local t0 = now()
    assert(s:send("GET /x HTTP/1.1\r\nHost: b\r\n\r\n"))
    local line, body = response(s)
    return { body, now() - t0 }
  end)
  assert(r[1] == "done /x", tostring(r[1]))
  near(r[2], delay, 0.01)
end

function S.pipelined_requests_are_answered_in_order_across_the_network(world)
  local a, b = world:host "a", world:host "b"
  world:latency(a, b, 0.025)
  server(b, 80)
  local r = client(a, b.address, 80, function(s, now)
    s:settimeout(60)
    local t0 = now()
    local req = {}
    for i = 1, 20 do req[i] = "GET /" .. i .. " HTTP/1.1\r\nHost: b\r\n\r\n" end
    assert(s:send(table.concat(req)))
    local bodies = {}
    for i = 1, 20 do
      local _, body = response(s)
      bodies[i] = body
    end
    return { table.concat(bodies, ","), now() - t0 }
  end)
  local want = {}
  for i = 1, 20 do want[i] = "ok /" .. i .. " 0" end
  assert(r[1] == table.concat(want, ","), r[1])
  near(r[2], 0.05, 0.005)               -- one round trip for all of them
end

return S
