-- dict_spec.lua -- netrun.shared.dict (DESIGN.md §4 "Batteries"): one
-- thread-safe dictionary per name, shared by every state.
local H = require "spec.helper"
local netrun = H.netrun

describe("netrun.shared.dict", function()
  local group
  setup(function() group = netrun.group { threads = 3, name = "dict" } end)
  teardown(function() H.shutdown(group) end)

  it("gets and sets strings, integers, floats and booleans as they were", function()
    local d = netrun.shared.dict("basic")
    d:flush_all()
    assert.is_true(d:set("s", "bytes\0inside"))
    assert.is_true(d:set("i", 42))
    assert.is_true(d:set("f", 42.0))
    assert.is_true(d:set("b", false))
    assert.equal("bytes\0inside", d:get("s"))
    assert.equal("integer", math.type(d:get("i")))
    assert.equal("float", math.type(d:get("f")))
    assert.is_false(d:get("b"))
    assert.is_nil(d:get("absent"))
    assert.is_true(d:set("s", "replaced"))
    assert.equal("replaced", d:get("s"))
    assert.equal(4, #d)
    assert.matches("netrun.dict%(basic%)", tostring(d))
    assert.has_error(function() d:set("t", {}) end,
      "shared dict values must be strings, numbers or booleans, not table")
    assert.has_error(function() d:get({}) end)
    assert.equal("replaced", d:get("s"))       -- a bad set loses nothing
  end)

  it("is the same dict for the same name in every state", function()
    local d = netrun.shared.dict("same")
    d:flush_all()
    d:set("from", "main")
    assert.equal("main", group:submit(function()
      return netrun.shared.dict("same"):get("from")
    end):sync())
    group:submit(function() netrun.shared.dict("same"):set("back", 7) end):sync()
    assert.equal(7, d:get("back"))
    -- and a dict handle crosses threads as a handle
    assert.equal("main", group:submit(function(dd) return dd:get("from") end, d):sync())
  end)

  it("add fails on an existing key, incr counts, delete and keys", function()
    local d = netrun.shared.dict("ops")
    d:flush_all()
    assert.is_true(d:add("k", 1))
    local ok, err = d:add("k", 2)
    assert.is_nil(ok); assert.equal("exists", err)
    assert.equal(1, d:get("k"))
    assert.equal(6, d:incr("k", 5))
    assert.equal("integer", math.type(d:incr("k", 0)))
    assert.equal(6.5, d:incr("k", 0.5))
    local v, e = d:incr("absent", 1)
    assert.is_nil(v); assert.equal("not found", e)
    assert.equal(11, d:incr("absent", 1, 10))     -- init + by
    d:set("str", "x")
    v, e = d:incr("str", 1)
    assert.is_nil(v); assert.equal("not a number", e)
    local keys = d:keys()
    table.sort(keys)
    assert.same({ "absent", "k", "str" }, keys)
    assert.equal(2, #d:keys(2))
    assert.is_true(d:delete("k"))
    assert.is_nil(d:get("k"))
    assert.is_true(d:delete("never there"))
    d:set("str", nil)                               -- set to nil deletes too
    assert.is_nil(d:get("str"))
    d:flush_all()
    assert.equal(0, #d)
    assert.same({}, d:keys())
  end)

  it("expires entries after their ttl", function()
    local d = netrun.shared.dict("ttl")
    d:flush_all()
    d:set("short", "v", 0.05)
    d:set("long", "v", 30)
    d:set("forever", "v")
    assert.is_true(d:add("gone", 1, 0.05))
    assert.equal("v", d:get("short"))
    -- checked by a task scheduled past the ttl, on a loop
    local seen = group:schedule(0.15, function(dd)
      return { dd:get("short"), dd:get("long"), dd:get("forever"), dd:get("gone") }
    end, d):sync()
    assert.same({ nil, "v", "v", nil }, { seen[1], seen[2], seen[3], seen[4] })
    local keys = d:keys()
    table.sort(keys)
    assert.same({ "forever", "long" }, keys)
    -- an expired key can be added again
    assert.is_true(d:add("gone", 2))
    assert.equal(2, d:get("gone"))
    assert.has_error(function() d:set("x", 1, -1) end)
  end)

  it("evicts the least recently used entry at capacity", function()
    local d = netrun.shared.dict("small", { capacity = 3 })
    d:flush_all()
    d:set("a", 1); d:set("b", 2); d:set("c", 3)
    assert.equal(1, d:get("a"))                   -- a is now the most recent
    d:set("d", 4)                                 -- evicts b
    assert.equal(3, #d)
    assert.is_nil(d:get("b"))
    assert.same({ 1, 3, 4 }, { d:get("a"), d:get("c"), d:get("d") })
    assert.has_error(function() netrun.shared.dict("bad", { capacity = 0 }) end,
      "netrun.shared.dict: capacity must be >= 1")
  end)

  it("counts correctly when several loops increment at once", function()
    local d = netrun.shared.dict("counter")
    d:flush_all()
    local fs = {}
    for i, l in ipairs(group:loops()) do
      fs[i] = l:submit(function(dd, n)
        for _ = 1, n do dd:incr("hits", 1, 0) end
        for j = 1, 100 do dd:set("k" .. (j % 10), j) end
        return true
      end, d, 2000)
    end
    for _ = 1, 2000 do d:incr("hits", 1, 0) end
    netrun.all(fs):sync()
    assert.equal(4 * 2000, d:get("hits"))
    assert.equal(11, #d)
  end)
end)
