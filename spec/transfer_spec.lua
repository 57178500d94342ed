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
    local f = netrun.transfer(function() return 1 end)   -- the same state
    assert.equal(1, f())
  end)

  it("caches compiled functions: the same function arrives as the same closure", function()
    local function pure() return "pure" end
    local same = group:loops()[1]:submit(function(a, b) return a == b and a() end, pure, pure):sync()
    assert.equal("pure", same)
    local l1 = group:loops()[1]
    l1:submit(function(f) _G.kept = f end, pure):sync()
    assert.is_true(l1:submit(function(f) return _G.kept == f end, pure):sync())
  end)
end)
