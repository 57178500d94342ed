-- message_paths_spec.lua -- every way of writing a message hands the same
-- message to the outbound handlers: ch:write, ch:write_and_flush,
-- ctx:write, ctx:write_and_flush, p:write and p:write_and_flush, called
-- from a task on the channel's loop, from a coroutine on that loop
-- (netrun.spawn, resumed after a sleep), from another loop and from the
-- main thread, with strings, arrays of strings and tables. Inbound values
-- fired by ctx and pipeline from a task or a coroutine reach the next
-- handler the same way. A probe handler describes each message it is given
-- and writes the description to the wire, where a LuaSocket peer reads it.
local H = require "spec.helper"
local netrun, socket = H.netrun, H.socket

-- What the probe writes for a message (copied into the loop's state).
local function show(m)
  local t = type(m)
  if t == "string" then return "s:" .. m end
  if t == "number" then return "n:" .. m end
  if t ~= "table" then return t end
  if m[1] ~= nil then return "a:" .. table.concat(m, ",") end
  return "t:" .. tostring(m.type) .. ":" .. tostring(m.data)
end

-- Describes each message it is given on the wire.
local Probe = {
  write = function(self, ctx, msg, p) ctx:write(show(msg) .. "\n", p) end,
}

local MESSAGES = {
  { "a string", "s:a string" },
  { { "ab", "cd", "e" }, "a:ab,cd,e" },
  { { type = "binary", data = "in a table" }, "t:binary:in a table" },
  { 42, "n:42" },
}

-- Write msg by `path` (on the channel's loop for ctx and p); returns the
-- write's future.
local function write(ch, path, msg)
  if path == "ch:write" then
    local f = ch:write(msg)
    ch:flush()
    return f
  elseif path == "ch:write_and_flush" then
    return ch:write_and_flush(msg)
  end
  local target = path:match("^ctx") and ch:pipeline():context("front") or ch:pipeline()
  if path:match(":write$") then
    local f = target:write(msg)
    target:flush()
    return f
  end
  return target:write_and_flush(msg)
end

-- The same, from a coroutine of the current loop after a sleep (so it runs
-- resumed from the loop, not from the call that spawned it); returns the
-- coroutine's future, done once the write's is.
local function write_in_coroutine(ch, path, msg, write)
  local nr = require "netrun"
  return nr.spawn(function()
    nr.sleep(0.01)
    write(ch, path, msg):await()
    return true
  end)
end

describe("message paths", function()
  local group, other, ch, peer
  setup(function()
    group = netrun.group { threads = 1, name = "paths" }
    other = netrun.group { threads = 1, name = "paths-other" }
    local srv = assert(socket.bind("127.0.0.1", 0))
    local _, port = srv:getsockname()
    local Sink = {
      channel_read = function(self, ctx, msg)
        ctx:write_and_flush("read " .. show(msg))
      end,
      user_event_triggered = function(self, ctx, evt)
        ctx:write_and_flush("event " .. show(evt))
      end,
    }
    ch = netrun.connect { group = group, host = "127.0.0.1", port = tonumber(port),
      timeout = 5, init = function(ch)
        ch:pipeline():add_last("probe", Probe)
        ch:pipeline():add_last("front", {})
        ch:pipeline():add_last("sink", Sink)
      end }:sync()
    srv:settimeout(5)
    peer = assert(srv:accept())
    peer:settimeout(5)
    srv:close()
  end)
  teardown(function()
    ch:close():sync()
    peer:close()
    H.shutdown(other)
    H.shutdown(group)
  end)

  local function line()
    local l, err = peer:receive("*l")
    assert(l, "the peer received nothing: " .. tostring(err))
    return l
  end

  local ON_LOOP = { "ch:write", "ch:write_and_flush", "ctx:write", "ctx:write_and_flush",
                    "p:write", "p:write_and_flush" }
  local OFF_LOOP = { "ch:write", "ch:write_and_flush" }

  -- Where a write is made: a function(path, msg) returning a future done
  -- once the write is.
  local WHERE = {
    { "a task on the loop", ON_LOOP, function(path, msg)
        return group:submit(write, ch, path, msg):sync() end },
    { "a coroutine on the loop", ON_LOOP, function(path, msg)
        return group:submit(write_in_coroutine, ch, path, msg, write):sync() end },
    { "a task on another loop", OFF_LOOP, function(path, msg)
        return other:submit(write, ch, path, msg):sync() end },
    { "a coroutine on another loop", OFF_LOOP, function(path, msg)
        return other:submit(write_in_coroutine, ch, path, msg, write):sync() end },
    { "the main thread", OFF_LOOP, function(path, msg) return write(ch, path, msg) end },
  }

  for _, where in ipairs(WHERE) do
    local name, paths, run = where[1], where[2], where[3]
    for _, path in ipairs(paths) do
      it(path .. " from " .. name .. " hands every message to the handlers", function()
        for _, m in ipairs(MESSAGES) do
          local f = run(path, m[1])
          assert.equal(m[2], line())
          H.sync(f)
          assert.is_true(f:is_success())
        end
      end)
    end
  end

  -- Inbound values fired from Lua (a task or a coroutine of the loop).
  local function fire(ch, how, msg)
    local p = ch:pipeline()
    if how == "ctx:fire_channel_read" then p:context("front"):fire_channel_read(msg)
    elseif how == "p:fire_channel_read" then p:fire_channel_read(msg)
    elseif how == "ctx:fire_user_event_triggered" then p:context("front"):fire_user_event_triggered(msg)
    else p:fire_user_event_triggered(msg) end
    return true
  end
  local function fire_in_coroutine(ch, how, msg, fire)
    local nr = require "netrun"
    return nr.spawn(function() nr.sleep(0.01); return fire(ch, how, msg) end)
  end

  for _, how in ipairs { "ctx:fire_channel_read", "p:fire_channel_read",
                         "ctx:fire_user_event_triggered", "p:fire_user_event_triggered" } do
    local prefix = how:match("read$") and "read " or "event "
    it(how .. " from a task and a coroutine hands every value to the next handler", function()
      for _, m in ipairs(MESSAGES) do
        group:submit(fire, ch, how, m[1]):sync()
        assert.equal("s:" .. prefix .. m[2], line())
        H.sync(group:submit(fire_in_coroutine, ch, how, m[1], fire):sync())
        assert.equal("s:" .. prefix .. m[2], line())
      end
    end)
  end

  it("a coroutine's messages reach a handler on an executor group", function()
    local blocking = netrun.executor_group { threads = 1, name = "paths-exec" }
    local srv = assert(socket.bind("127.0.0.1", 0))
    local _, port = srv:getsockname()
    local ch2 = netrun.connect { group = group, host = "127.0.0.1", port = tonumber(port),
      timeout = 5, init = function(c) c:pipeline():add_last(blocking, "probe", Probe) end }:sync()
    srv:settimeout(5)
    local p2 = assert(srv:accept())
    p2:settimeout(5)
    srv:close()
    for _, m in ipairs(MESSAGES) do
      H.sync(group:submit(write_in_coroutine, ch2, "ch:write_and_flush", m[1], write):sync())
      assert.equal(m[2], (assert(p2:receive("*l"))))
    end
    ch2:close():sync()
    p2:close()
    H.shutdown(blocking)
  end)
end)
