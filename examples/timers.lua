-- timers.lua -- scheduled tasks on a loop: a one-shot, a fixed-rate tick
-- and a fixed-delay tick, a cancelled timer, and a coroutine that sleeps.
-- Everything runs on the loop's thread, in its own Lua state; the script
-- exits when the group has shut down.
--   netrun examples/timers.lua
local netrun = require "netrun"

local group = netrun.group { threads = 1, name = "timers" }
local loop = group:next()
local t0 = netrun.now()
local function stamp(what)
  print(string.format("%6.3f s  %s on %s", netrun.now() - t0, what, netrun.current():name()))
end

loop:schedule(0.25, function() stamp("one-shot after 0.25 s") end)

local ticks = loop:schedule_at_fixed_rate(0.1, 0.2, function() stamp("fixed-rate tick") end)
local slow = loop:schedule_with_fixed_delay(0.1, 0.3, function() stamp("fixed-delay tick") end)

local never = loop:schedule(10, function() stamp("never printed") end)
never:cancel()
print("cancelled a 10 s timer:", never:is_cancelled())

loop:submit(function()
  return netrun.spawn(function()
    for i = 1, 3 do
      netrun.sleep(0.15)
      stamp("coroutine woke up, " .. i)
    end
  end)
end):sync():sync()

loop:schedule(1.0, function()
  stamp("stopping")
end):sync()
ticks:cancel()
slow:cancel()
group:shutdown_gracefully(0, 1):sync()
print("done")
