-- http_raise_spec.lua -- a request whose handler raises is answered with
-- a 500 in its turn, so no later answer is ever taken for it (a response
-- desync behind a proxy that reuses connections); the connection goes on.
local H = require "spec.helper"
local netrun = H.netrun

local App = {}
function App:channel_read(ctx, req)
  if req.path == "/boom" then error("boom on purpose") end
  if req.path == "/slow" then
    netrun.spawn(function()
      netrun.sleep(0.05)
      ctx:write_and_flush { status = 200, body = "late /slow" }
    end)
    return
  end
  if req.path == "/stream-boom" then
    ctx:write_and_flush { status = 200, stream = true }
    ctx:write_and_flush("first part")
    error("boom mid-stream")
  end
  local n = req.path:match("^/big(%d+)$")
  if n then                       -- big answers: the batch stalls on them
    ctx:write_and_flush { status = 200, body = ("big " .. n):rep(200000) }
    return
  end
  ctx:write { status = 200, body = "ok " .. req.path }
end
function App:channel_read_complete(ctx) ctx:flush() end

-- The same, with an exception_caught that answers by itself.
local Answers = setmetatable({}, { __index = App })
Answers.channel_read, Answers.channel_read_complete = App.channel_read, App.channel_read_complete
function Answers:exception_caught(ctx, err)
  ctx:write { status = 503, body = "caught" }
end

local function serve(handler)
  local group = netrun.group { threads = 1, name = "raise" }
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0,
    init = function(ch)
      ch:pipeline():add_last("http", netrun.codec.http_server {})
      ch:pipeline():add_last("app", handler)
    end,
  }:sync()
  local _, port = server:local_address()
  return group, port
end

local function get(path, extra)
  return "GET " .. path .. " HTTP/1.1\r\nHost: a\r\n" .. (extra or "") .. "\r\n"
end

describe("a handler that raises on an HTTP request", function()
  it("gets a 500 in that request's turn, pipelined or not", function()
    local group, port = serve(App)
    local c = H.client(port)
    c:send(get("/a") .. get("/boom") .. get("/b"))
    local s1, _, b1 = H.read_response(c)
    local s2, h2, b2 = H.read_response(c)
    local s3, _, b3 = H.read_response(c)
    assert.are.same({ 200, "ok /a" }, { s1, b1 })
    assert.are.same({ 500, "Internal Server Error\n" }, { s2, b2 })
    assert.are.equal(nil, h2.connection)                 -- keep-alive goes on
    assert.are.same({ 200, "ok /b" }, { s3, b3 })
    c:send(get("/boom"))                                  -- alone in its read
    assert.are.equal(500, (H.read_response(c)))
    c:send(get("/c"))
    local s4, _, b4 = H.read_response(c)
    assert.are.same({ 200, "ok /c" }, { s4, b4 })
    c:close()
    H.shutdown(group)
  end)

  it("keeps the order when an earlier answer comes later", function()
    local group, port = serve(App)
    local c = H.client(port)
    -- /boom raises first; its 500 waits for the answer owed before it
    c:send(get("/slow") .. get("/boom"))
    local got = {}
    for i = 1, 2 do
      local status, _, body = H.read_response(c)
      got[i] = status .. " " .. body
    end
    assert.are.same({ "200 late /slow", "500 Internal Server Error\n" }, got)
    c:send(get("/ok"))
    assert.are.equal("ok /ok", select(3, H.read_response(c)))
    c:close()
    H.shutdown(group)
  end)

  it("gets its 500 in turn among reads held while the channel was unwritable", function()
    local group, port = serve(App)
    local c = H.client(port)
    local reqs = {}
    for i = 1, 12 do reqs[i] = get(i == 9 and "/boom" or "/big" .. i) end
    c:send(table.concat(reqs))                  -- and read nothing yet
    for i = 1, 12 do
      local status, _, body = H.read_response(c)
      if i == 9 then
        assert.are.equal(500, status)
      else
        assert.are.equal(200, status)
        assert.are.equal(("big " .. i):rep(200000), body)
      end
    end
    c:close()
    H.shutdown(group)
  end)

  it("answers nothing more when exception_caught answered", function()
    local group, port = serve(Answers)
    local c = H.client(port)
    c:send(get("/boom") .. get("/ok"))
    local s1, _, b1 = H.read_response(c)
    local s2, _, b2 = H.read_response(c)
    assert.are.same({ 503, "caught", 200, "ok /ok" }, { s1, b1, s2, b2 })
    c:close()
    H.shutdown(group)
  end)

  it("answers HEAD with a bare 500, and an Upgrade request too", function()
    local group, port = serve(App)
    local c = H.client(port)
    c:send("HEAD /boom HTTP/1.1\r\nHost: a\r\n\r\n")
    local status, headers = H.read_response(c, true)
    assert.are.equal(500, status)
    assert.are.equal("22", headers["content-length"])
    c:send(get("/boom", "Connection: upgrade\r\nUpgrade: x\r\n"))  -- delivered on its own
    assert.are.equal(500, (H.read_response(c)))
    c:close()
    H.shutdown(group)
  end)

  it("closes a connection whose streamed answer had begun", function()
    local group, port = serve(App)
    local c = H.client(port)
    c:send(get("/stream-boom") .. get("/ok"))
    local line = c:receive("*l")
    assert.are.equal("HTTP/1.1 200 OK", line)
    local rest = c:receive("*a")                          -- to EOF
    assert.is_truthy(rest:find("first part", 1, true))
    assert.is_falsy(rest:find("ok /ok", 1, true))
    assert.is_falsy(rest:find("0\r\n\r\n", 1, true))     -- no final chunk
    c:close()
    H.shutdown(group)
  end)
end)

