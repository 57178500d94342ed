-- json_spec.lua -- DESIGN.md §8.3 "JSON": netrun.json, its null, its
-- errors, and in every loop state (documents cross states); numbers kept
-- exact (integers both ways, floats as floats), empty arrays that stay
-- arrays, its settings, text an attacker shapes, and a JSON API over HTTP
-- driven by curl.
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
    assert.matches("netrun.json.encode: cannot encode NaN", err, 1, true)
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

  it("encodes integers exactly and decodes them as integers: database ids", function()
    local json = netrun.json
    local ids = {
      ["9007199254740991"] = (1 << 53) - 1, ["9007199254740993"] = (1 << 53) + 1,
      ["9223372036854775807"] = math.maxinteger, ["-9223372036854775808"] = math.mininteger,
      ["123456789012345"] = 123456789012345, ["0"] = 0, ["-1"] = -1,
    }
    for text, id in pairs(ids) do
      assert.equal(text, json.encode(id))
      assert.equal('{"id":' .. text .. '}', json.encode { id = id })
      local back = json.decode('{"id":' .. text .. '}').id
      assert.equal("integer", math.type(back), text)
      assert.equal(id, back)
    end
    assert.equal("[1,2,3]", json.encode { 1, 2, 3 })
    assert.equal("integer", math.type(json.decode("[7]")[1]))
  end)

  it("keeps floats floats: 1.0 encodes as 1.0, and every float reads back the same", function()
    local json = netrun.json
    assert.equal("1.0", json.encode(1.0))
    assert.equal("1.5", json.encode(1.5))
    assert.equal("1e+300", json.encode(1e300))
    assert.equal("0.1", json.encode(0.1))
    assert.equal("-0.0", json.encode(-0.0))
    assert.equal("12.5", json.encode(12.5))
    for _, f in ipairs { 1.0, 1.5, 1e300, 0.1, 0.1 + 0.2, -0.0, 2^53, 2^63, 1e-7, 5e-324,
                         math.pi, -123456.789, 1e15, 1e16, 2.0^-1074, 1.7976931348623157e308 } do
      local back = json.decode(json.encode(f))
      assert.equal("float", math.type(back), tostring(f))
      assert.equal(string.format("%a", f), string.format("%a", back))
    end
    for text, want in pairs { ["1.0"] = 1.0, ["2e3"] = 2000.0, ["1E2"] = 100.0, ["-0.0"] = -0.0,
                              ["0.5"] = 0.5, ["1e300"] = 1e300 } do
      local v = json.decode(text)
      assert.equal("float", math.type(v), text)
      assert.equal(want, v)
    end
  end)

  it("decodes an integer beyond 64 bits to the nearest float (documented)", function()
    local json = netrun.json
    for _, text in ipairs { "9223372036854775808", "-9223372036854775809",
                            "123456789012345678901234567890" } do
      local v = json.decode(text)
      assert.equal("float", math.type(v), text)
      assert.equal(tonumber(text .. ".0"), v)
    end
  end)

  it("keeps empty arrays arrays, nested, and marks decoded arrays with array_mt", function()
    local json = netrun.json
    for _, text in ipairs { "[]", "{}", "[[],{},[[]],[{}],{\"a\":[]}]", '{"a":{"b":[[],[[]]]}}',
                            "[null,[],null]" } do
      assert.equal(text, json.encode(json.decode(text)))
    end
    assert.equal(json.array_mt, getmetatable(json.decode("[1]")))
    assert.is_nil(getmetatable(json.decode("{}")))
    assert.equal("[]", json.encode(json.empty_array))
    assert.equal('{"tags":[]}', json.encode { tags = json.empty_array })
    assert.equal("[]", json.encode(setmetatable({}, json.array_mt)))
    assert.equal("{}", json.encode {})
    local list = json.decode("[]")
    list[#list + 1] = "x"                 -- a decoded array is a table to fill
    assert.equal('["x"]', json.encode(list))
  end)

  it("sends a decoded document to a loop state, where its empty arrays stay arrays", function()
    local doc = netrun.json.decode('{"a":[],"n":9007199254740993}')
    local text = H.sync(group:next():submit(function(d)
      return require("netrun").json.encode(d)
    end, doc))
    assert.equal(doc.n, netrun.json.decode(text).n)
    assert.matches('"a":%[%]', text)
  end)

  it("reaches cjson's settings through configure, process-wide, refusing bad ones", function()
    local json = netrun.json
    local saved = json.configure()
    finally(function() json.configure(saved) end)
    assert.equal(1000, saved.encode_max_depth)
    assert.equal(1000, saved.decode_max_depth)
    assert.is_false(saved.encode_invalid_numbers)
    json.configure { encode_invalid_numbers = "null", decode_max_depth = 3 }
    assert.equal("[null,null]", json.encode { 0 / 0, math.huge })
    assert.has_error(function() json.decode("[[[[1]]]]") end)
    assert.same({ { { 1 } } }, json.decode("[[[1]]]"))
    -- a loop's netrun.json follows the same settings
    assert.equal("[null]", H.sync(group:next():submit(function()
      return require("netrun").json.encode { 0 / 0 }
    end)))
    json.configure { encode_invalid_numbers = true, decode_invalid_numbers = true }
    assert.equal("[NaN,Infinity,-Infinity]", json.encode { 0 / 0, math.huge, -math.huge })
    assert.equal(math.huge, json.decode("Infinity"))
    json.configure { encode_sparse_convert = true }
    assert.equal('{"1":1,"100":2}', (json.encode { [1] = 1, [100] = 2 }:gsub('"100":2,"1":1', '"1":1,"100":2')))
    json.configure { encode_empty_table_as_object = false, decode_array_with_array_mt = false }
    assert.equal("[]", json.encode {})
    assert.is_nil(getmetatable(json.decode("[1]")))
    local ok, err = pcall(json.configure, { encode_max_depht = 5 })
    assert.is_false(ok)
    assert.matches("unknown option 'encode_max_depht' (did you mean 'encode_max_depth'?)", err, 1, true)
    ok, err = pcall(json.configure, { decode_max_depth = 5, encode_max_depth = "deep" })
    assert.is_false(ok)
    assert.matches("encode_max_depth must be an integer", err, 1, true)
    assert.equal(3, json.configure().decode_max_depth)   -- nothing changed
  end)

  it("holds against text an attacker shapes: deep nesting, huge numbers, long strings, bad bytes", function()
    local json = netrun.json
    for _, open in ipairs { "[", '{"a":' } do
      local ok, err = pcall(json.decode, open:rep(100000))
      assert.is_false(ok)
      assert.matches("nesting of at most 1000", err, 1, true)
    end
    local cyclic = {}
    cyclic.self = cyclic
    local ok, err = pcall(json.encode, cyclic)
    assert.is_false(ok)
    assert.matches("nesting deeper than 1000", err, 1, true)
    assert.equal(math.huge, json.decode(("9"):rep(1000000)))   -- a float, at once
    assert.equal(0.0, json.decode("0." .. ("0"):rep(100000) .. "1"))
    assert.equal(math.huge, json.decode("1e999999999999999999"))
    local long = ("x"):rep(10 * 1024 * 1024)
    assert.equal(long, json.decode(json.encode(long)))
    assert.equal("\255\254", json.decode('"\255\254"'))       -- bytes pass, as cjson
    for _, bad in ipairs { '"\\ud800"', '"\\udc00"', '"\\ud800\\u0041"', '"\\u12"', '"a\nb"',
                           "[1,]", "01", "1.", ".5", "-", "+1", "0x10", "NaN", "[1 2]",
                           '{"a" 1}', '{1:2}', "nul", "\239\187\191{}", "[" .. ("1,"):rep(10) } do
      ok, err = pcall(json.decode, bad)
      assert.is_false(ok, bad)
      assert.matches("netrun.json.decode: expected", err, 1, true)
    end
    assert.equal("\u{1F600}", json.decode('"\\ud83d\\ude00"'))
  end)
end)

