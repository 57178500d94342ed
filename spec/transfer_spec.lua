-- transfer_spec.lua -- DESIGN.md §3: values cross states by copy.
local H = require "spec.helper"
local netrun = H.netrun

describe("value transfer", function()
  local group
  setup(function() group = netrun.group { threads = 2, name = "xfer" } end)
  teardown(function() H.shutdown(group) end)

  -- Run fn(...) on a loop and bring its first result back.
  local function there(fn, ...) return group:submit(fn, ...):sync() end

  it("copies scalars and keeps integers and floats apart", function()
    local i, f, s, b = there(function(...) return ... end, 42), there(function(x) return x end, 1.0),
      there(function(x) return x end, "bytes\0inside"), there(function(x) return x end, false)
    assert.equal(42, i); assert.equal("integer", math.type(i))
    assert.equal(1.0, f); assert.equal("float", math.type(f))
    assert.equal("bytes\0inside", s)
    assert.is_false(b)
    assert.equal(math.maxinteger, there(function(x) return x end, math.maxinteger))
  end)

  it("deep-copies tables, keeping shared references and cycles", function()
    local shared = { "s" }
    local t = { a = shared, b = shared, n = { deep = { deeper = 3 } } }
    t.self = t
    local ok = there(function(x)
      return x.a == x.b and x.self == x and x.n.deep.deeper == 3 and x.a[1] == "s"
    end, t)
    assert.is_true(ok)
    local back = there(function(x) x.n.deep.deeper = 4; return x end, t)
    assert.equal(4, back.n.deep.deeper)
    assert.equal(3, t.n.deep.deeper)      -- a copy, not a share
    assert.equal(back, back.self)
  end)

  it("sends functions by bytecode with their upvalues copied", function()
    local base, tbl = 10, { 1, 2, 3 }
    local function add(x) return x + base + #tbl end
    assert.equal(15, there(function(f) return f(2) end, add))
    -- upvalues are copies: changing them there does not change them here
    local counter = 0
    local function bump() counter = counter + 1; return counter end
    assert.equal(1, there(function(f) return f() end, bump))
    assert.equal(0, counter)
  end)

  it("keeps recursion and mutual recursion working", function()
    local is_even, is_odd
    function is_even(n) if n == 0 then return true end return is_odd(n - 1) end
    function is_odd(n) if n == 0 then return false end return is_even(n - 1) end
    assert.is_true(there(function(f) return f(10) end, is_even))
    local function fact(n) return n <= 1 and 1 or n * fact(n - 1) end
    assert.equal(120, there(function(f) return f(5) end, fact))
  end)

  it("binds _ENV to the destination's globals", function()
    _G.only_here = "main"
    assert.equal("nil", there(function() return type(only_here) end))
    _G.only_here = nil
  end)

  it("sends modules and their functions by name", function()
    local fmt, json_like = string.format, string
    assert.equal("x=7", there(function() return fmt("x=%d", 7) end))
    assert.is_true(there(function() return json_like == string end))
    assert.equal("xfer-1", group:loops()[1]:submit(function() return netrun.current():name() end):sync())
  end)

  it("copies a table whose metatable is a module, with that metatable", function()
    local Point = require "point"              -- spec/fixtures/point.lua
    local pt = Point.new(3, 4)
    assert.equal(25, there(function(p) return p:norm2() end, pt))
    assert.is_true(there(function(p) return getmetatable(p) == require "point" end, pt))
  end)

  it("passes netrun handles by reference", function()
    local loop = group:loops()[2]
    assert.equal("xfer-2", there(function(l) return l:name() end, loop))
    local back = there(function(l) return l end, loop)
    assert.equal(loop, back)                  -- one proxy per state
    local p = netrun.promise()
    there(function(pp) pp:set_success("from a loop") end, p)
    assert.equal("from a loop", p:sync())
  end)

  it("names the path of what cannot be transferred", function()
    local db = io.stdout
    local function init() return db end
    local ok, err = pcall(group.execute, group, init)
    assert.is_false(ok)
    assert.matches("cannot transfer userdata %(upvalue 'db' of the function given to execute%)", err)
    ok, err = pcall(group.submit, group, function(x) return x end, { conn = { co = coroutine.create(print) } })
    assert.is_false(ok)
    assert.matches("cannot transfer thread %(field 'co' of field 'conn' of argument 1 of submit%)", err)
    local f = require("netrun.core").transfer(function() return 1 end)   -- the same state
    assert.equal(1, f())
  end)

  it("copies native handler configurations, so init may use them as upvalues", function()
    local line = netrun.codec.line { max_length = 4 }
    local http = netrun.codec.http_server { max_body = 10 }
    local got = group:submit(function(a, b)
      local ch = netrun.embedded(a)            -- a fresh line codec, in this state
      local ok, err = pcall(ch.write_inbound, ch, "ok\nlonger than four\nno\n")
      local frames = {}
      for f in function() return ch:read_inbound() end do frames[#frames + 1] = f end
      ch:finish()
      return { tostring(a), tostring(b), frames, ok, err }
    end, line, http):sync()
    assert.matches("line", got[1])
    assert.matches("http_server", got[2])
    assert.same({ "ok", "no" }, got[3])
    assert.is_false(got[4])
    assert.matches("frame of more than 4 bytes", got[5])
  end)

  -- Within one blob, closures that share an upvalue in the source share one
  -- copy of it in the destination (tables always did: they keep identity).
  it("keeps a non-table upvalue shared between closures sent together", function()
    local count = 0
    local function bump() count = count + 1 end
    local function read() return count end
    assert.same({ 0, 3 }, there(function(inc, get)
      local before = get()
      inc(); inc(); inc()
      return { before, get() }
    end, bump, read))
    assert.equal(0, count)                    -- still a copy of the source's
    -- closures of one prototype sharing a variable, reached through a table
    local n, fs = 10, {}
    for i = 1, 2 do fs[i] = function(d) n = n + d; return n end end
    assert.same({ 11, 13 }, there(function(t) return { t[1](1), t[2](2) } end, fs))
  end)

  it("keeps a handler's methods sharing the locals they capture", function()
    local pending, reads = "", 0
    local Handler = {}
    function Handler.channel_read(ctx, msg) pending = pending .. msg; reads = reads + 1 end
    function Handler.channel_read_complete(ctx)
      local batch = pending
      pending = ""
      ctx[#ctx + 1] = batch .. "/" .. reads
    end
    assert.same({ "ab/2", "c/3" }, there(function(h)
      local ctx = {}
      h.channel_read(ctx, "a"); h.channel_read(ctx, "b"); h.channel_read_complete(ctx)
      h.channel_read(ctx, "c"); h.channel_read_complete(ctx)
      return ctx
    end, Handler))
    -- netrun.core.transfer packs and unpacks in this state: one blob too
    local sum = 0
    local Acc = {}
    function Acc.add(x) sum = sum + x end
    function Acc.get() return sum end
    local copy = require("netrun.core").transfer(Acc)
    copy.add(2); copy.add(3)
    assert.equal(5, copy.get())
    assert.equal(0, sum)
  end)

  it("keeps mutual recursion over shared upvalues working", function()
    local depth = 0
    local ping, pong
    function ping(n) depth = depth + 1; if n == 0 then return depth end return pong(n - 1) end
    function pong(n) depth = depth + 1; if n == 0 then return -depth end return ping(n - 1) end
    assert.equal(-6, there(function(a) return a(5) end, ping))
    assert.same({ 5, -10 }, there(function(a, b) return { a(4), b(4) } end, ping, pong))
    assert.equal(0, depth)
  end)

  it("does not share upvalues with a copy sent in an earlier blob", function()
    local l1 = group:loops()[1]
    local count = 0
    local function bump() count = count + 1; return count end
    local function read() return count end
    local function pure() return "pure" end   -- cached there: one closure
    assert.equal(2, l1:submit(function(inc, get, p)
      _G.first_inc, _G.first_get, _G.first_pure = inc, get, p
      inc(); inc()
      return get()
    end, bump, read, pure):sync())
    -- the same functions again, to the same loop: a fresh shared copy
    assert.same({ 1, 1, 3, 3, false, true }, l1:submit(function(inc, get, p)
      local r = { inc(), get(), _G.first_inc(), _G.first_get(), inc == _G.first_inc,
        p == _G.first_pure }
      _G.first_inc, _G.first_get, _G.first_pure = nil, nil, nil
      return r
    end, bump, read, pure):sync())
    assert.equal(0, count)
  end)

  it("caches compiled functions: the same function arrives as the same closure", function()
    local function pure() return "pure" end
    local same = group:loops()[1]:submit(function(a, b) return a == b and a() end, pure, pure):sync()
    assert.equal("pure", same)
    local l1 = group:loops()[1]
    l1:submit(function(f) _G.kept = f end, pure):sync()
    assert.is_true(l1:submit(function(f) return _G.kept == f end, pure):sync())
  end)

  it("keeps memory flat when ever new functions are sent (the caches are bounded)", function()
    local l1 = group:loops()[1]
    local hot = function() return "hot" end
    local function send(from, to)
      local fs = {}
      for i = from, to do
        local f = load("return function(x) return x + " .. i .. " end")()
        fs[#fs + 1] = l1:submit(f, 1)
        if i % 500 == 0 then assert.equal("hot", l1:submit(hot):sync()) end
        if #fs == 1000 then for _, x in ipairs(fs) do x:sync() end fs = {} end
      end
      for _, x in ipairs(fs) do x:sync() end
      collectgarbage(); collectgarbage()
      return l1:submit(function()
        collectgarbage(); collectgarbage()
        return netrun.current():stats().lua_memory
      end):sync()
    end
    local before = send(1, 2000)
    local rss = H.rss()
    local after = send(2001, 32000)              -- 30,000 distinct functions
    local grown, rgrown = after - before, H.rss() - rss
    assert.is_true(grown < 1 << 20, "the loop's Lua memory grew by " .. grown .. " bytes")
    if not H.sanitized then
      assert.is_true(rgrown < 6144, "RSS grew by " .. rgrown .. " KiB")  -- 9.2 MB unbounded
    end
    -- a function sent often stays cached: the same closure
    l1:submit(function(f) _G.hot = f end, hot):sync()
    assert.is_true(l1:submit(function(f) return _G.hot == f end, hot):sync())
  end)
end)
