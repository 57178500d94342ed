-- pipeline_spec.lua -- DESIGN.md §4 "Handlers and pipelines": events in
-- order, pipeline edits, fire_* starting points, outbound interception,
-- handler objects, errors, and handlers on an executor group.
local H = require "spec.helper"
local netrun = H.netrun

-- A server whose init hands each accepted channel to the main thread.
local function accepting_server(group, init)
  local accepted = {}
  for i = 1, 4 do accepted[i] = netrun.promise() end
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0,
    init = function(ch)
      if init then init(ch) end
      for _, p in ipairs(accepted) do
        if p:try_success(ch) then return end
      end
    end,
  }:sync()
  local _, port = server:local_address()
  return server, port, accepted
end

-- Run fn(pipeline, channel) on the channel's loop and return its result.
local function on_loop(ch, fn, ...)
  return ch:loop():submit(function(c, f, ...) return f(c:pipeline(), c, ...) end, ch, fn, ...):sync()
end

describe("pipelines", function()
  local group
  setup(function() group = netrun.group { threads = 2, name = "pipe" } end)
  teardown(function() H.shutdown(group) end)

  it("delivers every inbound event in order", function()
    local report = netrun.promise()
    local Recorder = {}
    for _, ev in ipairs { "handler_added", "channel_registered", "channel_active", "channel_read_complete",
                          "channel_inactive", "channel_unregistered" } do
      Recorder[ev] = function(self, ctx) table.insert(self.events, ev) end
    end
    function Recorder:channel_read(ctx, msg)
      table.insert(self.events, "channel_read")
      ctx:write_and_flush(msg)
    end
    function Recorder:handler_removed(ctx)
      table.insert(self.events, "handler_removed")
      self.report:set_success(self.events)
    end
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("rec", setmetatable({ events = {}, report = report }, { __index = Recorder }))
      end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    c:send("hello")
    assert.equal("hello", H.recv(c, 5))
    c:close()
    local ev = report:sync()
    local expect = { "handler_added", "channel_registered", "channel_active", "channel_read",
                     "channel_read_complete", "channel_inactive", "channel_unregistered", "handler_removed" }
    -- one read may arrive as several: collapse repeats of read/read_complete
    local squashed = {}
    for _, e in ipairs(ev) do
      if squashed[#squashed] ~= e then squashed[#squashed + 1] = e end
    end
    assert.same(expect, squashed)
    server:close():sync()
  end)

  it("adds, finds, removes and replaces handlers by name and by value", function()
    local server, port, accepted = accepting_server(group)
    local c = H.client(port)
    local ch = accepted[1]:sync()
    local r = on_loop(ch, function(p)
      local A, B, C, D = { n = "A" }, { n = "B" }, { n = "C" }, { n = "D" }
      p:add_last("b", B)
      p:add_first("a", A)
      p:add_last("d", D)
      p:add_before("d", "c", C)
      local out = { names = p:names() }
      out.get = p:get("c").n
      out.first, out.last = p:first().n, p:last().n
      local ctx = p:context("b")
      out.ctx = { ctx.name, ctx.handler.n, ctx.channel == p:channel(), tostring(ctx) }
      out.after = p:add_after("a", "a2", { n = "A2" }) == p
      out.names2 = p:names()
      out.removed = p:remove("a2").n
      out.removed_by_value = p:remove(D).n
      out.replaced = p:replace("b", "b2", { n = "B2" }).n
      out.names3 = p:names()
      out.missing = p:get("zzz")
      out.errors = {}
      for _, f in ipairs {
        function() p:add_last("a", {}) end,
        function() p:add_before("nope", "x", {}) end,
        function() p:remove("nope") end,
        function() p:replace("nope", "x", {}) end,
        function() p:add_last("x", 42) end,
        function() p:context("nope").name = 1 end,
      } do
        local ok, err = pcall(f)
        out.errors[#out.errors + 1] = ok and "no error" or tostring(err)
      end
      return out
    end)
    assert.same({ "a", "b", "c", "d" }, r.names)
    assert.equal("C", r.get)
    assert.equal("A", r.first); assert.equal("D", r.last)
    assert.same({ "b", "B", true }, { r.ctx[1], r.ctx[2], r.ctx[3] })
    assert.matches("netrun.ctx%(b%)", r.ctx[4])
    assert.is_true(r.after)
    assert.same({ "a", "a2", "b", "c", "d" }, r.names2)
    assert.equal("A2", r.removed)
    assert.equal("D", r.removed_by_value)
    assert.equal("B", r.replaced)
    assert.same({ "a", "b2", "c" }, r.names3)
    assert.is_nil(r.missing)
    assert.matches("duplicate handler name 'a'", r.errors[1])
    assert.matches("no handler named 'nope' in the pipeline", r.errors[2])
    assert.matches("no such handler in the pipeline: nope", r.errors[3])
    assert.matches("no such handler in the pipeline: nope", r.errors[4])
    assert.matches("a handler must be a table or an object, got a number", r.errors[5])
    assert.is_not.equal("no error", r.errors[6])
    -- the pipeline may be changed only on the channel's loop
    assert.has_error(function() ch:pipeline():add_last("x", {}) end)
    c:close()
    server:close():sync()
  end)

  it("ctx:fire_* start at the next handler, p:fire_* at the head", function()
    local server, port, accepted = accepting_server(group)
    local c = H.client(port)
    local ch = accepted[1]:sync()
    local r = on_loop(ch, function(p)
      _G.trace = {}
      local function tracer(name)
        return {
          channel_read = function(self, ctx, msg)
            table.insert(_G.trace, name .. ":" .. tostring(msg))
            if name ~= "c" then ctx:fire_channel_read(msg .. name) end
          end,
          user_event_triggered = function(self, ctx, evt)
            table.insert(_G.trace, name .. "!" .. evt.kind)
            ctx:fire_user_event_triggered(evt)
          end,
          channel_active = function(self, ctx)
            table.insert(_G.trace, name .. "+active")
            ctx:fire_channel_active()
          end,
        }
      end
      p:add_last("a", tracer("a")); p:add_last("b", tracer("b")); p:add_last("c", tracer("c"))
      p:fire_channel_read("m")
      p:context("a"):fire_channel_read("n")
      p:context("b"):fire_user_event_triggered({ kind = "tick" })
      p:context("a"):fire_channel_active()
      -- an event to fire must be given, from a ctx or the pipeline alike
      local e1 = select(2, pcall(p.fire_user_event_triggered, p))
      local e2 = select(2, pcall(function() p:context("a"):fire_user_event_triggered() end))
      table.insert(_G.trace, tostring(e1):match("value expected") or tostring(e1))
      table.insert(_G.trace, tostring(e2):match("value expected") or tostring(e2))
      return _G.trace
    end)
    assert.same({ "a:m", "b:ma", "c:mab", "b:n", "c:nb", "c!tick", "b+active", "c+active",
                  "value expected", "value expected" }, r)
    c:close()
    server:close():sync()
  end)

  it("a handler gets one ctx, the one p:context returns, made only when needed", function()
    local server, port, accepted = accepting_server(group)
    local c = H.client(port)
    local ch = accepted[1]:sync()
    local r = on_loop(ch, function(p)
      local seen = {}
      p:add_last("h", { channel_read = function(self, ctx, msg) seen[#seen + 1] = ctx end })
      p:fire_channel_read("1")
      local first = p:context("h")
      p:fire_channel_read("2")
      p:add_last("late", {})
      local late = p:context("late")
      return { seen[1] == first, seen[2] == first, late == p:context("late"),
               late.name, first.name, first.write == late.write }
    end)
    assert.same({ true, true, true, "late", "h", true }, r)
    c:close()
    server:close():sync()
  end)

  it("gives a channel one pipeline object, which outlives its channel safely", function()
    local server, port, accepted = accepting_server(group)
    local c = H.client(port)
    local ch = accepted[1]:sync()
    local r = on_loop(ch, function(p, chan)
      p:add_last("h", {})
      local ctx = p:context("h")
      local same = { p == chan:pipeline(), p == ctx.pipeline, p:channel() == chan }
      -- held past the channel's close and a full collection of the handle cache
      _G.kept_pipeline, _G.kept_ctx = p, ctx
      return same
    end)
    assert.same({ true, true, true }, r)
    c:close()
    ch:close_future():sync()
    local after = ch:loop():submit(function()
      local p, ctx = _G.kept_pipeline, _G.kept_ctx
      _G.kept_pipeline, _G.kept_ctx = nil, nil
      collectgarbage(); collectgarbage()
      local names = p:names()
      -- its handler was removed: no handler (its state is freed: ASan saw a
      -- use after free here), and a write fails its future
      local handler, name = ctx.handler, ctx.name
      local f = ctx:write_and_flush("late")
      local wrote = f:is_done() and not f:is_success() and tostring(f:cause()):match("closed channel") ~= nil
      -- nothing would ever remove a handler added now (it leaked before)
      local ok, err = pcall(p.add_last, p, "x", {})
      return { #names, tostring(p):match("channel %d+") ~= nil, ok, err:match("channel is closed") ~= nil,
               handler == nil, name, wrote }
    end):sync()
    assert.same({ 0, true, false, true, true, "h", true }, after)
    server:close():sync()
  end)

  it("outbound handlers intercept write, flush and close", function()
    local server, port, accepted = accepting_server(group, function(ch)
      ch:pipeline():add_last("upper", {
        write = function(self, ctx, msg, promise)
          table.insert(_G.out, "write")
          ctx:write(msg:upper(), promise)
        end,
        flush = function(self, ctx) table.insert(_G.out, "flush"); ctx:flush() end,
        close = function(self, ctx, promise) table.insert(_G.out, "close"); ctx:close(promise) end,
      })
      _G.out = {}
    end)
    local c = H.client(port)
    local ch = accepted[1]:sync()
    ch:write_and_flush("abc"):sync()           -- from the main thread: starts at the tail
    assert.equal("ABC", H.recv(c, 3))
    local r = on_loop(ch, function(p)
      -- a handler before "upper" writes past it, one after goes through it
      p:add_first("raw", {})
      p:add_last("after", {})
      p:context("raw"):write_and_flush("raw")
      p:context("after"):write_and_flush("via")
      p:write("tail"); p:flush()
      return _G.out
    end)
    assert.equal("rawVIATAIL", H.recv(c, 10))
    -- main's write_and_flush, "after"'s write_and_flush, then p:write and p:flush
    assert.same({ "write", "flush", "write", "flush", "write", "flush" }, r)
    ch:close():sync()
    local out = ch:loop():submit(function() return _G.out end):sync()
    assert.equal("close", out[#out])
    c:close()
    server:close():sync()
  end)

  it("calls methods that come through a metatable __index", function()
    local Echo = {}
    Echo.__index = Echo
    function Echo.new(prefix) return setmetatable({ prefix = prefix }, Echo) end
    function Echo:channel_read(ctx, msg) ctx:write(self.prefix .. msg) end
    function Echo:channel_read_complete(ctx) ctx:flush() end
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch) ch:pipeline():add_last("obj", Echo.new("obj:")) end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    c:send("x")
    assert.equal("obj:x", H.recv(c, 5))
    c:close()
    server:close():sync()
  end)

  it("delivers an error raised in a handler to its own exception_caught, with a traceback", function()
    local caught = netrun.promise()
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("first", {
          exception_caught = function(self, ctx, err) caught:try_failure("wrong handler: " .. err) end,
        })
        ch:pipeline():add_last("boom", {
          channel_read = function(self, ctx, msg) error("bad input " .. msg) end,
          exception_caught = function(self, ctx, err)
            caught:try_success({ ctx.name, err })
            ctx:write_and_flush("sorry\n")
          end,
        })
      end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    c:send("q")
    local r = caught:sync()
    assert.equal("boom", r[1])
    assert.matches("bad input q", r[2])
    assert.matches("stack traceback", r[2])
    assert.equal("sorry", c:receive("*l"))      -- the channel lives on
    c:close()
    server:close():sync()
  end)

  it("passes an exception on to the next handler that has exception_caught", function()
    local caught = netrun.promise()
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("boom", { channel_read = function() error("pass it on") end })
        ch:pipeline():add_last("middle", {})
        ch:pipeline():add_last("catch", {
          exception_caught = function(self, ctx, err) caught:try_success(err) end,
        })
      end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    c:send("q")
    assert.matches("pass it on", caught:sync())
    c:close()
    server:close():sync()
  end)

  it("runs a handler added with an executor group on that group's threads", function()
    local blocking = netrun.executor_group { threads = 2, name = "hblock" }
    local seen, removed = netrun.promise(), netrun.promise()
    local Slow = {}
    for _, ev in ipairs { "handler_added", "channel_registered", "channel_inactive", "channel_unregistered" } do
      Slow[ev] = function(self, ctx) table.insert(self.events, ev) end
    end
    function Slow:channel_active(ctx)
      table.insert(self.events, "channel_active")
      ctx:fire_channel_active()
    end
    function Slow:channel_read(ctx, msg)
      table.insert(self.events, "channel_read")
      if msg == "fail" then error("slow failed") end
      -- an executor thread may block: wait for work done on a loop
      local n = self.group:submit(function(m) return #m end, msg):sync()
      seen:try_success({ netrun.current():name(), msg, ctx.name, ctx:loop():name() })
      ctx:write_and_flush("direct:" .. msg .. ":" .. n .. "\n")
      ctx:fire_channel_read(msg:upper())            -- on to "after", on the channel's loop
    end
    function Slow:exception_caught(ctx, err)
      ctx:write_and_flush("caught:" .. tostring(err:match("slow failed")) .. "\n")
    end
    function Slow:handler_removed(ctx)
      table.insert(self.events, "handler_removed")
      self.removed:set_success(self.events)
    end
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        -- lines: "job" and "fail" are two messages however TCP splits them
        ch:pipeline():add_last("line", netrun.codec.line {})
        ch:pipeline():add_last(blocking, "slow",
          setmetatable({ events = {}, removed = removed, group = group }, { __index = Slow }))
        ch:pipeline():add_last("after", {
          channel_read = function(self, ctx, msg)
            ctx:write_and_flush("after:" .. msg .. ":" .. netrun.current():name() .. "\n")
          end,
        })
      end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    c:send("job\n")
    local r = H.sync(seen, 5)
    assert.matches("^hblock%-%d$", r[1])
    assert.same({ "job", "slow", r[1] }, { r[2], r[3], r[4] })
    assert.equal("direct:job:3", c:receive("*l"))
    assert.matches("^after:JOB:pipe%-%d$", c:receive("*l"))
    c:send("fail\n")
    assert.equal("caught:slow failed", c:receive("*l"))
    c:close()
    assert.same({ "handler_added", "channel_registered", "channel_active", "channel_read", "channel_read",
                  "channel_inactive", "channel_unregistered", "handler_removed" }, H.sync(removed, 5))
    -- the handler is checked when it is added, like any other
    local ch = netrun.connect { group = group, host = "127.0.0.1", port = port }:sync()
    local err = ch:loop():submit(function(c2, ex)
      return select(2, pcall(c2:pipeline().add_last, c2:pipeline(), ex, "bad", 42))
    end, ch, blocking):sync()
    assert.matches("a handler must be a table or an object, got a number", err)
    ch:close():sync()
    server:close():sync()
    H.shutdown(blocking)
  end)

  it("finds, names and removes a handler on an executor group like any other", function()
    local blocking = netrun.executor_group { threads = 1, name = "hrm" }
    local server, port, accepted = accepting_server(group)
    local c = H.client(port)
    local ch = accepted[1]:sync()
    local removed = netrun.promise()
    local r = on_loop(ch, function(p, _, ex, rm)
      local h = { tag = "x", handler_removed = function(self, ctx) rm:set_success(netrun.current():name()) end }
      p:add_last(ex, "x", h)
      p:add_last("y", {})
      local out = { names = p:names(), same = p:get("x") == h, first = p:first() == h }
      out.removed = p:remove(h) == h
      out.names2 = p:names()
      return out
    end, blocking, removed)
    assert.same({ names = { "x", "y" }, same = true, first = true, removed = true, names2 = { "y" } }, r)
    assert.equal("hrm-1", H.sync(removed, 5))
    c:close()
    server:close():sync()
    H.shutdown(blocking)
  end)

  it("reports a handler that cannot be loaded on its executor to the next handler", function()
    local blocking = netrun.executor_group { threads = 1, name = "hbad" }
    local caught = netrun.promise()
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        -- a module only the channel's loop has: it travels by name, and
        -- require fails on the executor
        package.loaded.loop_only = package.loaded.loop_only or { v = 1 }
        local M = package.loaded.loop_only
        ch:pipeline():add_last(blocking, "h", { channel_read = function() return M.v end })
        ch:pipeline():add_last("catch", {
          exception_caught = function(self, ctx, err) caught:try_success(err) end,
        })
      end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    assert.matches("module 'loop_only' not found", H.sync(caught, 5))
    c:close()
    server:close():sync()
    H.shutdown(blocking)
  end)

  it("lets a handler on an executor group intercept writes and closes", function()
    local blocking = netrun.executor_group { threads = 1, name = "hout" }
    local closed = netrun.promise()
    local server, port, accepted = accepting_server(group, function(ch)
      ch:pipeline():add_last(blocking, "frame", {
        write = function(self, ctx, msg, promise)
          ctx:write("<" .. msg .. "@" .. netrun.current():name() .. ">", promise)
        end,
        close = function(self, ctx, promise)
          closed:set_success(netrun.current():name())
          ctx:write_and_flush("bye")
          ctx:close(promise)
        end,
      })
    end)
    local c = H.client(port)
    local ch = accepted[1]:sync()
    H.sync(ch:write_and_flush("m"), 5)
    assert.equal("<m@hout-1>", H.recv(c, 10))
    H.sync(ch:close(), 5)
    assert.equal("hout-1", closed:sync())
    assert.equal("bye", H.recv(c, 3))
    local data, err = c:receive(1)
    assert.is_nil(data); assert.equal("closed", err)
    c:close()
    server:close():sync()
    H.shutdown(blocking)
  end)
end)