describe("a JSON API over HTTP (examples/json_api.lua) with curl", function()
  local pid, log, port

  setup(function()
    port = H.free_port()
    pid, log = H.start(H.root .. "/examples/json_api.lua", port)
  end)
  teardown(function()
    if pid then H.stop(pid) end
    if log then os.remove(log) end
  end)

  local function curl(args)
    local out, status = H.run("curl -sS --max-time 10 " .. args)
    assert.equal(0, status, out)
    return out
  end

  it("stores and returns records with 64-bit ids, floats and empty arrays as sent", function()
    local url = "http://127.0.0.1:" .. port .. "/items"
    assert.equal('{"ids":[]}\n', curl(url))
    local body = '{"id":9223372036854775807,"tags":[],"score":1.0,"ratio":0.1,"owner":null,"nested":[{}]}'
    local put = curl("-X PUT --data '" .. body .. "' " .. url)
    local doc = netrun.json.decode(put)
    assert.equal(math.maxinteger, doc.id)
    assert.equal("float", math.type(doc.score))
    local got = curl(url .. "/9223372036854775807")
    assert.equal(put, got)
    for _, part in ipairs { '"id":9223372036854775807', '"tags":[]', '"score":1.0', '"ratio":0.1',
                            '"owner":null', '"nested":[{}]' } do
      assert.is_truthy(got:find(part, 1, true), part .. " not in " .. got)
    end
    curl("-X PUT --data '{\"id\":9007199254740993}' " .. url)
    assert.equal('{"ids":[9007199254740993,9223372036854775807]}\n', curl(url))
    local bad = curl("-X PUT --data '{\"id\":1.5}' " .. url)
    assert.equal('{"error":"expected an integer id (got 1.5)"}\n', bad)
  end)
end)
