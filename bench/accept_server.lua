-- accept_server.lua -- the server of bench/run_accept.sh: an echo server
-- on a group of --threads loops, with one listener per loop when
-- --reuseport yes, else one listener (the boss group's loop accepting and
-- handing each channel to the workers). Every --counts-every seconds it
-- writes the connections each loop accepted so far to --counts FILE, one
-- "loop count" line each.
--   netrun bench/accept_server.lua --port N [--threads 2] [--reuseport yes]
--                                  [--counts FILE]
local netrun = require "netrun"

local option = netrun.option
local reuseport = option("reuseport", "no") == "yes"
local threads = option("threads", 2)
local counts = option("counts")
local dict = netrun.shared.dict("accept_counts")

local VOID = netrun.void_promise()
local Echo = {}
function Echo:channel_read(ctx, msg) ctx:write(msg, VOID) end
function Echo:channel_read_complete(ctx) ctx:flush() end
function Echo:exception_caught(ctx) ctx:close() end   -- the load resets

local workers = netrun.group { threads = threads, name = "acc" }
local boss = not reuseport and netrun.group { threads = 1, name = "boss" } or nil
local server = netrun.server {
  group = boss or workers, child_group = workers, reuseport = reuseport,
  host = "127.0.0.1", port = option("port", 7000),
  init = function(ch)
    local nr = require "netrun"
    nr.shared.dict("accept_counts"):incr(nr.current():name(), 1, 0)
    ch:pipeline():add_last("echo", Echo)
  end,
}:sync()

if counts then
  local timer = netrun.group { threads = 1, name = "counts", daemon = true }
  timer:schedule_at_fixed_rate(0.5, 0.5, function(path, n)
    local d = require("netrun").shared.dict("accept_counts")
    local f = assert(io.open(path .. ".tmp", "w"))
    for i = 1, n do f:write(("acc-%d %d\n"):format(i, d:get("acc-" .. i) or 0)) end
    f:close()
    os.rename(path .. ".tmp", path)
  end, counts, threads)
end
assert(dict)
netrun.log.info("accept server (reuseport %s) listening on %s:%d",
                tostring(reuseport), server:local_address())
