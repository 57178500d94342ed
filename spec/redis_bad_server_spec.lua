-- redis_bad_server_spec.lua -- netrun.redis against servers that cannot
-- be trusted: a fake Redis (a netrun server behind the native RESP
-- request decoder, in this process) answers GET as the test says -- a
-- reply cut by a close, a bulk length past any limit, a reply over
-- max_reply, arrays nested too deep, garbage, an error, no answer, an
-- answer one byte at a time, a reply nobody asked for, an array of two
-- billion elements announced -- and a fake cluster node answers MOVED
-- to itself forever. Each is bounded: the command fails with a clear
-- error, in bounded time and memory, and the client goes on with a new
-- connection. Its HELLO fails as before Redis 6, so every test also goes
-- through the RESP2 fallback.
local H = require "spec.helper"
local netrun = H.netrun

-- The fake: what it does with GET (and CLUSTER, for the fake node).
-- (get() below: GET, then PING twice: { value, err, seconds, ping,
-- Lua KiB, ping's err, second ping }.)
local function fake(group, behaviour)
  return netrun.server {
    group = group, host = "127.0.0.1", port = 0,
    init = function(ch)
      local B = behaviour
      local Fake = { seen = 0 }
      function Fake:channel_read(ctx, cmd)
        local name = cmd[1]:upper()
        local counts = require("netrun").shared.dict("redis_bad_server")
        counts:incr(name, 1, 0)
        if name == "HELLO" then
          return ctx:write_and_flush("-ERR unknown command 'HELLO'\r\n")
        elseif name == "PING" then
          return ctx:write_and_flush("+PONG\r\n")
        elseif name == "CLUSTER" then
          local _, port = ctx.channel:local_address()
          return ctx:write_and_flush(string.format(
            "*1\r\n*4\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n*8\r\n" ..
            "$2\r\nid\r\n$1\r\nx\r\n$4\r\nport\r\n:%d\r\n$2\r\nip\r\n$9\r\n127.0.0.1\r\n" ..
            "$4\r\nrole\r\n$6\r\nmaster\r\n", port))
        end
        local b = B
        if b == "close_mid_reply" then
          ctx:write_and_flush("$10\r\nabc")
          ctx:close()
        elseif b == "huge_bulk" then
          ctx:write_and_flush("$999999999999\r\n")
        elseif b == "over_limit" then
          ctx:write_and_flush("$2000\r\n" .. string.rep("x", 2000) .. "\r\n")
        elseif b == "deep" then
          ctx:write_and_flush(string.rep("*1\r\n", 100) .. ":1\r\n")
        elseif b == "nested_ok" then
          ctx:write_and_flush(string.rep("*1\r\n", 30) .. ":7\r\n")
        elseif b == "garbage" then
          ctx:write_and_flush("hello world\r\n")
        elseif b == "error" then
          ctx:write_and_flush("-ERR boom\r\n")
        elseif b == "never" then
          -- nothing, ever
        elseif b == "drip" then
          ctx:write_and_flush("$20\r\n")
          local ch, i = ctx.channel, 0
          local function drop()
            i = i + 1
            if i <= 22 and ch:is_active() then
              ch:write_and_flush(i <= 20 and "x" or (i == 21 and "\r" or "\n"))
              ch:loop():schedule(0.05, drop)
            end
          end
          drop()
        elseif b == "two_replies" then
          ctx:write_and_flush("+a\r\n+b\r\n")
        elseif b == "huge_array" then
          ctx:write_and_flush("*2000000000\r\n:1\r\n:2\r\n")
        elseif b == "moved" then
          local _, port = ctx.channel:local_address()
          ctx:write_and_flush("-MOVED 12182 127.0.0.1:" .. port .. "\r\n")
        end
      end
      ch:pipeline():add_last("resp", require("netrun").codec.resp())
      ch:pipeline():add_last("fake", Fake)
    end,
  }:sync()
end

describe("netrun.redis against a server that cannot be trusted", function()
  local group, client_group
  local counts = netrun.shared.dict("redis_bad_server")

  setup(function()
    group = netrun.group { threads = 1, name = "fake-redis" }
    client_group = netrun.group { threads = 1, name = "bad-client" }
  end)
  teardown(function()
    H.shutdown(client_group)
    H.shutdown(group)
  end)

  -- GET against a fake of that behaviour; then PING: { v, err, seconds,
  -- ping reply, lua memory after }.
  local function get(behaviour, opts)
    counts:flush_all()
    local srv = fake(group, behaviour)
    finally(function() srv:close():sync() end)
    local _, port = srv:local_address()
    return H.sync(H.sync(client_group:submit(function(port, opts)
      local netrun = require "netrun"
      return netrun.spawn(function()
        opts = opts or {}
        opts.port = port
        local r = netrun.redis.connect(opts)
        local t0 = netrun.now()
        local v, err = r:get("k")
        local dt = netrun.now() - t0
        collectgarbage()
        local mem = collectgarbage("count")
        local ping, perr = r:ping()
        local ping2 = r:ping()
        r:close()
        return { v, err, dt, ping, mem, perr, ping2 }
      end)
    end, port, opts)), 20)
  end

  it("a reply cut short by a close: nil, \"closed\"; a new connection after", function()
    local out = get("close_mid_reply")
    assert.is_nil(out[1])
    assert.equal("closed", out[2])
    assert.equal("PONG", out[4])
    assert.equal(2, counts:get("HELLO"))                -- two connections
  end)

  it("a bulk length past max_reply fails at once, before any of its bytes", function()
    local out = get("huge_bulk")
    assert.is_nil(out[1])
    assert.equal("protocol error: reply too large", out[2])
    assert.is_true(out[3] < 1, "took " .. out[3])
    assert.equal("PONG", out[4])
  end)

  it("a reply over the max_reply option fails", function()
    local out = get("over_limit", { max_reply = 1000 })
    assert.equal("protocol error: reply too large", out[2])
    local ok = get("over_limit", { max_reply = 4096 })
    assert.equal(string.rep("x", 2000), ok[1])
  end)

  it("arrays nested past max_depth fail; within it they are values", function()
    assert.equal("protocol error: nesting too deep", get("deep")[2])
    local v = get("nested_ok")[1]
    for _ = 1, 30 do v = v[1] end
    assert.equal(7, v)
  end)

  it("garbage fails the command with the reason", function()
    local out = get("garbage")
    assert.equal("protocol error: unknown reply type", out[2])
    assert.equal("PONG", out[4])
  end)

  it("an error reply is nil and the error, and the connection stays", function()
    local out = get("error")
    assert.is_nil(out[1])
    assert.equal("ERR boom", out[2])
    assert.equal("PONG", out[4])
    assert.equal(1, counts:get("HELLO"))                -- one connection
  end)

  it("a server that never answers: \"timeout\" after timeout (at most 1.5 times it)", function()
    local out = get("never", { timeout = 0.4 })
    assert.equal("timeout", out[2])
    assert.is_true(out[3] >= 0.35 and out[3] <= 0.7, "took " .. out[3])
    assert.equal(2, counts:get("HELLO"))                -- the late connection was dropped
  end)

  it("a reply dripped a byte at a time does not outlive the timeout", function()
    local out = get("drip", { timeout = 0.4 })
    assert.equal("timeout", out[2])
    assert.is_true(out[3] < 0.8, "took " .. out[3])
  end)

  it("a reply nobody asked for closes the connection", function()
    local out = get("two_replies")
    -- the first reply is GET's; the second came before any other command
    -- left: the connection goes, with the PING queued on it meanwhile,
    -- and the next PING runs on a new one
    assert.equal("a", out[1])
    assert.is_nil(out[4])
    assert.equal("protocol error: a reply nobody asked for", out[6])
    assert.equal("PONG", out[7])
    assert.equal(2, counts:get("HELLO"))
  end)

  it("two billion elements announced hold no memory while they do not come", function()
    local out = get("huge_array", { timeout = 0.3 })
    assert.equal("timeout", out[2])
    assert.is_true(out[5] < 10 * 1024, "Lua memory " .. out[5] .. " KiB")
  end)

  it("a cluster node answering MOVED to itself forever: \"too many redirects\", bounded", function()
    counts:flush_all()
    local srv = fake(group, "moved")
    finally(function() srv:close():sync() end)
    local _, port = srv:local_address()
    local out = H.sync(H.sync(client_group:submit(function(port)
      local netrun = require "netrun"
      return netrun.spawn(function()
        local c = netrun.redis.cluster { nodes = { "127.0.0.1:" .. port }, max_redirects = 5 }
        local t0 = netrun.now()
        local v, err = c:get("k")
        local res = c:pipeline(function(p) p:get("a") p:get("b") end)
        return { v, err, netrun.now() - t0, res[1].err }
      end)
    end, port)), 20)
    assert.is_nil(out[1])
    assert.matches("^too many redirects %(MOVED 12182 127%.0%.0%.1:%d+%)$", out[2])
    assert.is_true(out[3] < 5, "took " .. out[3])
    assert.matches("^too many redirects", out[4])
    -- the first GET, and one per redirect followed; the pipeline's two
    -- GETs once together, then each alone the same way
    assert.equal(6 + 2 + 2 * 6, counts:get("GET"))
  end)

  it("a cluster with no node answering fails in bounded time", function()
    local port = H.free_port()
    local out = H.sync(H.sync(client_group:submit(function(port)
      local netrun = require "netrun"
      return netrun.spawn(function()
        local c = netrun.redis.cluster { nodes = { "127.0.0.1:" .. port }, timeout = 1 }
        local t0 = netrun.now()
        local v, err = c:get("k")
        return { v, err, netrun.now() - t0 }
      end)
    end, port)), 20)
    assert.is_nil(out[1])
    assert.matches("no slot map.*refused", out[2])
    assert.is_true(out[3] < 2)
  end)
end)
