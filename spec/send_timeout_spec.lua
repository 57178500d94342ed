-- send_timeout_spec.lua -- a peer that never reads what it is sent loses
-- its connection after send_timeout (nginx's send_timeout, Netty's
-- WriteTimeoutHandler): its pending writes fail with "send timeout",
-- exception_caught hears it, the channel is reset and counted no more. A
-- peer that reads slowly but steadily keeps its connection.
local H = require "spec.helper"
local netrun, socket = H.netrun, H.socket

local BIG = 256 * 1024

-- Answers every request with BIG bytes; counts the send timeouts its
-- exception_caught heard, and how the failed write futures ended.
local Big = {}
function Big:channel_read(ctx, req)
  local size = tonumber(req.path:match("^/(%d+)$")) or BIG
  local f = ctx:write { status = 200, body = string.rep("x", size) }
  f:add_listener(function(w)
    if not w:is_success() then
      _G.failed = _G.failed or {}
      _G.failed[#_G.failed + 1] = tostring(w:cause())
    end
  end)
end
function Big:channel_read_complete(ctx) ctx:flush() end
function Big:exception_caught(ctx, err)
  _G.caught = _G.caught or {}
  _G.caught[#_G.caught + 1] = tostring(err)
end

local function serve(init, child_options)
  local group = netrun.group { threads = 1, name = "sendto" }
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0,
    child_options = child_options or { send_timeout = 1 },
    init = init,
  }:sync()
  local _, port = server:local_address()
  return group, port, group:loops()[1]
end

local function http(ch)
  ch:pipeline():add_last("http", netrun.codec.http_server {})
  ch:pipeline():add_last("app", Big)
end

-- What the loop's handlers recorded.
local function recorded(loop)
  return loop:submit(function()
    return { caught = _G.caught or {}, failed = _G.failed or {} }
  end):sync()
end

local function channels(loop) return loop:stats().channels end

describe("send_timeout", function()
  it("closes a pipelining HTTP client that never reads, serving others", function()
    local group, port, loop = serve(http)
    local stuck = H.client(port)
    -- 5 MiB of answers: past what the sockets of both sides buffer
    stuck:send(string.rep("GET / HTTP/1.1\r\nHost: x\r\n\r\n", 20))
    local t0 = socket.gettime()
    -- a normal client meanwhile is served in full
    local c = H.client(port)
    c:send("GET /100 HTTP/1.1\r\nHost: x\r\n\r\n")
    local status, _, body = H.read_response(c)
    assert.are.equal(200, status)
    assert.are.equal(100, #body)
    c:close()
    assert.is_true(H.eventually(function() return channels(loop) == 1 end, 5),
                   "channels left: " .. channels(loop))
    local took = socket.gettime() - t0
    assert.is_true(took > 0.8 and took < 4, "closed after " .. took .. " s")
    local r = recorded(loop)
    assert.are.equal(1, #r.caught)
    assert.matches("send timeout", r.caught[1])
    assert.is_true(#r.failed >= 1)
    for _, cause in ipairs(r.failed) do assert.matches("send timeout", cause) end
    -- the reset reaches the client once it reads what it holds
    stuck:settimeout(5)
    local ended
    repeat
      local data, err = stuck:receive(65536)
      ended = not data and err
    until ended
    assert.is_truthy(ended == "closed" or ended:match("reset"), ended)
    stuck:close()
    H.shutdown(group)
  end)

  it("does not cut a slow client that reads steadily past the timeout", function()
    local group, port, loop = serve(http)
    local c = H.client(port)
    c:send("GET /" .. 16 * 1024 * 1024 .. " HTTP/1.1\r\nHost: x\r\n\r\n")
    H.recv(c, 1)                     -- the answer began: from now on
    local reads, t0 = 0, socket.gettime()
    while socket.gettime() - t0 < 3 do   -- 32 KiB every 200 ms, 3 s
      H.recv(c, 32 * 1024)
      reads = reads + 1
      socket.select(nil, nil, 0.2)
    end
    assert.are.equal(2, channels(loop))
    assert.are.equal(0, #recorded(loop).caught)
    assert.is_true(reads >= 10, reads .. " reads")
    c:close()
    assert.is_true(H.eventually(function() return channels(loop) == 1 end, 5))
    H.shutdown(group)
  end)

  it("closes an echo client that never reads; its write futures fail", function()
    local Echo = {
      channel_read = function(_, ctx, msg)
        ctx:write(msg):add_listener(function(w)
          if not w:is_success() then
            _G.failed = _G.failed or {}
            _G.failed[#_G.failed + 1] = tostring(w:cause())
          end
        end)
      end,
      channel_read_complete = function(_, ctx) ctx:flush() end,
      exception_caught = Big.exception_caught,
    }
    local group, port, loop = serve(function(ch) ch:pipeline():add_last("echo", Echo) end)
    local c = H.client(port)
    c:settimeout(0.5)
    H.flood(c, string.rep("e", 65536), 8 * 1024 * 1024)
    assert.is_true(H.eventually(function() return channels(loop) == 1 end, 5),
                   "channels left: " .. channels(loop))
    local r = recorded(loop)
    assert.are.equal(1, #r.caught)
    assert.matches("send timeout", r.caught[1])
    assert.is_true(#r.failed >= 1)
    for _, cause in ipairs(r.failed) do assert.matches("send timeout", cause) end
    c:close()
    H.shutdown(group)
  end)

  it("is set and read with ch:option, and 0 turns it off", function()
    local seen = netrun.promise()
    local group, port, loop = serve(function(ch)
      ch:pipeline():add_last("echo", {
        channel_active = function(_, ctx)
          local before = ctx.channel:option("send_timeout")
          ctx.channel:option("send_timeout", 0)
          seen:set_success({ before, ctx.channel:option("send_timeout") })
        end,
        channel_read = function(_, ctx, msg) ctx:write(msg) end,
        channel_read_complete = function(_, ctx) ctx:flush() end,
      })
    end)
    local c = H.client(port)
    c:settimeout(0.5)
    local v = H.sync(seen)
    assert.same({ 1, 0 }, v)
    H.flood(c, string.rep("e", 65536), 8 * 1024 * 1024)
    -- stuck for twice the timeout it had: still there
    local t0 = socket.gettime()
    H.eventually(function() return socket.gettime() - t0 > 2 end, 3)
    assert.are.equal(2, channels(loop))
    c:close()
    assert.is_true(H.eventually(function() return channels(loop) == 1 end, 5))
    H.shutdown(group)
  end)

  it("defaults to 60 s for a server's children, none for connects", function()
    local group = netrun.group { threads = 1, name = "sendto-dflt" }
    local seen = netrun.promise()
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("x", { channel_active = function(_, ctx)
          seen:set_success(ctx.channel:option("send_timeout"))
        end })
      end,
    }:sync()
    local _, port = server:local_address()
    local client = H.sync(netrun.connect { group = group, port = port })
    assert.are.equal(60, H.sync(seen))
    assert.are.equal(0, group:loops()[1]:submit(function(ch)
      return ch:option("send_timeout")
    end, client):sync())
    assert.has_error(function()
      netrun.server { group = group, port = 0, child_options = { send_timeout = -1 } }
    end)
    client:close():sync()
    H.shutdown(group)
  end)

  it("resets a graceful close stuck on a peer that never reads", function()
    local Closer = {
      channel_read = function(_, ctx)
        if ctx.channel:attr("sent") then return end   -- the rest stays unread
        ctx.channel:attr("sent", true)
        ctx:write_and_flush(string.rep("c", 8 * 1024 * 1024)):add_listener(function(w)
          _G.failed = _G.failed or {}
          _G.failed[#_G.failed + 1] = tostring(w:cause())
        end)
        ctx:close()                    -- waits for the bytes: 30 s at most
      end,
      exception_caught = Big.exception_caught,
      channel_inactive = function() _G.inactive = (_G.inactive or 0) + 1 end,
    }
    local group, port, loop = serve(function(ch) ch:pipeline():add_last("c", Closer) end)
    local c = H.client(port)
    c:send("go and some input nobody reads")
    H.recv(c, 1)                     -- the answer began: then nothing is read
    local t0 = socket.gettime()
    assert.is_true(H.eventually(function() return channels(loop) == 1 end, 5),
                   "channels left: " .. channels(loop))
    local took = socket.gettime() - t0
    assert.is_true(took > 0.8 and took < 4, "closed after " .. took .. " s")
    local r = recorded(loop)
    assert.same({ 1 }, { #r.caught })
    assert.same({ 1 }, { #r.failed })
    assert.matches("send timeout", r.failed[1])
    assert.are.equal(1, loop:submit(function() return _G.inactive end):sync())
    c:close()
    H.shutdown(group)
  end)

  it("closes a TLS client that never reads its answers", function()
    local dir = H.tmpdir()
    assert(H.run("bash " .. H.root .. "/spec/fixtures/tls/make_certs.sh " .. dir))
    local tls = netrun.tls.server { cert = dir .. "/server.crt", key = dir .. "/server.key" }
    local group = netrun.group { threads = 1, name = "sendto-tls" }
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0, tls = tls,
      child_options = { send_timeout = 1 }, init = http,
    }:sync()
    local _, port = server:local_address()
    local loop = group:loops()[1]
    -- a netrun TLS client that stops reading once the handshake is done
    local clients = netrun.group { threads = 1, name = "sendto-tlsc" }
    local ch = H.sync(netrun.connect {
      group = clients, host = "127.0.0.1", port = port,
      tls = netrun.tls.client { verify = false },
      init = function(c)
        c:pipeline():add_last("stuck", { user_event_triggered = function(_, ctx, e)
          if e.tls == "handshake" then
            ctx.channel:option("auto_read", false)
            ctx:write_and_flush(string.rep("GET / HTTP/1.1\r\nHost: x\r\n\r\n", 20))
          end
        end })
      end,
    })
    assert.is_true(H.eventually(function() return #recorded(loop).caught == 1 end, 5))
    assert.matches("send timeout", recorded(loop).caught[1])
    assert.is_true(H.eventually(function() return channels(loop) == 1 end, 5))
    H.sync(ch:close_future())
    H.shutdown(clients)
    H.shutdown(group)
  end)

  it("closes a stuck channel during a graceful shutdown", function()
    local group, port = serve(http)
    local stuck = H.client(port)
    stuck:send(string.rep("GET / HTTP/1.1\r\nHost: x\r\n\r\n", 20))
    H.recv(stuck, 1)                 -- being answered
    local t0 = socket.gettime()
    group:shutdown_gracefully(0, 30):sync()
    local took = socket.gettime() - t0
    assert.is_true(took < 4, "shutdown took " .. took .. " s")
    stuck:close()
  end)
end)
