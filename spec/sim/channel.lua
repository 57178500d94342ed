-- spec/sim/channel.lua -- channel-level time on virtual time: the idle
-- handler, the send timeout, connect timeouts, stream timeouts, resets and
-- half-close: the simulated counterparts of handler_spec's idle_state,
-- send_timeout_spec, channel_spec's connect timeout and stream_spec's
-- settimeout tests, at their defaults (60 s, 30 s) instead of the
-- fractions of a second those wait on the wall clock.
--
-- A file of scenarios (each a function of a fresh world): run by
-- spec/sim_scenarios_spec.lua, and by `netrun --sim 1-100
-- spec/sim/channel.lua` twice for the determinism check.
local S = {}

local function near(x, want, slack)
  assert(math.abs(x - want) <= (slack or 0.01), ("%.6f is not %.3f"):format(x, want))
end

function S.idle_state_fires_reader_writer_and_all_events_on_time(world)
  local a, b = world:host "a", world:host "b"
  b:run(function()
    local netrun = require "netrun"
    local d = netrun.shared.dict("idle")
    netrun.server { port = 7, init = function(ch)
      ch:pipeline():add_last("idle", netrun.handler.idle_state { reader = 30, writer = 45, all = 0 })
      ch:pipeline():add_last("app", {
        channel_active = function(_, ctx) d:set("t0", netrun.now()) end,
        user_event_triggered = function(_, ctx, evt)
          if type(evt) ~= "table" or evt.idle == nil then return end
          local n = d:incr(evt.idle, 1, 0)
          d:set(evt.idle .. n, netrun.now())
        end,
      })
    end }:sync()
  end):await()
  a:run(function(addr)
    local netrun = require "netrun"
    local s = assert(netrun.tcp.connect(addr, 7):await())
    netrun.sleep(50)
    s:send("x")                           -- a read for the server: its reader idle restarts
    netrun.sleep(100)
    s:close()
  end, b.address):await()
  local d = b:run(function()
    local d = require("netrun").shared.dict("idle")
    local t = {}
    for _, k in ipairs(d:keys()) do t[k] = d:get(k) end
    return t
  end):await()
  local t0 = d.t0
  -- reader: 30 from the start, then the read at 50 restarts it: 80, 110
  near(d.reader1 - t0, 30, 0.01)
  near(d.reader2 - t0, 80, 0.01)
  near(d.reader3 - t0, 110, 0.01)
  -- writer: nothing is ever written: 45, 90, 135
  near(d.writer1 - t0, 45, 0.01)
  near(d.writer2 - t0, 90, 0.01)
  assert(d.all == nil)
end

function S.a_peer_that_reads_nothing_is_reset_after_the_send_timeout(world)
  local a, b = world:host "a", world:host "b"
  b:run(function()
    local netrun = require "netrun"
    local d = netrun.shared.dict("send")
    local chunk = string.rep("x", 65536)
    netrun.server { port = 80, init = function(ch)
      ch:pipeline():add_last("app", {
        channel_active = function(_, ctx)
          d:set("t0", netrun.now())
          for i = 1, 64 do ctx:write(chunk) end        -- 4 MiB: more than the buffers
          ctx:flush()
        end,
        exception_caught = function(_, ctx, err)
          d:set("err", tostring(err))
          d:set("t1", netrun.now())
          ctx:close()
        end,
      })
    end }:sync()
  end):await()
  local r = a:run(function(addr)
    local netrun = require "netrun"
    local done = netrun.promise()
    netrun.connect { host = addr, port = 80, options = { auto_read = false }, init = function(ch)
      ch:close_future():add_listener(function() done:try_success(netrun.now()) end)
    end }:sync()
    return done:await()
  end, b.address):await()
  local d = b:run(function()
    local d = require("netrun").shared.dict("send")
    return { d:get("t0"), d:get("t1"), d:get("err") }
  end):await()
  assert(d[3]:find("send timeout", 1, true), tostring(d[3]))
  near(d[2] - d[1], 60, 0.1)             -- the peer took nothing for 60 s
  assert(r >= d[2])                       -- and the client saw its reset
end

