-- netrun.pretty -- the REPL's printer: nested tables with sorted keys,
-- limited in depth and width, cycles marked; one line when it fits.
local M = {}

local function is_identifier(s)
  return type(s) == "string" and s:match("^[%a_][%w_]*$") ~= nil
end

local KIND = { number = 1, string = 2, boolean = 3 }

local function key_less(a, b)
  local ka, kb = KIND[type(a)] or 4, KIND[type(b)] or 4
  if ka ~= kb then return ka < kb end
  if ka <= 2 then return a < b end
  return tostring(a) < tostring(b)
end

local function scalar(v)
  if type(v) == "string" then
    return (string.format("%q", v):gsub("\\\n", "\\n"))
  elseif math.type(v) == "float" and v == math.floor(v) and v > -1e15 and v < 1e15 then
    return string.format("%.1f", v)
  end
  return tostring(v)
end

local format

-- Format table t; `seen` holds the tables on the current path (cycles).
local function format_table(t, opts, depth, seen, indent)
  if seen[t] then return "<cycle: " .. tostring(t) .. ">" end
  if depth >= opts.depth then return "{...}" end
  local mt = getmetatable(t)
  if mt and mt.__tostring then return tostring(t) end
  seen[t] = true
  local keys, n = {}, #t
  for k in pairs(t) do
    if not (math.type(k) == "integer" and k >= 1 and k <= n) then keys[#keys + 1] = k end
  end
  table.sort(keys, key_less)
  local items, shown = {}, 0
  local inner = indent .. "  "
  for i = 1, n do
    shown = shown + 1
    if shown > opts.width then break end
    items[#items + 1] = format(t[i], opts, depth + 1, seen, inner)
  end
  for _, k in ipairs(keys) do
    shown = shown + 1
    if shown > opts.width then break end
    local ks = is_identifier(k) and k or "[" .. format(k, opts, depth + 1, seen, inner) .. "]"
    items[#items + 1] = ks .. " = " .. format(t[k], opts, depth + 1, seen, inner)
  end
  local total = n + #keys
  if total > opts.width then
    items[#items + 1] = "... (" .. (total - opts.width) .. " more)"
  end
  seen[t] = nil
  if #items == 0 then return "{}" end
  local one = "{ " .. table.concat(items, ", ") .. " }"
  if #one + #indent <= 78 and not one:find("\n") then return one end
  return "{\n" .. inner .. table.concat(items, ",\n" .. inner) .. "\n" .. indent .. "}"
end

function format(v, opts, depth, seen, indent)
  if type(v) == "table" then return format_table(v, opts, depth, seen, indent) end
  return scalar(v)
end

-- pretty.format(value [, { depth = 4, width = 40 }])
function M.format(v, opts)
  opts = opts or {}
  local o = { depth = opts.depth or 4, width = opts.width or 40 }
  return format(v, o, 0, {}, "")
end

-- The values of t (an array with field n), tab-separated.
function M.values(t, first)
  local out = {}
  for i = first or 1, t.n do
    out[#out + 1] = M.format(t[i])
  end
  return table.concat(out, "\t")
end

return M
