-- limit_spec.lua -- netrun.limit (DESIGN.md §9.6): limit.req's 429s
-- counted exactly across loops (by burst, not by timing: the rate is so
-- low nothing drains during the spec), its delay within the burst,
-- limit.conn's 503 past max and its counts given back on a close and on
-- a reset, and shed's 503 from a loop that was stalled on purpose.
local H = require "spec.helper"
local netrun = H.netrun

local function serve(group, limiter)
  local server = netrun.server { group = group, host = "127.0.0.1", port = 0, init = function(ch)
    ch:pipeline():add_last("http", netrun.codec.http_server {})
    ch:pipeline():add_last("limit", limiter)
    ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
      ctx:write_and_flush { status = 200, body = "ok" }
    end })
  end }:sync()
  return server, select(2, server:local_address())
end

local function get(c, path, headers)
  assert(c:send("GET " .. (path or "/") .. " HTTP/1.1\r\nHost: x\r\n" .. (headers or "") .. "\r\n"))
  return (H.read_response(c))
end

describe("netrun.limit", function()
  local group
  setup(function() group = netrun.group { threads = 2, name = "limit" } end)
  teardown(function() H.shutdown(group) end)

  it("req: lets rate + burst through across loops, then 429, per key", function()
    local server, port = serve(group, netrun.limit.req {
      rate = "1r/m", burst = 9, nodelay = true, dict = "limit_spec_req",
      key = function(req) return req.headers["x-user"] end })
    finally(function() server:close():sync() end)
    -- 8 connections (spread over both loops by the kernel), 3 requests each
    local ok, refused = 0, 0
    local conns = {}
    for i = 1, 8 do conns[i] = H.client(port) end
    for _ = 1, 3 do
      for _, c in ipairs(conns) do
        local st = get(c, "/", "X-User: alice\r\n")
        if st == 200 then ok = ok + 1 elseif st == 429 then refused = refused + 1 end
      end
    end
    assert.equal(10, ok)                -- the first, and a burst of 9
    assert.equal(14, refused)
    -- another key has its own bucket; no key is not limited
    for i = 1, 10 do assert.equal(200, get(conns[i % 2 + 1], "/", "X-User: bob\r\n")) end
    assert.equal(429, get(conns[2], "/", "X-User: bob\r\n"))
    for _ = 1, 5 do assert.equal(200, get(conns[3], "/")) end
    for _, c in ipairs(conns) do c:close() end
    -- both loops took part
    local seen = 0
    for _, s in ipairs(group:stats()) do if s.io_events > 0 then seen = seen + 1 end end
    assert.equal(2, seen)
  end)

  it("req: delays what is within the burst to the rate without nodelay", function()
    local server, port = serve(group, netrun.limit.req { rate = 10, burst = 2, dict = "limit_spec_delay" })
    finally(function() server:close():sync() end)
    local c = H.client(port)
    local t0 = netrun.now()
    assert(c:send(string.rep("GET / HTTP/1.1\r\nHost: x\r\n\r\n", 4)))
    local got = {}
    for i = 1, 4 do got[i] = H.read_response(c) end
    local took = netrun.now() - t0
    assert.same({ 200, 200, 200, 429 }, got)
    assert.truthy(took >= 0.15, "the third waited 0.2 s at 10 r/s, took " .. took)
    c:close()
  end)

  it("conn: 503 past max, counts given back on a close and on a reset", function()
    local server, port = serve(group, netrun.limit.conn { max = 2, dict = "limit_spec_conn" })
    finally(function() server:close():sync() end)
    local d = netrun.shared.dict("limit_spec_conn")
    local a, b, c = H.client(port), H.client(port), H.client(port)
    assert.equal(200, get(a))
    assert.equal(200, get(b))
    assert.equal(503, get(c))
    assert.equal(503, get(c))           -- it holds nothing: it tries again
    assert.equal(2, d:get("conn:127.0.0.1"))
    a:close()                           -- a FIN
    assert(H.eventually(function() return d:get("conn:127.0.0.1") == 1 end, 5))
    assert.equal(200, get(c))
    b:setoption("linger", { on = true, timeout = 0 })
    b:close()                           -- a reset
    assert(H.eventually(function() return d:get("conn:127.0.0.1") == 1 end, 5))
    c:close()
    assert(H.eventually(function() return d:get("conn:127.0.0.1") == 0 end, 5))
  end)

  it("shed: a loop that lagged answers 503 instead of queueing, then serves again", function()
    local one = netrun.group { threads = 1, name = "limit_shed" }
    finally(function() H.shutdown(one) end)
    local server, port = serve(one, netrun.limit.shed { lag = 0.2 })
    finally(function() server:close():sync() end)
    local c = H.client(port)
    assert.equal(200, get(c))
    -- stall the loop for 0.5 s; a request sent meanwhile waits behind it
    local loop = one:loops()[1]
    local stalled = loop:submit(function()
      local nr = require "netrun"
      nr.shared.dict("limit_spec_stall"):set("stalling", true)
      local until_ = nr.now() + 0.5
      while nr.now() < until_ do end
      return true
    end)
    -- send only once the stall runs: sent earlier, the request could be
    -- read in the same wake-up as the task, before it, and be served
    local flag = netrun.shared.dict("limit_spec_stall")
    assert(H.eventually(function() return flag:get("stalling") end, 5))
    assert(c:send("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert.is_true(H.sync(stalled))
    assert.equal(503, (H.read_response(c)))
    assert.is_number(loop:stats().lag)
    -- the lag runs down with time: the loop serves again within the stall's length
    assert(H.eventually(function() return get(c) == 200 end, 5))
    c:close()
  end)

  it("checks its options", function()
    assert.has_error(function() netrun.limit.req { burst = 1 } end)
    assert.has_error(function() netrun.limit.req { rate = "fast" } end)
    assert.has_error(function() netrun.limit.req { rate = 1, brust = 1 } end,
      "netrun.limit.req: unknown option 'brust' (did you mean 'burst'?)")
    assert.has_error(function() netrun.limit.conn { } end)
    assert.has_error(function() netrun.limit.conn { max = 0 } end)
    assert.has_error(function() netrun.limit.shed { lag = "x" } end)
  end)
end)
