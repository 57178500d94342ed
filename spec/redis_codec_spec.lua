-- redis_codec_spec.lua -- netrun.redis's codec (runtime/bindings/lredis.c
-- over runtime/codec/resp_reply.c) on byte streams, without sockets: a
-- stream of RESP2 and RESP3 replies fed whole, a byte at a time and cut
-- at every point gives the same values; pushes wait where they are;
-- commands encode as redis-cli would send them; limits and garbage end
-- the codec with the reason.
local H = require "spec.helper"
local core = require "netrun.core"
local redis = H.netrun.redis

local Error = redis.Error

local function codec(max_reply)
  return core.redis.codec(max_reply or 1 << 20, 32, 1024, Error)
end

-- Everything c holds, as one string per reply (pushes included).
local function render(v)
  if v == nil then return "nil" end
  if v == redis.null then return "null" end
  if type(v) ~= "table" then return math.type(v) and (math.type(v) .. ":" .. tostring(v)) or
                                   (type(v) .. ":" .. tostring(v)) end
  if getmetatable(v) == Error then return "error:" .. v.err end
  local keys = {}
  for k in pairs(v) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  local parts = {}
  for _, k in ipairs(keys) do parts[#parts + 1] = render(k) .. "=" .. render(v[k]) end
  return "{" .. table.concat(parts, ",") .. "}"
end

local function drain(c, out)
  while true do
    local t = {}
    local k, why = c:take(t, 1, 1)
    if why == "push" then
      k = c:take(t, 1, 1, true)
      out[#out + 1] = "push " .. render(t[1])
    elseif k == 1 then
      out[#out + 1] = render(t[1])
    else
      if why then out[#out + 1] = why end
      return
    end
  end
end

local STREAM = table.concat {
  "+OK\r\n", "-ERR no\r\n", ":-7\r\n", "$5\r\nhello\r\n", "$-1\r\n", "$0\r\n\r\n",
  "*3\r\n$1\r\na\r\n$-1\r\n:1\r\n", "*-1\r\n", "*0\r\n",
  "%2\r\n+k\r\n,1.5\r\n$1\r\nz\r\n#t\r\n", "~2\r\n+a\r\n_\r\n", "(12345678901234567890\r\n",
  ">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$4\r\nbody\r\n", "|1\r\n+ttl\r\n:5\r\n$1\r\nv\r\n",
  "=15\r\ntxt:Some string\r\n", "!5\r\nOOPS!\r\n", "*2\r\n*1\r\n-WRONGTYPE x\r\n_\r\n",
}

describe("netrun.redis's codec", function()
  local whole

  setup(function()
    local c = codec()
    c:feed(STREAM)
    whole = {}
    drain(c, whole)
  end)

  it("decodes RESP2 and RESP3 replies into Lua values", function()
    assert.same({
      "string:OK", "error:ERR no", "integer:-7", "string:hello", "nil", "string:",
      "{integer:1=string:a,integer:2=null,integer:3=integer:1}", "nil", "{}",
      "{string:k=float:1.5,string:z=boolean:true}", "{integer:1=string:a,integer:2=null}",
      "string:12345678901234567890",
      "push {integer:1=string:message,integer:2=string:ch,integer:3=string:body}",
      "string:v", "string:Some string", "error:OOPS!",
      "{integer:1={integer:1=error:WRONGTYPE x},integer:2=null}",
    }, whole)
  end)

  it("gives the same values fed a byte at a time, and cut at every point", function()
    local c = codec()
    local out = {}
    for i = 1, #STREAM do
      c:feed(STREAM:sub(i, i))
      drain(c, out)
    end
    assert.same(whole, out)
    for cut = 1, #STREAM - 1 do
      local c2, out2 = codec(), {}
      c2:feed(STREAM:sub(1, cut))
      drain(c2, out2)
      c2:feed(STREAM:sub(cut + 1))
      drain(c2, out2)
      assert.same(whole, out2, "cut at " .. cut)
    end
  end)

  it("leaves a push where it is for a reader that does not take pushes", function()
    local c = codec()
    c:feed(">2\r\n+a\r\n+b\r\n:1\r\n")
    local t = {}
    assert.same({ 0, "push" }, { c:take(t, 1, 1) })
    assert.same({ 0, "push" }, { c:take(t, 1, 1) })      -- still there
    assert.equal(1, c:take(t, 1, 1, true))
    assert.same({ "a", "b" }, t[1])
    assert.equal(1, c:take(t, 1, 1))
    assert.equal(1, t[1])
    assert.equal(0, c:buffered())
  end)

  it("encodes commands as RESP arrays of bulk strings", function()
    local c = codec()
    c:cmd("SET", "k", 12, 1.5, "")
    c:cmdv({ "GET", "a\r\nb", n = 2 })
    assert.equal("*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n12\r\n$3\r\n1.5\r\n$0\r\n\r\n" ..
                 "*2\r\n$3\r\nGET\r\n$4\r\na\r\nb\r\n", c:out())
    assert.is_nil(c:out())
    assert.has_error(function() c:cmd("SET", "k", {}) end)
    assert.is_nil(c:out())                                   -- nothing half-encoded stays
  end)

  it("ends on garbage or a reply over a limit, with the reason, and takes nothing more", function()
    for input, why in pairs {
      ["hello\r\n"] = "protocol error: unknown reply type",
      ["$99999999\r\n"] = "protocol error: reply too large",
      [string.rep("*1\r\n", 40) .. ":1\r\n"] = "protocol error: nesting too deep",
      ["+" .. string.rep("x", 2000)] = "protocol error: line too long",
    } do
      local c = codec(4096)
      c:feed(input)
      assert.same({ 0, why }, { c:take({}, 1, 1) })
      c:feed("+OK\r\n")
      assert.same({ 0, why }, { c:take({}, 1, 1) })
    end
  end)
end)
