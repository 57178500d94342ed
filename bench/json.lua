-- bench/json.lua -- netrun.json.encode and decode of a typical API object
-- (a user record with an order: ids, strings, a float, booleans, a null,
-- an array of objects), N times each; bench/instr_json.sh runs it under
-- callgrind and divides the instructions by N.
--   netrun bench/json.lua N [encode|decode|both]
local json = require("netrun").json
local n = tonumber(arg[1]) or 1000
local what = arg[2] or "both"

local doc = {
  id = 123456789012345, name = "Ada Lovelace", email = "ada@example.com",
  active = true, score = 12.5, manager = json.null,
  tags = { "admin", "ops", "beta" },
  address = { street = "12 Analytical Way", city = "London", zip = "N1 9GU" },
  created_at = "2024-05-17T09:21:44Z",
  orders = {
    { id = 1001, sku = "AB-1", qty = 2, price = 9.99 },
    { id = 1002, sku = "CD-22", qty = 1, price = 129.5 },
    { id = 1003, sku = "EF-333", qty = 10, price = 0.25 },
  },
}
local text = json.encode(doc)
local sink = 0
if what ~= "decode" then
  for _ = 1, n do sink = sink + #json.encode(doc) end
end
if what ~= "encode" then
  for _ = 1, n do sink = sink + (json.decode(text).orders[3].qty) end
end
print(#text, sink)