function S.a_connect_to_nobody_times_out_and_one_to_a_closed_port_is_refused(world)
  local a = world:host "a"
  world:host "b"
  local r = a:run(function()
    local netrun = require "netrun"
    local t0 = netrun.now()
    local ok1, e1 = pcall(function() return netrun.connect { host = "10.0.9.9", port = 80 }:await() end)
    local t1 = netrun.now()
    local ok2, e2 = pcall(function() return netrun.connect { host = "b", port = 81 }:await() end)
    local ok3, e3 = pcall(function() return netrun.connect { host = "10.0.9.9", port = 80, timeout = 3 }:await() end)
    return { ok1, tostring(e1), t1 - t0, ok2, tostring(e2), ok3, tostring(e3), netrun.now() - t1 }
  end):await()
  assert(not r[1] and r[2]:find("timed out after 30 s", 1, true), r[2])
  near(r[3], 30, 0.01)
  assert(not r[4] and r[5]:find("ECONNREFUSED", 1, true), r[5])
  assert(not r[6] and r[7]:find("timed out after 3 s", 1, true), r[7])
end

function S.a_stream_receive_times_out_and_stays_usable(world)
  local a, b = world:host "a", world:host "b"
  b:run(function()
    local netrun = require "netrun"
    netrun.server { port = 9, stream = function(s)
      netrun.sleep(10)
      s:send("late\n")
    end }:sync()
  end):await()
  local r = a:run(function(addr)
    local netrun = require "netrun"
    local s = assert(netrun.tcp.connect(addr, 9):await())
    s:settimeout(4)
    local t0 = netrun.now()
    local x, e1 = s:receive("*l")
    local t1 = netrun.now()
    local y, e2 = s:receive("*l")
    local t2 = netrun.now()
    s:settimeout(60)
    local z = s:receive("*l")
    return { x, e1, t1 - t0, y, e2, t2 - t0, z, netrun.now() - t0 }
  end, b.address):await()
  assert(r[1] == nil and r[2] == "timeout")
  near(r[3], 4, 0.01)
  assert(r[4] == nil and r[5] == "timeout")
  near(r[6], 8, 0.01)
  assert(r[7] == "late")
  near(r[8], 10, 0.01)
end

function S.a_reset_in_the_middle_of_a_transfer_fails_both_ends(world)
  local a, b = world:host "a", world:host "b"
  world:latency(a, b, 0.01)
  b:run(function()
    local netrun = require "netrun"
    netrun.server { port = 5, stream = function(s)
      local n = 0
      while true do
        local data = s:receive(1000)
        if not data then break end
        n = n + #data
      end
      netrun.shared.dict("got"):set("n", n)
    end }:sync()
  end):await()
  local r = a:run(function(addr)
    local netrun = require "netrun"
    local s = assert(netrun.tcp.connect(addr, 5):await())
    local sent, err = 0, nil
    for i = 1, 1000 do
      local ok, e = s:send(string.rep("y", 1000))
      if not ok then err = e break end
      sent = sent + 1000
    end
    return { sent, err }
  end, b.address)
  world:sleep(0.1)
  assert(world:reset(a, b) == 2)
  local res = r:await()
  assert(res[2] == "closed" and res[1] < 1000000, tostring(res[1]) .. " " .. tostring(res[2]))
  world:sleep(1)                          -- (the server's coroutine hears of it)
  local got = b:run(function() return require("netrun").shared.dict("got"):get("n") end):await()
  assert(got and got < res[1] + 1000, tostring(got))
end

function S.what_is_written_before_a_close_arrives_whole_before_the_eof(world)
  local a, b = world:host "a", world:host "b"
  world:latency(a, b, 0.02)
  b:run(function()
    local netrun = require "netrun"
    netrun.server { port = 6, stream = function(s)
      local all, err, partial = s:receive("*a")   -- until the peer's FIN
      netrun.shared.dict("got"):set("n", #(all or partial))
      netrun.shared.dict("got"):set("ok", all == string.rep("z", 300000))
    end }:sync()
  end):await()
  a:run(function(addr)
    local netrun = require "netrun"
    local s = assert(netrun.tcp.connect(addr, 6):await())
    assert(s:send(string.rep("z", 300000)))
    s:close()                              -- the FIN goes after the bytes
  end, b.address):await()
  world:sleep(1)
  local r = b:run(function()
    local d = require("netrun").shared.dict("got")
    return { d:get("n"), d:get("ok") }
  end):await()
  assert(r[1] == 300000 and r[2] == true, tostring(r[1]))
end

return S
