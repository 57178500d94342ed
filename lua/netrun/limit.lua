--- Protection: `netrun.limit`, loaded on first use. Handlers to put
-- after `netrun.codec.http_server` and before the application (as
-- `netrun.handler.metrics`): `req` limits the request rate per key
-- (nginx's `limit_req`, answered 429), `conn` the connections open per
-- key (nginx's `limit_conn`, answered 503), `shed` answers 503 while the
-- loop lags. Counts live in a shared dict, so every loop of the process
-- counts against the same limit. docs/guide/operating.md, "Limits".
-- @module netrun.limit

-- netrun.limit -- DESIGN.md §9.6's limits. A handler is a table whose
-- metatable is a field of this module, so it travels to loops (as an
-- upvalue of a server's init) and keeps its methods; its dict is a
-- handle, its key function bytecode. Per connection state (limit.conn's
-- held counts) is per loop state: each loop's copy has its own.
--
-- limit.req is nginx's leaky bucket in one step under the dict's lock
-- (core.dict_leak, runtime/bindings/ldict.c); limit.conn is dict:incr up
-- on a connection's first request and down when the channel goes
-- inactive (a close or a reset alike); shed reads the loop's lag
-- (core.loop_lag: the longest recent run less the time since) per
-- request.
-- Across processes (`redis = ...`) is not done.
local core = require "netrun.core"

local M = {}

local leak, loop_lag = core.dict_leak, core.loop_lag

local function is_request(msg)
  return type(msg) == "userdata" and msg.method ~= nil
end

-- The key of a request: the key function's (nil: not limited), or the
-- client's address.
local function key_of(self, ctx, req)
  if self.key then
    local k = self.key(req)
    if k == nil then return nil end
    local t = type(k)
    if t ~= "string" and t ~= "number" then
      error(self.what .. ": key returned a " .. t .. " (a string or a number, or nil for no limit)", 0)
    end
    return k
  end
  return (ctx.channel:remote_address()) or "-"
end

-- "10r/s", "600r/m" or a number of requests per second.
local function rate_of(what, v)
  local n, unit
  if type(v) == "number" then
    n, unit = v, "s"
  elseif type(v) == "string" then
    n, unit = v:match("^(%d+%.?%d*)r/([sm])$")
    n = tonumber(n)
  end
  if n == nil or n <= 0 then
    core.option_error(what, "rate", v, 'a number of requests per second > 0, or "Nr/s" or "Nr/m"')
  end
  return unit == "m" and n / 60 or n
end

local function dict_of(opts, what)
  return core.dict(opts.dict or "netrun.limit", { capacity = opts.capacity or 100000 })
end

local function answer(ctx, status, body)
  return ctx:write_and_flush { status = status, headers = { ["content-type"] = "text/plain" },
                               body = body }
end

-- A loop lagging past shed_lag answers 503 before anything is counted.
local function shed(self, ctx)
  if self.shed_lag and loop_lag() > self.shed_lag then
    answer(ctx, 503, "overloaded\n")
    return true
  end
  return false
end

-- ---- limit.req ----------------------------------------------------------

local Req = {}
Req.__index = Req
M.Req = Req

function Req:channel_read(ctx, req)
  if not is_request(req) then return ctx:fire_channel_read(req) end
  if shed(self, ctx) then return end
  local k = key_of(self, ctx, req)
  if k == nil then return ctx:fire_channel_read(req) end
  local delay = leak(self.dict, self.prefix .. k, self.rate, self.burst)
  if delay == nil then
    return answer(ctx, 429, "too many requests\n")
  end
  if delay == 0 or self.nodelay then return ctx:fire_channel_read(req) end
  -- over the rate, within the burst: on at the rate (nginx's delay)
  core.spawn(function()
    core.sleep(delay)
    if ctx.channel:is_open() then ctx:fire_channel_read(req) end
  end)
end

local check_req = core.options("netrun.limit.req", {
  rate = "any", burst = "integer 0", nodelay = "boolean", key = "function",
  dict = "string", capacity = "integer 1", shed_lag = "seconds" })

--- Limit the request rate per key (nginx's `limit_req`): a leaky bucket
-- per key drains at `rate`; a request finding more than `burst` requests
-- in it is answered 429. Those within the burst are delayed to the rate
-- (with `nodelay`, passed on at once). Counted in a shared dict, so all
-- loops share the limit.
-- @tparam table opts
-- @param opts.rate requests per second (a number), or "10r/s", "600r/m"
-- @int[opt=0] opts.burst requests over the rate let through (or delayed)
-- @bool[opt=false] opts.nodelay pass the burst on at once
-- @func[opt] opts.key `key(req)`: a string or number to count by, nil for
--   no limit (default: the client's address)
-- @string[opt="netrun.limit"] opts.dict the shared dict counting
-- @int[opt=100000] opts.capacity its most keys (least recently used go first)
-- @number[opt] opts.shed_lag seconds of loop lag past which requests get 503
-- @return a handler
-- @usage ch:pipeline():add_last("limit", netrun.limit.req { rate = "10r/s", burst = 20, nodelay = true })
function M.req(opts)
  opts = check_req(opts)
  if opts == nil or opts.rate == nil then core.option_error("netrun.limit.req", "rate", nil, "given") end
  return setmetatable({ what = "netrun.limit.req", rate = rate_of("netrun.limit.req", opts.rate),
    burst = opts.burst or 0, nodelay = opts.nodelay or false, key = opts.key,
    dict = dict_of(opts), prefix = "req:", shed_lag = opts.shed_lag }, Req)
end

-- ---- limit.conn -----------------------------------------------------------

local Conn = {}
Conn.__index = Conn
M.Conn = Conn

-- Counted on a connection's first request; a connection over the limit
-- holds nothing and each of its requests is answered 503 (and tries again).
function Conn:channel_read(ctx, req)
  if not is_request(req) then return ctx:fire_channel_read(req) end
  if shed(self, ctx) then return end
  local ch = ctx.channel
  local held = self.held[ch]
  if held == nil then
    local k = key_of(self, ctx, req)
    if k == nil then
      self.held[ch] = false
      return ctx:fire_channel_read(req)
    end
    k = "conn:" .. k
    if self.dict:incr(k, 1, 0) > self.max then
      self.dict:incr(k, -1)
      return answer(ctx, 503, "too many connections\n")
    end
    self.held[ch] = k
  end
  return ctx:fire_channel_read(req)
end

local function release(self, ctx)
  local ch = ctx.channel
  local k = self.held[ch]
  self.held[ch] = nil
  if k then self.dict:incr(k, -1) end
end

function Conn:channel_inactive(ctx)
  release(self, ctx)
  return ctx:fire_channel_inactive()
end

function Conn:handler_removed(ctx)
  release(self, ctx)
end

local check_conn = core.options("netrun.limit.conn", {
  max = "integer! 1", key = "function", dict = "string", capacity = "integer 1",
  shed_lag = "seconds" })

--- Limit the connections open per key (nginx's `limit_conn`): a
-- connection counts from its first request until it closes (or is
-- reset); a request on a connection past `max` is answered 503.
-- @tparam table opts
-- @int opts.max connections per key
-- @func[opt] opts.key `key(req)` of the first request (default: the client's address)
-- @string[opt="netrun.limit"] opts.dict the shared dict counting
-- @int[opt=100000] opts.capacity its most keys
-- @number[opt] opts.shed_lag seconds of loop lag past which requests get 503
-- @return a handler
function M.conn(opts)
  opts = check_conn(opts)
  return setmetatable({ what = "netrun.limit.conn", max = opts.max, key = opts.key,
    dict = dict_of(opts), held = {}, shed_lag = opts.shed_lag }, Conn)
end

-- ---- shed ---------------------------------------------------------------

local Shed = {}
Shed.__index = Shed
M.Shed = Shed

function Shed:channel_read(ctx, req)
  if is_request(req) and shed(self, ctx) then return end
  return ctx:fire_channel_read(req)
end

local check_shed = core.options("netrun.limit.shed", { lag = "seconds!" })

--- Shed load: while the loop lags (`loop:stats().lag`: the longest
-- recent run less the time since it ended) more than `lag` seconds,
-- requests are answered 503 at once rather than queued behind it; after
-- a stall of S seconds that is for about S - lag seconds.
-- @tparam table opts
-- @number opts.lag seconds
-- @return a handler
function M.shed(opts)
  opts = check_shed(opts)
  return setmetatable({ shed_lag = opts.lag }, Shed)
end

return M
