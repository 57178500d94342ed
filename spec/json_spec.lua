-- json_spec.lua -- DESIGN.md §8.3 "JSON": netrun.json on lua-cjson, its
-- null, its errors, and in every loop state (documents cross states).
local H = require "spec.helper"
local netrun = H.netrun

describe("netrun.json", function()
  local group
  setup(function() group = netrun.group { threads = 2, name = "json" } end)
  teardown(function() H.shutdown(group) end)

  it("encodes and decodes objects, arrays, numbers, strings and null", function()
    local json = netrun.json
    local doc = json.decode('{"a":[1,2.5,"x",true,null],"b":{"c":"\\u00e9"}}')
    assert.equal(1, doc.a[1])
    assert.equal(2.5, doc.a[2])
    assert.equal("x", doc.a[3])
    assert.is_true(doc.a[4])
    assert.equal(json.null, doc.a[5])
    assert.equal("\195\169", doc.b.c)
    assert.equal('[1,null,"q\\""]', json.encode({ 1, json.null, 'q"' }))
    assert.same(doc, json.decode(json.encode(doc)))
    assert.equal("null", json.encode(json.null))
  end)

  it("raises a clear error for text that is not JSON", function()
    local ok, err = pcall(netrun.json.decode, '{"a":')
    assert.is_false(ok)
    assert.matches("^.-netrun%.json%.decode: .*character", err)
    ok, err = pcall(netrun.json.decode, 42)
    assert.is_false(ok)
    assert.matches("netrun.json.decode: expected a string, got number", err, 1, true)
  end)

  it("raises naming what cannot be encoded and where", function()
    local ok, err = pcall(netrun.json.encode, { handlers = { 1, print } })
    assert.is_false(ok)
    assert.matches("netrun.json.encode: cannot encode function at .handlers[2]", err, 1, true)
    ok, err = pcall(netrun.json.encode, { fd = io.stdout })
    assert.is_false(ok)
    assert.matches("cannot encode userdata at .fd", err, 1, true)
    ok, err = pcall(netrun.json.encode, 0 / 0)
    assert.is_false(ok)
    assert.matches("netrun.json.encode: .*NaN", err)
  end)

  it("works in loop states, and a decoded null crosses states as null", function()
    local got = H.sync(group:next():submit(function(text)
      local json = require("netrun").json
      local v = json.decode(text)
      assert(v.x == json.null, "null decoded on the loop")
      return { encoded = json.encode({ n = v.n + 1, x = json.null }), doc = v }
    end, '{"n":41,"x":null}'))
    local json = netrun.json
    assert.same({ n = 42, x = json.null }, json.decode(got.encoded))
    assert.equal(json.null, got.doc.x)
    -- and back: a function capturing netrun.json and null runs on a loop
    local null = json.null
    assert.equal('{"k":null}', H.sync(group:next():submit(function()
      return netrun.json.encode({ k = null })
    end)))
  end)
end)
