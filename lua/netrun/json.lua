-- netrun.json: JSON on lua-cjson (Debian's lua-cjson, module "cjson").
--
-- encode(v) --> string; decode(s) --> value; null: the value JSON's null
-- decodes to and encodes from (cjson's own null, a light userdata; it
-- crosses states by name like a module's field, so a decoded document
-- may be sent to another loop).
--
-- Misuse raises, naming the function and the cause: decoding something
-- that is not JSON ("netrun.json.decode: Expected value but found invalid
-- token at character 1"), encoding a value JSON cannot hold (a function,
-- a userdata, a thread, NaN, an excessively sparse array, nesting deeper
-- than 1000).
--
-- This module keeps its own cjson instance (cjson.new()), so another
-- library changing cjson's global settings does not change netrun.json.
local cjson_global = require "cjson"
local cjson = cjson_global.new()

local json = { null = cjson_global.null }

-- cjson names the type it refuses ("Cannot serialise function: type not
-- supported") but not where it was: find the first such value, so the
-- message names its path (e.g. "cannot encode function at .handlers[2]").
local ENCODABLE = { ["nil"] = true, boolean = true, number = true, string = true,
                    table = true }

local function key_path(path, k)
  if type(k) == "string" and k:match("^[%a_][%w_]*$") then
    return path .. "." .. k
  end
  return path .. "[" .. (type(k) == "string" and string.format("%q", k) or tostring(k)) .. "]"
end

local function find_bad(v, path, seen)
  local t = type(v)
  if v == json.null then return nil end
  if not ENCODABLE[t] then return t, path end
  if t ~= "table" or seen[v] then return nil end
  seen[v] = true
  for k, x in pairs(v) do
    local kt = type(k)
    if kt ~= "string" and kt ~= "number" then
      return kt .. " key", path
    end
    local bad, where = find_bad(x, key_path(path, k), seen)
    if bad then return bad, where end
  end
  return nil
end

function json.encode(v)
  local ok, s = pcall(cjson.encode, v)
  if ok then return s end
  local bad, where = find_bad(v, "", {})
  if bad then
    error(string.format("netrun.json.encode: cannot encode %s%s", bad,
      where ~= "" and " at " .. where or ""), 2)
  end
  error("netrun.json.encode: " .. tostring(s), 2)
end

function json.decode(s)
  if type(s) ~= "string" then
    error("netrun.json.decode: expected a string, got " .. type(s), 2)
  end
  local ok, v = pcall(cjson.decode, s)
  if ok then return v end
  error("netrun.json.decode: " .. tostring(v), 2)
end

return json
