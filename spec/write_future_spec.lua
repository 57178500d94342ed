-- write_future_spec.lua -- the futures of ctx:write. Writes of strings that
-- go straight to the socket get lazy futures (no promise until used); these
-- specs check they behave like any future: success once the bytes are
-- written, failure when they are dropped, usable after the fact, and
-- transferable to another state.
local H = require "spec.helper"
local netrun = H.netrun

describe("write futures", function()
  local group
  setup(function() group = netrun.group { threads = 1, name = "wf" } end)
  teardown(function() H.shutdown(group) end)

  -- A server whose handler runs `scenario(ctx, msg, report)` on the first
  -- read; report(value) completes the spec's promise (from the loop).
  local function serve(scenario)
    local done = netrun.promise()
    local handler = {
      channel_read = function(self, ctx, msg) scenario(ctx, msg, done) end,
    }
    local server, port = H.echo_server(group, handler)
    return server, port, done
  end

  it("succeed once flushed bytes are written, observed before and after", function()
    local server, port, done = serve(function(ctx, msg, report)
      local early = ctx:write("a")
      local states = { early:is_done() }                 -- not flushed: pending
      local late = ctx:write_and_flush("b")
      early:add_listener(function(f)
        states[#states + 1] = f:is_success()
        late:add_listener(function(g)
          states[#states + 1] = g:is_success()
          states[#states + 1] = ctx:write_and_flush("c"):is_done() -- fresh, may still be pending
          report:set_success(states)
        end)
      end)
    end)
    local c = H.client(port)
    c:send("x")
    assert.equal("abc", H.recv(c, 3))
    local states = done:sync()
    assert.same({ false, true, true }, { states[1], states[2], states[3] })
    c:close()
    server:close():sync()
  end)

  it("fail when the channel closes before they are flushed", function()
    local server, port, done = serve(function(ctx, msg, report)
      local f = ctx:write("never flushed")
      ctx:close():add_listener(function()
        report:set_success({ f:is_done(), f:is_success(), tostring(f:cause()) })
      end)
    end)
    local c = H.client(port)
    c:send("x")
    local r = done:sync()
    assert.is_true(r[1])
    assert.is_false(r[2])
    assert.matches("closed", r[3])
    c:close()
    server:close():sync()
  end)

  it("fail when used only after the write was dropped", function()
    local server, port, done = serve(function(ctx, msg, report)
      local f = ctx:write("dropped")
      ctx:close()
      netrun.current():execute(function()     -- long after the close
        report:set_success({ f:is_done(), f:is_success() })
      end)
    end)
    local c = H.client(port)
    c:send("x")
    assert.same({ true, false }, done:sync())
    c:close()
    server:close():sync()
  end)

  it("travel to another state as futures", function()
    local server, port, done = serve(function(ctx, msg, report)
      local f = ctx:write_and_flush("sent")
      report:set_success(f)                     -- transferred to the main state
    end)
    local c = H.client(port)
    c:send("x")
    assert.equal("sent", H.recv(c, 4))
    local f = done:sync()
    f:sync()
    assert.is_true(f:is_success())
    c:close()
    server:close():sync()
  end)

  it("keep order with futures of writes through other paths", function()
    local server, port, done = serve(function(ctx, msg, report)
      local order = {}
      local a = ctx:write("1")
      local b = ctx:write({ "2", "3" })         -- an array: a real future
      local c = ctx:write("4")
      c:add_listener(function() order[#order + 1] = "c" end)
      a:add_listener(function() order[#order + 1] = "a" end)
      b:add_listener(function()
        order[#order + 1] = "b"
      end)
      ctx:flush()
      c:add_listener(function() report:set_success(order) end)
    end)
    local cl = H.client(port)
    cl:send("x")
    assert.equal("1234", H.recv(cl, 4))
    -- c was watched first, yet completes last: watches are kept in order
    assert.same({ "a", "b", "c" }, done:sync())
    cl:close()
    server:close():sync()
  end)

  it("stay lazy through synchronous encoders, and fail once with exception_caught", function()
    local done = netrun.promise()
    local App = {}
    function App:channel_read(ctx, msg)
      local ok = ctx:write_and_flush("framed")            -- through length_prepender
      local bad = ctx:write({ not_bytes = true })          -- the head cannot send a table
      ok:add_listener(function(f)
        done:try_success({ f:is_success(), bad:is_done(), bad:is_success(), self.errors or 0 })
      end)
    end
    function App:exception_caught(ctx, err) self.errors = (self.errors or 0) + 1 end
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("prepend", netrun.codec.length_prepender { length = 2 })
        ch:pipeline():add_last("app", setmetatable({}, { __index = App }))
      end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    c:send("x")
    assert.equal("\0\6framed", H.recv(c, 8))
    assert.same({ true, true, false, 1 }, done:sync())
    c:close()
    server:close():sync()
  end)

  it("are none with the void promise: writes return it, failures go to exception_caught", function()
    local VOID = netrun.void_promise()          -- an upvalue: crosses to the loop
    local done = netrun.promise()
    local App = {}
    function App:channel_read(ctx, msg)
      local a = ctx:write("sent", VOID)
      local b = ctx:write({ not_bytes = true }, ctx:void_promise())  -- fails
      ctx:flush()
      local ok, err = pcall(function() return a:add_listener(print) end)
      done:try_success({ rawequal(a, VOID), rawequal(b, VOID), a:is_void(),
                         a:is_done(), ok, tostring(err), self.errors or 0,
                         ctx:write_and_flush("!", VOID) == VOID, VOID })
    end
    function App:exception_caught(ctx, err) self.errors = (self.errors or 0) + 1 end
    local server, port = H.echo_server(group, App)
    local c = H.client(port)
    c:send("x")
    assert.equal("sent!", H.recv(c, 5))
    local r = done:sync()
    assert.same({ true, true, true, false, false }, { r[1], r[2], r[3], r[4], r[5] })
    assert.matches("add_listener: a void promise never completes", r[6])
    assert.equal(1, r[7])
    assert.is_true(r[8])
    assert.equal(VOID, r[9])                     -- back in this state: the same value
    c:close()
    server:close():sync()
  end)

  it("the void promise cannot be waited on, and setting it does nothing", function()
    local VOID = netrun.void_promise()
    assert.equal("netrun.future(void)", tostring(VOID))
    assert.is_false(netrun.promise():is_void())
    assert.equal(VOID, VOID:set_success(1))
    assert.equal(VOID, VOID:set_failure("x"))
    assert.is_false(VOID:try_success(1))
    assert.is_false(VOID:cancel())
    assert.is_false(VOID:is_done())
    assert.is_nil(VOID:result())
    assert.has_error(function() VOID:sync() end,
      "sync: a void promise never completes (pass a promise of your own, or none, to get a future)")
    assert.has_error(function() VOID:await() end)
  end)

  it("close with the void promise", function()
    local done = netrun.promise()
    local server, port = H.echo_server(group, {
      channel_read = function(self, ctx, msg)
        local f = ctx:close(ctx:void_promise())
        ctx.channel:close_future():add_listener(function()
          done:try_success(f:is_void())
        end)
      end,
    })
    local c = H.client(port)
    c:send("x")
    assert.is_true(done:sync())
    c:close()
    server:close():sync()
  end)
end)
