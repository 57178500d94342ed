-- spec/sim/stall.lua -- the stall watchdog on virtual time: a handler
-- busy for seconds (work timed by os.clock, which a simulation advances
-- while a run spins on it) is reported past stall_threshold and
-- interrupted past stall_timeout, and the loop lives on: stall_spec's
-- cases, which burn real CPU seconds there, in milliseconds.
--
-- A file of scenarios (each a function of a fresh world): run by
-- spec/sim_scenarios_spec.lua, and by `netrun --sim 1-100
-- spec/sim/stall.lua` twice for the determinism check.
local S = {}

-- On host b: a group with the stall options given serving HTTP on 80;
-- /busy?s=N works N seconds (os.clock), /loop forever; others answer.
local function server(b, opts)
  return b:run(function(o)
    local netrun = require "netrun"
    local g = netrun.group { threads = 1, name = "web", stall_threshold = o.threshold,
                             stall_timeout = o.timeout }
    netrun.server { group = g, port = 80, init = function(ch)
      ch:pipeline():add_last("http", netrun.codec.http_server {})
      ch:pipeline():add_last("app", {
        channel_read = function(_, ctx, req)
          if req.path == "/busy" then
            local t = os.clock() + tonumber(req.args.s)
            while os.clock() < t do end
          elseif req.path == "/loop" then
            while true do os.clock() end
          end
          ctx:write_and_flush { status = 200, body = "done " .. req.path }
        end,
        exception_caught = function(_, ctx, err)
          ctx:write_and_flush { status = 500, body = tostring(err) }
        end,
      })
    end }:sync()
    return g
  end, opts):await()
end

function S.a_busy_handler_is_reported_stalled_and_timed(world)
  local a, b = world:host "a", world:host "b"
  local g = server(b, { threshold = 1 })
  local c = world:client(a, { timeout = 60 })
  local t0 = require("netrun").now()
  local res = c:request { url = "http://b/busy?s=3" }:await()
  assert(res.body == "done /busy", res.body)
  local took = require("netrun").now() - t0
  assert(took > 2.9 and took < 3.2, "took " .. took)
  local st = b:run(function(grp) return grp:stats()[1] end, g):await()
  assert(st.stalls == 1, "stalls: " .. st.stalls)
  assert(st.max_busy > 2.9 and st.max_busy < 3.2, "max_busy " .. st.max_busy)
  assert(c:request { url = "http://b/after" }:await().body == "done /after")
end

function S.stall_timeout_interrupts_a_handler_that_never_ends(world)
  local a, b = world:host "a", world:host "b"
  server(b, { threshold = 1, timeout = 2 })
  local c = world:client(a, { timeout = 60 })
  local res = c:request { url = "http://b/loop" }:await()
  assert(res.status == 500 and res.body:find("stalled for 2", 1, true), res.body)
  assert(c:request { url = "http://b/after" }:await().body == "done /after")   -- it lives on
end

return S