-- The same guarantee whatever stands between the codec and the app: the
-- netrun.handler.metrics of docs/guide/operating.md, Lua middleware that passes requests on
-- (as they are, wrapped in a new table, later from a task or a future's
-- listener), native handlers, several of them, a handler on an executor
-- group; a real netrun process and curl (one connection: /boom, /ok, /boom).
describe("a handler that raises behind other handlers", function()
  local FIXTURE = "spec/fixtures/middleware_app.lua"

  for _, front in ipairs { "metrics", "lua", "wrap", "native", "chain", "async", "listener",
                           "executor_front", "executor_app" } do
    it("gets its 500 with " .. front .. " in front", function()
      local port = H.free_port()
      local pid, log = H.start(FIXTURE, port, "--front " .. front)
      local url = "http://127.0.0.1:" .. port
      local out, st = H.run(string.format("curl -s --max-time 5 -o /dev/null -o /dev/null -o /dev/null "
        .. "-w '%%{http_code} %%{num_connects}\\n' %s/boom %s/ok %s/boom", url, url, url))
      assert.equal(0, st, out)
      assert.equal("500 1\n200 0\n500 0\n", out)          -- in turn, on one connection
      assert.is_true(H.stop(pid))
      os.remove(log)
    end)
  end

  it("survives clients that reset while their 500 is written, behind middleware", function()
    local group = netrun.group { threads = 1, name = "raise-rst" }
    local Pass = { channel_read = function(_, ctx, req) ctx:fire_channel_read(req) end }
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("http", netrun.codec.http_server {})
        ch:pipeline():add_last("metrics", netrun.handler.metrics {})
        ch:pipeline():add_last("pass", Pass)
        ch:pipeline():add_last("app", App)
      end,
    }:sync()
    local _, port = server:local_address()
    for _ = 1, 50 do
      local c = H.client(port)
      c:send(get("/boom") .. get("/boom") .. get("/a"))
      c:setoption("linger", { on = true, timeout = 0 })
      c:close()                                     -- a reset, not a FIN
    end
    local c = H.client(port)
    c:send(get("/boom") .. get("/ok"))
    assert.equal(500, (H.read_response(c)))
    assert.equal("ok /ok", select(3, H.read_response(c)))
    c:close()
    H.eventually(function() return group:loops()[1]:stats().channels == 1 end)
    server:close():sync()
    H.shutdown(group)
  end)

  it("lets SIGTERM stop the server at once after it (no request left owed)", function()
    local port = H.free_port()
    local pid, log = H.start(FIXTURE, port, "--front metrics")
    local c = H.client(port)
    c:send(get("/boom"))
    assert.is_truthy(H.eventually(function() return H.read_file(log):find("boom on purpose", 1, true) end))
    local t0 = H.socket.gettime()
    assert.is_true(H.stop(pid))                    -- not the 15 s shutdown timeout
    local took = H.socket.gettime() - t0
    assert.is_true(took < (H.sanitized and 3 or 1.5), string.format("took %.2f s", took))
    assert.equal(500, (H.read_response(c)))
    assert.is_nil((c:receive(1)))                  -- then closed by the shutdown
    c:close()
    os.remove(log)
  end)
end)
