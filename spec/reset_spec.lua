-- reset_spec.lua -- peers that reset (SO_LINGER 0) right after sending:
-- the server reads a request, answers, and its write or flush meets a
-- connection already gone, which closes the channel from inside the
-- handler or codec that wrote. Every codec and every write path is
-- stormed; the sanitizer builds run this file too, so a handler state
-- freed while still in use fails here. After each storm the server still
-- answers a normal client and holds no channel.
local H = require "spec.helper"
local netrun, socket = H.netrun, H.socket

local CYCLES = 600          -- per payload; each cycle is one connection
local BUDGET = 30           -- seconds for one storm, whatever the machine

-- Connect, send, reset. Returns how many cycles ran.
local function storm(port, payloads)
  local deadline = socket.gettime() + BUDGET
  local n = 0
  for i = 1, CYCLES * #payloads do
    if socket.gettime() > deadline then break end
    local c = socket.tcp()
    c:settimeout(2)
    if c:connect("127.0.0.1", port) then
      c:send(payloads[i % #payloads + 1])
      c:setoption("linger", { on = true, timeout = 0 })
      n = n + 1
    end
    c:close()
  end
  return n
end

local function serve(init)
  local group = netrun.group { threads = 1, name = "reset" }
  local server = netrun.server { group = group, host = "127.0.0.1", port = 0, init = init }:sync()
  local _, port = server:local_address()
  return group, port
end

-- Every channel of the storm is gone: closed, torn down, released; the
-- loop holds only its listener.
local function settled(group)
  local loop = group:loops()[1]
  assert.is_true(H.eventually(function() return loop:stats().channels == 1 end, 15),
                 "channels left: " .. loop:stats().channels)
end

local Prepared = netrun.codec.http_response {
  status = 200, headers = { ["content-type"] = "text/plain" }, body = "prepared",
}

local App = {}
function App:channel_read(ctx, req)
  if req.path == "/prepared" then
    ctx:write(Prepared)
  elseif req.path == "/stream" then
    ctx:write { status = 200, stream = true }
    for i = 1, 4 do ctx:write(string.rep("s", 100 * i)) end
    ctx:write(false)
  elseif req.path == "/big" then
    ctx:write { status = 200, body = string.rep("b", 256 * 1024) }
  elseif req.path == "/future" then
    ctx:write_and_flush({ status = 200, body = "f" }):add_listener(function(f)
      if not f:is_success() then ctx:close() end
    end)
  else
    ctx:write { status = 200, body = "table " .. req.path }
  end
end
function App:channel_read_complete(ctx) ctx:flush() end
function App:exception_caught(ctx) ctx:close() end

describe("peers that reset right after sending", function()
  it("never break the HTTP codec: error answers, closes, every response kind", function()
    local group, port = serve(function(ch)
      ch:pipeline():add_last("http", netrun.codec.http_server { max_body = 16 })
      ch:pipeline():add_last("app", App)
    end)
    local get = function(path, extra)
      return "GET " .. path .. " HTTP/1.1\r\nHost: a\r\n" .. (extra or "") .. "\r\n"
    end
    local n = storm(port, {
      "hello\n",                                                  -- 400
      get("/x", "Connection: close\r\n"),                         -- close after response
      get("/prepared"), get("/stream"), get("/big"), get("/future"),
      get("/x", "Connection: close\r\n"):rep(1) .. get("/y"),     -- close, then more
      "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99\r\n\r\n", -- 413
      get("/a") .. get("/prepared") .. get("/stream") .. "bad\n", -- pipelined, then 400
      "GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n",
    })
    assert.is_true(n > 100)
    settled(group)
    local c = H.client(port)
    c:send(get("/after"))
    local status, _, body = H.read_response(c)
    assert.are.equal(200, status)
    assert.are.equal("table /after", body)
    c:close()
    H.shutdown(group)
  end)

  it("never break RESP or the frame decoders", function()
    local group, port = serve(function(ch)
      ch:pipeline():add_last("frame", netrun.codec.line { max_length = 32 })
      ch:pipeline():add_last("app", {
        channel_read = function(_, ctx, line)
          if line == "close" then
            ctx:write_and_flush("bye\n")
            ctx:close()
          else
            ctx:write(line .. "\n")
          end
        end,
        channel_read_complete = function(_, ctx) ctx:flush() end,
        exception_caught = function(_, ctx, err)
          ctx:write_and_flush("ERR " .. err .. "\n")
          ctx:close()
        end,
      })
    end)
    local n = storm(port, {
      "a\nb\nc\n", "close\n", ("x"):rep(100) .. "\n", ("line\n"):rep(64) .. "close\n",
    })
    assert.is_true(n > 100)
    settled(group)
    local c = H.client(port)
    c:send("after\n")
    assert.are.equal("after", c:receive("*l"))
    c:close()
    H.shutdown(group)

    group, port = serve(function(ch)
      ch:pipeline():add_last("resp", netrun.codec.resp())
      ch:pipeline():add_last("app", {
        channel_read = function(_, ctx, cmd)
          if cmd[1] == "QUIT" then
            ctx:write_and_flush("+OK\r\n")
            ctx:close()
          else
            ctx:write("+PONG\r\n")
          end
        end,
        channel_read_complete = function(_, ctx) ctx:flush() end,
        exception_caught = function(_, ctx) ctx:close() end,
      })
    end)
    n = storm(port, {
      ("*1\r\n$4\r\nPING\r\n"):rep(16), "*1\r\n$4\r\nQUIT\r\n", "*x\r\n", "PING\r\nPING\r\n",
    })
    assert.is_true(n > 100)
    settled(group)
    c = H.client(port)
    c:send("*1\r\n$4\r\nPING\r\n")
    assert.are.equal("+PONG", c:receive("*l"))
    c:close()
    H.shutdown(group)
  end)

  it("let a handler that closed go on until its call returns", function()
    -- channel_inactive comes after the handler call that closed, as in
    -- Netty: the handler's own state is still there when close returns.
    local group, port = serve(function(ch)
      local events = {}
      ch:pipeline():add_last("app", {
        channel_read = function(_, ctx)
          ctx:close()
          events[#events + 1] = "closed"
          events[#events + 1] = "open=" .. tostring(ctx.channel:is_open())
        end,
        channel_inactive = function(_, ctx)
          events[#events + 1] = "inactive"
          netrun.shared.dict("reset_events"):set("events", table.concat(events, ","))
        end,
      })
    end)
    local c = H.client(port)
    c:send("x")
    assert.are.equal(nil, select(1, c:receive(1)))   -- closed by the server
    c:close()
    local d = netrun.shared.dict("reset_events")
    H.eventually(function() return d:get("events") end)
    assert.are.equal("closed,open=false,inactive", d:get("events"))
    H.shutdown(group)
  end)

  -- Netty's habit: answer an error with a response from exception_caught.
  -- A reset reaches exception_caught with no request in flight, so that
  -- response fails at once, inside exception_caught: it must go past the
  -- handler (to the tail, logged), not into exception_caught again -- that
  -- recursed until Lua's C stack overflowed and spun the loop for good.
  it("let exception_caught answer with a response whose write fails at once", function()
    local calls = netrun.shared.dict("reset_calls")
    local group, port = serve(function(ch)
      ch:pipeline():add_last("http", netrun.codec.http_server {}):add_last("app", {
        channel_read = function(_, ctx, req) ctx:write { status = 200, body = "ok" } end,
        channel_read_complete = function(_, ctx) ctx:flush() end,
        exception_caught = function(_, ctx, err)
          netrun.shared.dict("reset_calls"):incr(tostring(err):match("ECONNRESET") and "reset" or "other", 1, 0)
          ctx:write { status = 500, body = "error: " .. tostring(err) }
          ctx:flush()
        end,
      })
    end)
    local n = storm(port, { "GET /a HTTP/1.1\r\nHost: h\r\n\r\n", "GET /b HTTP/1.1\r\nHo" })
    assert.is_true(n > 0)
    settled(group)
    assert.is_nil(calls:get("other"))              -- each handler saw its reset, once
    assert.is_true((calls:get("reset") or 0) <= n)
    local c = H.client(port)                       -- and the loop still serves
    c:send("GET /after HTTP/1.1\r\nHost: h\r\n\r\n")
    assert.equal("HTTP/1.1 200 OK", c:receive("*l"))
    c:close()
    H.shutdown(group)
  end)
end)
