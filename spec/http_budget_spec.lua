-- http_budget_spec.lua -- the HTTP server codec's body budget: request
-- bodies held at once, per loop (body_budget) and per connection
-- (conn_body_budget), counted from a body's head to its answer; past a
-- budget the codec reads nothing more from the connections that would
-- add to it, until answers free room. Real sockets (LuaSocket clients)
-- against a netrun server whose handler holds requests until told.
local H = require "spec.helper"
local netrun = H.netrun
local socket = H.socket

local seen = netrun.shared.dict("http_budget_spec")

-- A server whose handler keeps each POST unanswered (per loop, in arrival
-- order) and counts it under "got"; GET /release answers every one held
-- (each with its body's length), GET /auto toggles its own channel's
-- auto_read off and on (what an application does), GET /n says how
-- many it holds.
local function server(group, opts)
  seen:set("got", 0)
  local s = netrun.server {
    group = group, host = "127.0.0.1", port = 0,
    init = function(ch)
      local netrun = require "netrun"
      local d = netrun.shared.dict("http_budget_spec")
      ch:pipeline():add_last("http", netrun.codec.http_server(opts))
      ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
        local held = rawget(_G, "budget_spec_held") or {}   -- (this loop's)
        rawset(_G, "budget_spec_held", held)
        if req.method == "POST" then
          d:incr("got", 1, 0)
          held[#held + 1] = { ctx = ctx, len = #req.body }
          if req.path == "/auto" then
            ctx.channel:option("auto_read", false)
            ctx.channel:option("auto_read", true)
          end
        elseif req.path == "/release" then
          for i, h in ipairs(held) do
            h.ctx:write_and_flush { status = 200, body = tostring(h.len) }
            held[i] = nil
          end
          ctx:write_and_flush { status = 200, body = "released" }
        else
          ctx:write_and_flush { status = 200, body = "n=" .. #held }
        end
      end })
    end,
  }:sync()
  local _, port = s:local_address()
  return s, port
end

-- A client that posts n bytes in the background: connected, the bytes
-- sent as the server takes them (timeout 0: never blocks the test).
local function poster(port, path, n, count)
  local c = H.client(port)
  c:settimeout(0)
  local one = string.format("POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s",
    path, n, string.rep("b", n))
  local data, at = string.rep(one, count or 1), 1
  return c, function()              -- push more; true once all is sent
    if at <= #data then
      local k, _, partial = c:send(data, at)
      at = (k or partial or at - 1) + 1
    end
    return at > #data
  end
end

-- got == n, after pushing the posters along; and still n a while later.
local function settles_at(n, pushers)
  local ok = H.eventually(function()
    for _, p in ipairs(pushers) do p() end
    return seen:get("got") == n
  end, 10)
  assert.is_true(ok, "got " .. tostring(seen:get("got")) .. ", wanted " .. n)
  local t = socket.gettime() + 0.4          -- and no more comes meanwhile
  H.eventually(function()
    for _, p in ipairs(pushers) do p() end
    return socket.gettime() > t
  end, 2, 0.02)
  assert.equal(n, seen:get("got"))
end

local function release(port)
  local c = H.client(port)
  c:send("GET /release HTTP/1.1\r\nHost: x\r\n\r\n")
  local status, _, body = H.read_response(c)
  c:close()
  return status == 200 and body
end

describe("netrun.codec.http_server body budget", function()
  local group
  setup(function() group = netrun.group { threads = 1, name = "budget" } end)
  teardown(function() H.shutdown(group) end)

  it("stops reading bodies past the loop's budget until answers free room, in the order they waited", function()
    local s, port = server(group, { body_budget = 1 << 20, conn_body_budget = 0, max_body = 4 << 20 })
    local a, pa = poster(port, "/a", 600 * 1024)
    settles_at(1, { pa })
    -- two more, each 600 KiB: neither fits beside the first
    local b, pb = poster(port, "/b", 600 * 1024)
    local c, pc = poster(port, "/c", 300 * 1024)
    settles_at(1, { pb, pc })
    assert.equal("released", release(port))   -- the first answered: b then c fit
    settles_at(3, { pb, pc })
    assert.equal("released", release(port))
    -- a body bigger than the budget passes when nothing else is held
    local d, pd = poster(port, "/d", 2 << 20)
    settles_at(4, { pd })
    for _, x in ipairs { a, b, c, d } do x:close() end
    assert.equal("released", release(port))
    s:close():sync()
  end)

  it("holds one connection to its own budget, whatever its auto_read says, while others read on", function()
    local s, port = server(group, { body_budget = 8 << 20, conn_body_budget = 1 << 20 })
    -- three pipelined 600 KiB bodies on one connection: the second waits for
    -- the first's answer, though the handler turns auto_read off and on
    local a, pa = poster(port, "/auto", 600 * 1024, 3)
    settles_at(1, { pa })
    local b, pb = poster(port, "/b", 600 * 1024)   -- another connection: room on the loop
    settles_at(2, { pa, pb })
    assert.equal("released", release(port))
    settles_at(3, { pa, pb })
    assert.equal("released", release(port))
    settles_at(4, { pa, pb })
    a:close()
    b:close()
    assert.equal("released", release(port))
    s:close():sync()
  end)

  it("frees what a connection held when it closes, for the connections waiting", function()
    local s, port = server(group, { body_budget = 1 << 20, conn_body_budget = 0 })
    local a, pa = poster(port, "/a", 800 * 1024)
    settles_at(1, { pa })
    local b, pb = poster(port, "/b", 800 * 1024)
    settles_at(1, { pb })
    a:close()                                  -- its request is never answered
    settles_at(2, { pb })
    b:close()
    assert.equal("released", release(port))
    s:close():sync()
  end)

  it("costs nothing to requests without a body, and reports its settings", function()
    local codec = netrun.codec.http_server { body_budget = 123, conn_body_budget = 45 }
    assert.matches("body_budget = 123, conn_body_budget = 45", tostring(codec))
    assert.matches("body_budget = 67108864, conn_body_budget = 16777216",
      tostring(netrun.codec.http_server {}))
    assert.has_error(function() netrun.codec.http_server { body_budget = -1 } end)
    local s, port = server(group, { body_budget = 1, conn_body_budget = 1 })
    local c = H.client(port)
    for _ = 1, 3 do
      c:send("GET /n HTTP/1.1\r\nHost: x\r\n\r\nGET /release HTTP/1.1\r\nHost: x\r\n\r\n")
      local status, _, body = H.read_response(c)
      assert.equal(200, status)
      assert.equal("n=0", body)
      status, _, body = H.read_response(c)
      assert.equal("released", body)
    end
    c:close()
    s:close():sync()
  end)
end)
