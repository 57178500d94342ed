-- lua_memory_spec.lua -- a loop state's Lua memory is bounded (the group
-- option lua_memory_limit, lstate.c "the memory limit"): code that would
-- take it past the limit gets "not enough memory" -- a task fails its
-- future, a handler's error reaches its exception_caught -- and the loop
-- lives on.
local H = require "spec.helper"
local netrun = H.netrun

describe("lua_memory_limit", function()
  local group, loop
  setup(function()
    group = netrun.group { threads = 1, name = "lmem", lua_memory_limit = 16 << 20 }
    loop = group:next()
  end)
  teardown(function() H.shutdown(group) end)

  local function memory()
    return loop:submit(function()
      collectgarbage(); collectgarbage()
      return netrun.current():stats().lua_memory
    end):sync()
  end

  it("fails a task that allocates past it, and the loop runs the next", function()
    -- 4 M integers are 64 MiB of table
    local f = loop:submit(function() local t = {} for i = 1, 4e6 do t[i] = i end return #t end)
    assert.has_error(function() H.sync(f) end, "not enough memory")
    assert.equal("alive", loop:submit(function() return "alive" end):sync())
    -- memory kept in a global stays under the limit, and the state goes on
    f = loop:submit(function()
      _G.kept = {}
      for i = 1, 1e6 do _G.kept[i] = ("x"):rep(64) .. i end
    end)
    assert.has_error(function() H.sync(f) end, "not enough memory")
    assert.is_true(memory() <= 16 << 20)
    assert.is_true(loop:submit(function() return #_G.kept end):sync() > 0)
    loop:submit(function() _G.kept = nil end):sync()
    -- a spawned coroutine is bounded too
    local co = loop:submit(function()
      return netrun.spawn(function() local t = {} for i = 1, 4e6 do t[i] = i end end)
    end):sync()
    assert.has_error(function() H.sync(co) end)
    assert.matches("not enough memory", co:cause())
  end)

  it("gives a handler's error to its exception_caught, and serves the channel on", function()
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("line", netrun.codec.line {})
        ch:pipeline():add_last("app", {
          channel_read = function(_, ctx, line)
            if line == "grow" then
              local t = {}
              for i = 1, 4e6 do t[i] = i end
            end
            ctx:write_and_flush(line == "ping" and "pong\n" or "done\n")
          end,
          exception_caught = function(_, ctx, err)
            ctx:write_and_flush("caught: " .. tostring(err) .. "\n")
          end,
        })
      end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    c:send("grow\nping\n")
    assert.equal("caught: not enough memory", c:receive("*l"))
    assert.equal("pong", c:receive("*l"))
    c:close()
    server:close():sync()
  end)

  it("is checked, and 0 turns it off", function()
    assert.has_error(function() netrun.group { lua_memory_limit = 1000 } end,
      "netrun.group: lua_memory_limit must be 0 (none) or a size of at least 1048576 bytes, got 1000")
    local g = netrun.group { threads = 1, name = "lmem-off", lua_memory_limit = 0 }
    assert.equal(4e6, g:next():submit(function()
      local t = {} for i = 1, 4e6 do t[i] = i end return #t
    end):sync())
    H.shutdown(g)
  end)
end)
