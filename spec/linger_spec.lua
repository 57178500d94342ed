-- linger_spec.lua -- a graceful close delivers what the server accepted
-- (nginx's lingering close): closing a socket whose peer sent bytes the
-- server never read makes the kernel reset the connection, and the reset
-- destroys what the peer had not read yet. The server writes more than the
-- socket buffers of both sides hold, so its close comes while the client
-- is still reading -- and after the client sent bytes nobody reads.
local H = require "spec.helper"
local netrun = H.netrun

local SIZE = 24 * 1024 * 1024   -- past loopback's send + receive buffers

local function serve(handler)
  local group = netrun.group { threads = 1, name = "linger" }
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0,
    init = function(ch) ch:pipeline():add_last("app", handler) end,
  }:sync()
  local _, port = server:local_address()
  return group, port
end

-- Send "go", wait for the first byte, send what the server will not read,
-- then read to EOF; returns bytes received and how the read ended.
local function fetch(port, after_first)
  local c = H.client(port)
  c:send("go\n")
  local first = H.recv(c, 1)
  c:send(string.rep("unread input ", 1000))
  if after_first then after_first() end
  local got, err = #first, nil
  while true do
    local data, e, partial = c:receive(65536)
    got = got + #(data or partial or "")
    if not data then err = e break end
  end
  c:close()
  return got, err
end

-- A server that reads nothing (auto_read off from the start), so what a
-- peer sends stays unread; its channels are in `members`.
local function serve_unread()
  local members = netrun.channel_group()
  local group, port = serve({
    channel_active = function(_, ctx)
      ctx.channel:option("auto_read", false)
      members:add(ctx.channel)
    end,
  })
  return group, port, members
end

local function writer(close)
  return {
    channel_read = function(_, ctx)
      if ctx.channel:attr("sent") then return end   -- the rest stays unread
      ctx.channel:attr("sent", true)
      ctx:write_and_flush(string.rep("x", SIZE))
      if close then ctx:close() end
    end,
  }
end

describe("a graceful close", function()
  it("delivers a large last write to a peer whose input the server left unread", function()
    local group, port = serve(writer(true))
    local got, err = fetch(port)
    assert.are.equal("closed", err)
    assert.are.equal(SIZE, got)
    H.shutdown(group)
  end)

  it("at shutdown, delivers what a slow reader was sent before it", function()
    local group, port = serve(writer(false))
    local done
    local got, err = fetch(port, function() done = group:shutdown_gracefully(0, 10) end)
    assert.are.equal("closed", err)
    assert.are.equal(SIZE, got)
    H.sync(done, 15)
    assert.is_true(group:is_terminated())
  end)

  it("lets a peer that never closes go after the linger", function()
    local group, port, members = serve_unread()
    local loop = group:loops()[1]
    local c = H.client(port)
    c:send("unread")
    assert.is_true(H.eventually(function() return #members == 1 end))
    assert.are.equal(2, loop:stats().channels)      -- the listener and c's
    H.sync(members:write_and_flush("bye"))
    H.sync(members:close())
    assert.are.equal("bye", c:receive(3))
    local data, err = c:receive(1)
    assert.are.equal(nil, data)
    assert.are.equal("closed", err)
    -- c neither closes nor sends: the server lets go within the linger
    assert.is_true(H.eventually(function() return loop:stats().channels == 1 end, 10))
    c:close()
    H.shutdown(group)
  end)

  it("at shutdown, lets a lingering peer that never closes go after the linger, not the timeout", function()
    local group, port, members = serve_unread()
    local c = H.client(port)
    c:send("unread")
    assert.is_true(H.eventually(function() return #members == 1 end))
    local t0 = H.socket.gettime()
    H.sync(group:shutdown_gracefully(0, 30), 40)    -- c neither reads nor closes
    local took = H.socket.gettime() - t0
    assert.is_true(took < 10, string.format("shutdown took %.1f s", took))
    c:close()
  end)

  it("closes an idle connection at once at shutdown", function()
    local group, port = serve({ channel_read = function(_, ctx, m) ctx:write_and_flush(m) end })
    local c = H.client(port)
    c:send("x")
    assert.are.equal("x", H.recv(c, 1))
    local t0 = H.socket.gettime()
    H.sync(group:shutdown_gracefully(0, 10))
    assert.is_true(H.socket.gettime() - t0 < 1, "shutdown waited for an idle peer")
    c:close()
  end)

  it("closes at once after a request that asked to close; lingers when the server closes", function()
    -- RFC 9112 9.6: a client that sends Connection: close sends nothing
    -- after it, so the close has nothing in flight to wait for (nginx);
    -- a close the server decides may meet requests still on their way
    local group = netrun.group { threads = 1, name = "linger-http" }
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("http", netrun.codec.http_server {})
        ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
          local close = req.path == "/bye" and "close" or nil
          ctx:write_and_flush({ status = 200, headers = { connection = close }, body = "ok" })
        end })
      end,
    }:sync()
    local _, port = server:local_address()
    local loop = group:loops()[1]
    local function ask(req)         -- the answer read; c left open, silent
      local c = H.client(port)
      c:send(req)
      local status = H.read_response(c)
      assert.are.equal(200, status)
      return c
    end
    local c = ask("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert.is_true(H.eventually(function() return loop:stats().channels == 1 end, 2),
      "the server held a connection whose client asked to close")
    c:close()
    c = ask("GET /bye HTTP/1.1\r\nHost: x\r\n\r\n")
    H.socket.sleep(0.3)   -- a lingering close holds its fd until the peer's FIN: it is still there
    assert.are.equal(2, loop:stats().channels)
    c:close()
    assert.is_true(H.eventually(function() return loop:stats().channels == 1 end, 5))
    H.shutdown(group)
  end)
end)
