-- spec/sim/shutdown.lua -- graceful shutdown on virtual time: the quiet
-- period, answers still being computed, the shutdown timeout, and the
-- graceful close of connections: the simulated counterparts of
-- shutdown_spec's tests (which shorten the periods to wait less; here
-- netrun's defaults, 2 s quiet and 15 s timeout, cost nothing).
--
-- A file of scenarios (each a function of a fresh world): run by
-- spec/sim_scenarios_spec.lua, and by `netrun --sim 1-100
-- spec/sim/shutdown.lua` twice for the determinism check.
local S = {}

local function near(x, want, slack)
  assert(math.abs(x - want) <= (slack or 0.01), ("%.6f is not %.3f"):format(x, want))
end

-- On host h: a group serving HTTP on port whose /slow is answered after
-- `slow` seconds, computed by another group (as spec/fixtures/
-- slow_answer.lua's answers come through a future); returns the time its
-- shutdown started and ended, once `go` (a future) completes, with the
-- shutdown's quiet and timeout.
local function serve_then_shut(h, port, slow, quiet, timeout, go)
  return h:run(function(p, delay, q, t, start)
    local netrun = require "netrun"
    local g = netrun.group { threads = 1, name = "web" }
    local compute = netrun.group { threads = 1, name = "compute" }
    netrun.server { group = g, port = p, init = function(ch)
      ch:pipeline():add_last("http", netrun.codec.http_server {})
      ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
        local res = { status = 200, body = "done " .. req.path }
        if req.path == "/slow" then
          compute:schedule(delay, function(b) return b end, res.body):add_listener(function(f)
            ctx:write_and_flush { status = 200, body = f:result() }
          end)
        else
          ctx:write_and_flush(res)
        end
      end })
    end }:sync()
    start:await()
    local t0 = netrun.now()
    g:shutdown_gracefully(q, t):await()
    return { t0, netrun.now() }
  end, port, slow, quiet, timeout, go)
end

function S.an_idle_group_terminates_after_its_quiet_period(world)
  local b = world:host "b"
  local go = require("netrun").promise()
  local done = serve_then_shut(b, 80, 1, 2, 15, go)
  go:set_success(true)
  local t = done:await()
  near(t[2] - t[1], 2.05, 0.051)         -- quiet, checked every 0.1 s
end

function S.a_shutdown_waits_for_an_answer_being_computed(world)
  local a, b = world:host "a", world:host "b"
  local go = require("netrun").promise()
  local done = serve_then_shut(b, 80, 4, 0, 15, go)
  local req = world:client(a, { timeout = 30 }):request { url = "http://b/slow" }
  world:sleep(1)
  go:set_success(true)                     -- the shutdown starts, 3 s before the answer
  local res = req:await()
  assert(res.status == 200 and res.body == "done /slow", tostring(res.body))
  local t = done:await()
  assert(t[2] - t[1] >= 3 - 0.01, "it did not wait: " .. (t[2] - t[1]))
  assert(t[2] - t[1] < 15)
end

function S.the_shutdown_timeout_ends_an_answer_that_never_comes(world)
  local a, b = world:host "a", world:host "b"
  local go = require("netrun").promise()
  local done = serve_then_shut(b, 80, 1000, 0, 15, go)
  local req = world:client(a, { timeout = 60 }):request { url = "http://b/slow" }
  world:sleep(1)
  go:set_success(true)
  local ok, err = pcall(function() return req:await() end)
  assert(not ok, "an answer came")
  local t = done:await()
  near(t[2] - t[1], 15, 0.2)
end

function S.a_shut_down_server_refuses_new_connections(world)
  local a, b = world:host "a", world:host "b"
  local go = require("netrun").promise()
  local done = serve_then_shut(b, 80, 1, 0, 15, go)
  local c = world:client(a, { timeout = 10 })
  assert(c:request { url = "http://b/before" }:await().body == "done /before")
  go:set_success(true)
  done:await()
  local ok, err = pcall(function() return c:request { url = "http://b/after" }:await() end)
  assert(not ok and tostring(err):find("ECONNREFUSED", 1, true), tostring(err))
end

return S
