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

  it("overwrites keep values, byte counts and LRU order exact", function()
    -- an overwrite with a string of the same length reuses the old copy's
    -- memory: what comes back, and what is counted, must not show it
    local d = netrun.shared.dict("overwrite", { capacity = 3 })
    d:flush_all()
    local base = d:stats().bytes
    assert.is_true(d:set("a", "1111"))
    local one = d:stats().bytes - base
    assert.is_true(d:set("a", "2222"))            -- same length, the head
    assert.equal("2222", d:get("a"))
    assert.equal(one, d:stats().bytes - base)
    assert.is_true(d:set("a", "\0\1\2\3"))
    assert.equal("\0\1\2\3", d:get("a"))
    assert.is_true(d:set("a", "22"))              -- shorter, then longer
    assert.equal("22", d:get("a"))
    assert.equal(one - 2, d:stats().bytes - base)
    assert.is_true(d:set("a", "333333"))
    assert.equal("333333", d:get("a"))
    assert.is_true(d:set("a", 7))                 -- string -> integer -> string
    assert.equal(7, d:get("a"))
    assert.is_true(d:set("a", "4444"))
    assert.equal("4444", d:get("a"))
    assert.equal(one, d:stats().bytes - base)
    assert.is_true(d:set("a", ""))                -- the empty string, twice
    assert.is_true(d:set("a", ""))
    assert.equal("", d:get("a"))
    assert.is_true(d:set("a", "5555"))
    assert.is_nil(d:add("a", "6666"))             -- add keeps the old bytes
    assert.equal("5555", d:get("a"))
    -- an overwrite makes the key the most recent, head or not
    d:set("b", "bbbb"); d:set("c", "cccc")        -- LRU: c b a
    assert.is_true(d:set("a", "AAAA"))            -- a c b
    assert.is_true(d:set("c", "CCCC"))            -- c a b (c was not the head)
    d:set("d", "dddd")                            -- evicts b
    assert.is_nil(d:get("b"))
    assert.same({ "AAAA", "CCCC", "dddd" }, { d:get("a"), d:get("c"), d:get("d") })
    assert.is_true(d:set("d", "DDDD"))            -- d, the head, stays it
    d:get("a"); d:get("c")                        -- c a d
    d:set("e", "eeee")                            -- evicts d
    assert.is_nil(d:get("d"))
    assert.same({ "AAAA", "CCCC", "eeee" }, { d:get("a"), d:get("c"), d:get("e") })
    assert.equal(3 * one, d:stats().bytes - base)
    d:flush_all()
    assert.equal(base, d:stats().bytes)
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
      "netrun.shared.dict: capacity must be an integer >= 1, got 0")
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

  it("lets a __gc finalizer use the dict while keys() builds its table", function()
    -- In a child process, bounded: a deadlock shows as timeout's status 124.
    local out, st = H.run(string.format([[timeout 20 %s -e '
local d = require("netrun").shared.dict("gc")
for i = 1, 3000 do d:set("key" .. i, i) end
local mt = { __gc = function() d:set("from_gc", (d:get("from_gc") or 0) + 1) end }
for _ = 1, 50 do
  for _ = 1, 300 do setmetatable({}, mt) end
  assert(#d:keys(0) >= 3000)
end
collectgarbage()
print("finalizers", d:get("from_gc"))']], H.BIN))
    assert.equal(0, st, out)
    assert.matches("finalizers%s+%d+", out)
  end)

  it("holds its byte capacity: set evicts the least recently used, safe_set refuses", function()
    local d = netrun.shared.dict("bytes", { memory = 16 << 20 })
    d:flush_all()
    local mib = string.rep("x", 1 << 20)
    for i = 1, 300 do assert.is_true(d:set("k" .. i, mib)) end
    local s = d:stats()
    assert.is_true(s.bytes <= 16 << 20, "dict holds " .. s.bytes .. " bytes")
    assert.equal(16 << 20, s.memory)
    assert.equal(15, #d)                         -- 16 MiB minus the headers
    assert.equal(285, s.evictions)
    assert.equal(mib, d:get("k300"))
    assert.is_nil(d:get("k1"))
    -- a value larger than the whole dict is refused, the rest kept
    local ok, err = d:set("huge", string.rep("y", 17 << 20))
    assert.is_nil(ok); assert.equal("no memory", err)
    assert.equal(15, #d)
    -- safe_set and safe_add refuse instead of evicting
    ok, err = d:safe_set("k301", mib)
    assert.is_nil(ok); assert.equal("no memory", err)
    ok, err = d:safe_add("k302", mib)
    assert.is_nil(ok); assert.equal("no memory", err)
    assert.is_true(d:safe_set("k300", "small"))  -- replacing in place fits
    assert.is_true(d:safe_add("fits", "small"))
    assert.equal(16, #d)
    ok, err = d:safe_add("fits", "again")
    assert.is_nil(ok); assert.equal("exists", err)

    -- least recently used by bytes: a and c survive, b goes
    local lru = netrun.shared.dict("bytes-lru", { memory = 3 * (1024 + 200) })
    lru:set("a", string.rep("a", 1024)); lru:set("b", string.rep("b", 1024))
    lru:set("c", string.rep("c", 1024))
    assert.equal(3, #lru)
    assert.equal(1024, #lru:get("a"))
    lru:set("d", string.rep("d", 1024))
    assert.is_nil(lru:get("b"))
    assert.same({ 1024, 1024, 1024 }, { #lru:get("a"), #lru:get("c"), #lru:get("d") })
    assert.equal(64 << 20, netrun.shared.dict("bytes-default"):stats().memory)
    assert.has_error(function() netrun.shared.dict("bad-mem", { memory = 0 }) end,
      "netrun.shared.dict: memory must be a size in bytes from 1 to 1099511627776, got 0")
    d:flush_all()
    assert.equal(0, d:stats().bytes)
  end)

  it("keeps the process's memory within the default byte capacity", function()
    -- 300 values of 1 MiB in a child process (ASan without its quarantine,
    -- which would hold every freed value): RSS grows by the 64 MiB limit.
    local out, st = H.run(string.format([[ASAN_OPTIONS=quarantine_size_mb=0:$ASAN_OPTIONS \
      timeout 60 %s -e '
local function rss()
  local f = io.open("/proc/self/status")
  local kb = tonumber(f:read("a"):match("VmRSS:%%s*(%%d+)"))
  f:close()
  return kb
end
local d = require("netrun").shared.dict("big")
local mib = string.rep("x", 1 << 20)
local before = rss()
for i = 1, 300 do assert(d:set("k" .. i, mib)) end
print("grown", rss() - before, "bytes", d:stats().bytes, "entries", #d)
local maps = io.open("/proc/self/maps"):read("a")
print(maps:find("libtsan", 1, true) and "tsan" or "")']], H.BIN))
    assert.equal(0, st, out)
    local grown, bytes, n = out:match("grown%s+(%d+)%s+bytes%s+(%d+)%s+entries%s+(%d+)")
    assert.is_true(tonumber(bytes) <= 64 << 20, out)
    assert.equal(63, tonumber(n))
    -- ThreadSanitizer's allocator holds freed memory: no RSS figure there
    if not out:find("tsan", 1, true) then
      assert.is_true(tonumber(grown) < 96 * 1024, "RSS grew by " .. grown .. " KiB")
    end
  end)

  it("spreads keys crafted to collide under an unseeded hash", function()
    -- FNV-1a as netrun hashed keys before (with its offset basis): keys
    -- sharing their low 10 bits shared one of 1024 buckets.
    local function fnv(s)
      local h = 1469598103934665603
      for i = 1, #s do h = (h ~ s:byte(i)) * 1099511628211 end
      return h
    end
    local keys, i = {}, 0
    while #keys < 300 do
      i = i + 1
      local k = "k" .. i
      if fnv(k) & 1023 == 0 then keys[#keys + 1] = k end
    end
    local d = netrun.shared.dict("collide", { capacity = 1000 })
    d:flush_all()
    for j, k in ipairs(keys) do d:set(k, j) end
    local s = d:stats()
    assert.equal(300, s.entries)
    assert.is_true(s.max_chain <= 10, "longest chain " .. s.max_chain)
    for j, k in ipairs(keys) do assert.equal(j, d:get(k)) end
  end)

  it("grows its bucket array and keeps every key", function()
    local d = netrun.shared.dict("grow", { capacity = 50000 })
    d:flush_all()
    assert.equal(16, d:stats().buckets)
    for j = 1, 20000 do d:set("g" .. j, j) end
    local s = d:stats()
    assert.equal(20000, s.entries)
    assert.is_true(s.buckets >= 16384, "buckets " .. s.buckets)
    assert.is_true(s.max_chain <= 12, "longest chain " .. s.max_chain)
    for j = 1, 20000 do
      if d:get("g" .. j) ~= j then error("lost g" .. j) end
    end
    assert.equal(20000, #d:keys(0))
  end)
end)
