-- module_spec.lua -- DESIGN.md §9.7: the `netrun` module shows only public
-- API. Its exact key set is held here, in the main state and in a loop's
-- state, so that an internal function leaking into it fails this spec;
-- what the REPL, the console, reload, metrics and `netrun top` use besides
-- stays in netrun.core.
local H = require "spec.helper"
local netrun = H.netrun

-- Public, documented in DESIGN.md §4/§8/§9 and docs/guide/.
local EAGER = { "all", "channel_group", "codec", "connect", "current", "embedded",
                "executor_group", "group", "handler", "log", "now", "option", "options", "promise",
                "reload", "run", "server", "shared", "sleep", "spawn", "tls", "udp",
                "version", "void_promise" }
-- Loaded on first use (then stored in the module, so pairs shows them).
local LAZY = { "dns", "http", "json", "limit", "metrics", "nats", "redis", "tcp", "websocket" }

local function sorted(t)
  table.sort(t)
  return t
end

-- The module's keys in this state: before the lazy parts are touched,
-- then after.
local function keys_of(m)
  local before = {}
  for k in pairs(m) do before[#before + 1] = k end
  for _, k in ipairs(LAZY) do
    assert(m[k] ~= nil, "netrun." .. k .. " is missing")
  end
  local after = {}
  for k in pairs(m) do after[#after + 1] = k end
  table.sort(before)
  table.sort(after)
  return { before = before, after = after }
end

describe("the netrun module", function()
  local all = {}
  for _, k in ipairs(EAGER) do all[#all + 1] = k end
  for _, k in ipairs(LAZY) do all[#all + 1] = k end
  sorted(all)

  it("has exactly the public keys in the main state", function()
    local got = keys_of(netrun)
    for _, k in ipairs(got.before) do
      local public = false
      for _, p in ipairs(all) do public = public or p == k end
      assert(public, "netrun." .. k .. " is not public API (move it to netrun.core)")
    end
    assert.same(all, got.after)
  end)

  it("has exactly the public keys in a loop's state", function()
    local group = netrun.group { threads = 1, name = "module" }
    finally(function() H.shutdown(group) end)
    local res = H.sync(group:submit(function()
      local m = require "netrun"
      for _, k in ipairs(LAZY) do
        assert(m[k] ~= nil, "netrun." .. k .. " is missing on the loop")
      end
      local out = {}
      for k in pairs(m) do out[#out + 1] = k end
      table.sort(out)
      return out
    end))
    assert.same(all, res)
  end)

  it("keeps the internals in netrun.core, where the REPL and the tools reach them", function()
    local core = require "netrun.core"
    for _, k in ipairs { "repl_hangup", "repl_wait", "repl_mode", "readline", "term_raw",
                         "term_key", "exit_now", "forget_caches", "file_stamp", "groups",
                         "main_loop", "shutdown_all", "interrupted", "isatty", "getpid",
                         "getuid", "peer_credentials", "transfer", "http_stats",
                         "server_stats" } do
      assert.is_function(core[k], k)
      assert.is_nil(rawget(netrun, k), k)
    end
  end)
end)
