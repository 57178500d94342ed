-- The simulated versions of the specs that wait on real time (spec/sim/
-- *.lua: the HTTP server's and client's timeouts, keep-alive, pools,
-- retries and reconnects, channel timeouts and resets, graceful shutdown,
-- the stall watchdog), each scenario on three seeds, in this process.
-- sim/determinism_* (ctest, spec/sim/determinism.sh) runs them for 100
-- seeds twice over, in two processes, and compares their trace hashes.
local H = require "spec.helper"
local sim = require "netrun.sim"

local files = { "server", "client", "channel", "shutdown", "stall" }

for _, file in ipairs(files) do
  local scenarios = dofile(H.root .. "/spec/sim/" .. file .. ".lua")
  local names = {}
  for name in pairs(scenarios) do names[#names + 1] = name end
  table.sort(names)
  describe("simulated " .. file, function()
    for _, name in ipairs(names) do
      it(name:gsub("_", " "), function()
        for seed = 1, 3 do
          sim.run({ seed = seed }, scenarios[name])
        end
      end)
    end
  end)
end
