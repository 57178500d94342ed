-- json_api.lua -- a JSON API over HTTP: records with database ids (64-bit
-- integers, kept exact), stored as JSON text in a netrun.shared.dict so
-- every worker loop sees them.
--   netrun examples/json_api.lua [--port N] [--threads N] [--host H]
--   curl -X PUT --data '{"id":9007199254740993,"tags":[],"score":1.0}' \
--        localhost:8080/items                   -> 201 and the record
--   curl localhost:8080/items/9007199254740993  -> 200 the record as stored
--   curl localhost:8080/items                   -> 200 {"ids":[...]} ([] when empty)
-- A body that is not a JSON object with an integer "id" gets a 400 that says
-- why: {"error":"..."}.
local netrun = require "netrun"
local json = netrun.json

local option = netrun.option
local port = option("port", 8080)
local threads = option("threads", 1)

local JSON = { ["content-type"] = "application/json" }

local function reply(ctx, status, doc)
  ctx:write { status = status, headers = JSON, body = json.encode(doc) .. "\n" }
end

-- The record in a request body, or nil and why not.
local function record(body)
  local ok, doc = pcall(json.decode, body or "")
  if not ok then return nil, (tostring(doc):gsub("^.-netrun%.json%.decode: ", "")) end
  if type(doc) ~= "table" or getmetatable(doc) == json.array_mt then
    return nil, "expected a JSON object"
  end
  if math.type(doc.id) ~= "integer" then
    return nil, "expected an integer id (got " .. json.encode(doc.id or json.null) .. ")"
  end
  return doc
end

local Api = {}
function Api:channel_read(ctx, req)
  local store = netrun.shared.dict("items")
  if req.path == "/items" and req.method == "PUT" then
    local doc, why = record(req.body)
    if not doc then return reply(ctx, 400, { error = why }) end
    store:set(tostring(doc.id), json.encode(doc))
    return reply(ctx, 201, doc)
  elseif req.path == "/items" and req.method == "GET" then
    local ids = setmetatable({}, json.array_mt)    -- [] when there are none
    for _, k in ipairs(store:keys()) do ids[#ids + 1] = math.tointeger(k) end
    table.sort(ids)
    return reply(ctx, 200, { ids = ids })
  end
  local id = req.path:match("^/items/(%-?%d+)$")
  if id and req.method == "GET" then
    local text = store:get(id)
    if not text then return reply(ctx, 404, { error = "no item " .. id }) end
    return ctx:write { status = 200, headers = JSON, body = text .. "\n" }
  end
  reply(ctx, 404, { error = "use PUT /items, GET /items or GET /items/<id>" })
end
function Api:channel_read_complete(ctx) ctx:flush() end
function Api:exception_caught(ctx, err)
  local reset = tostring(err):find("ECONNRESET") or tostring(err):find("EPIPE")
  netrun.log[reset and "debug" or "warn"]("channel %d: %s", ctx.channel:id(), err)
  ctx:close()
end

netrun.shared.dict("items", { capacity = 100000 })
local http = netrun.codec.http_server {}

local workers = netrun.group { threads = threads, name = "api" }
local server = netrun.server {
  group = workers,
  host = option("host", "127.0.0.1"),
  port = port,
  init = function(ch)
    ch:pipeline():add_last("http", http):add_last("api", Api)
  end,
}:sync()

netrun.log.info("json_api listening on %s:%d", server:local_address())
