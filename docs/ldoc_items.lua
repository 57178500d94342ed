-- ldoc_items.lua -- an LDoc filter (`ldoc --filter ldoc_items.filter`, run
-- by scripts/api_docs.sh): writes every item LDoc documented, one a line,
-- to the file named by NETRUN_API_ITEMS, for docs/check_api.lua to hold
-- against the live API:
--   module <TAB> name <TAB> section <TAB> type <TAB> summary? <TAB> file:line
-- (LDoc runs under Lua 5.1: this file keeps to what 5.1 has.)
local M = {}

local function clean(s)
  return (tostring(s or ""):gsub("[\t\n]", " "))
end

function M.filter(modules)
  local path = assert(os.getenv("NETRUN_API_ITEMS"), "NETRUN_API_ITEMS is not set")
  local out = assert(io.open(path, "w"))
  for _, m in ipairs(modules) do
    out:write(table.concat({ m.name, "", "module", m.type,
      (m.summary or "") ~= "" and "yes" or "no", clean(m.file) }, "\t"), "\n")
    for _, item in ipairs(m.items) do
      -- (LDoc hands a filter no item's file: the module's first file and
      -- the item's line have to do.)
      local file = type(m.file) == "string" and m.file:match("[^/]+/[^/]+$") or "?"
      out:write(table.concat({ m.name, clean(item.name), clean(item.section), clean(item.type),
        (item.summary or "") ~= "" and "yes" or "no",
        clean(file) .. ":" .. tostring(item.lineno or "?") }, "\t"), "\n")
    end
  end
  out:close()
end

return M
