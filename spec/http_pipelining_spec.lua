-- http_pipelining_spec.lua -- pipelined HTTP/1.1 requests are answered in
-- the order they came (RFC 9112 9.3.2) whatever order the handler answers
-- them in: an answer written while a request is handled is that request's,
-- one written later is the oldest owed one's, and answers for requests
-- behind one still owed are held (bounded: the channel's water marks) and
-- sent in turn. Raw LuaSocket clients, so the bytes on the wire are seen.
local H = require "spec.helper"
local netrun = H.netrun

local function get(path, extra, method)
  return (method or "GET") .. " " .. path .. " HTTP/1.1\r\nHost: a\r\n" .. (extra or "") .. "\r\n"
end

-- The app: a path says how its request is answered.
--   /late<ms>   from a timer, after ms (body: the path)
--   /lateclose  from a timer, with Connection: close
--   /stream     a streamed answer: its head and a chunk at once, the rest
--               from a timer 0.2 s later
--   /boom       raises
--   /big<n>     at once, 128 KiB of body (the answers a slow request holds)
--   /count      from a timer 0.4 s later: how many requests were handled
--   else        at once (body: the path)
local App = {}
function App:channel_read(ctx, req)
  _G.handled = (_G.handled or 0) + 1
  local path = req.path
  local loop = ctx.channel:loop()
  local ms = path:match("^/late(%d+)$")
  if ms then
    loop:schedule(tonumber(ms) / 1000, function()
      ctx:write_and_flush { status = 200, body = path }
    end)
  elseif path == "/lateclose" then
    loop:schedule(0.1, function()
      ctx:write_and_flush { status = 200, headers = { connection = "close" }, body = path }
    end)
  elseif path == "/stream" then
    ctx:write { status = 200, stream = true }
    ctx:write("one;")
    loop:schedule(0.2, function()
      ctx:write("two;")
      ctx:write_and_flush(false)
    end)
  elseif path == "/boom" then
    error("boom on purpose")
  elseif path:match("^/big%d+$") then
    ctx:write { status = 200, body = path .. ("."):rep(128 * 1024) }
  elseif path == "/count" then
    _G.handled = 1                           -- counting from here
    loop:schedule(0.4, function()
      ctx:write_and_flush { status = 200, body = tostring(_G.handled) }
    end)
  else
    ctx:write { status = 200, body = path .. " " .. req.method }
  end
end
function App:channel_read_complete(ctx) ctx:flush() end

local function serve()
  local group = netrun.group { threads = 1, name = "pipelining" }
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0,
    init = function(ch)
      ch:pipeline():add_last("http", netrun.codec.http_server {})
      ch:pipeline():add_last("app", App)
    end,
  }:sync()
  local _, port = server:local_address()
  return group, port
end

-- The next n answers' bodies (HEAD's: its content-length, in brackets).
local function bodies(c, n, heads)
  local got = {}
  for i = 1, n do
    local status, headers, body = H.read_response(c, heads and heads[i])
    got[i] = heads and heads[i] and "[" .. headers["content-length"] .. "]"
             or status == 200 and body or status .. " " .. body
  end
  return got
end

local function assert_eof(c)
  c:settimeout(H.sanitized and 10 or 3)
  local data, err, partial = c:receive("*a")
  assert.equal("", data or partial, "bytes after the close")
  assert.is_true(data ~= nil or err == "closed")
end

describe("pipelined HTTP requests", function()
  local group, port
  setup(function() group, port = serve() end)
  teardown(function() H.shutdown(group) end)

  it("keep their order when the first is answered last", function()
    local c = H.client(port)
    c:send(get("/late150") .. get("/a") .. get("/b"))
    assert.same({ "/late150", "/a GET", "/b GET" }, bodies(c, 3))
    c:send(get("/again"))                      -- the connection goes on
    assert.same({ "/again GET" }, bodies(c, 1))
    c:close()
  end)

  it("hold a streamed answer behind an earlier one, and stream on once it is out", function()
    local c = H.client(port)
    c:send(get("/late100") .. get("/stream") .. get("/c"))
    assert.same({ "/late100", "one;two;", "/c GET" }, bodies(c, 3))
    c:close()
  end)

  it("answer a HEAD in the middle without its body", function()
    local c = H.client(port)
    c:send(get("/late100") .. get("/h", nil, "HEAD") .. get("/d"))
    assert.same({ "/late100", "[" .. #"/h HEAD" .. "]", "/d GET" },
                bodies(c, 3, { false, true, false }))
    c:close()
  end)

  it("give a raising handler's 500 to its own request", function()
    local c = H.client(port)
    c:send(get("/late100") .. get("/boom") .. get("/e"))
    assert.same({ "/late100", "500 Internal Server Error\n", "/e GET" }, bodies(c, 3))
    c:close()
  end)

  it("close after an earlier answer that closes, dropping the answers held behind it", function()
    local c = H.client(port)
    c:send(get("/lateclose") .. get("/f") .. get("/g"))
    local status, headers, body = H.read_response(c)
    assert.same({ 200, "close", "/lateclose" }, { status, headers.connection, body })
    assert_eof(c)                              -- /f and /g were never answered
    c:close()
  end)

  it("close after a request that asks to, answered in its turn", function()
    local c = H.client(port)
    c:send(get("/late100") .. get("/bye", "Connection: close\r\n") .. get("/never"))
    local got = bodies(c, 2)
    assert.same({ "/late100", "/bye GET" }, got)
    assert_eof(c)
    c:close()
  end)

  -- Two answers written later, from timers, in the reverse order: the one
  -- written first is taken for the oldest request owed (the rule; a
  -- handler that answers deferred requests out of order keeps their order
  -- itself, e.g. by writing each once those before it are written).
  it("take an answer written later for the oldest request owed", function()
    local c = H.client(port)
    c:send(get("/late250") .. get("/late50"))
    assert.same({ "/late50", "/late250" }, bodies(c, 2))
    c:close()
  end)

  -- A client that pipelines behind a slow request and reads nothing: the
  -- held answers turn the channel unwritable past write_buffer_high, and
  -- the codec handles no further request until they have gone. /count
  -- tells, when answered 0.4 s on, how many requests had been handled;
  -- without the bound all 41 were, and 40 answers of 128 KiB held (5 MiB).
  it("hold a bounded amount behind a slow request from a client that reads nothing", function()
    local c = H.client(port)
    local reqs = { get("/count") }
    for i = 1, 40 do reqs[#reqs + 1] = get("/big" .. i) end
    c:send(table.concat(reqs))
    local status, _, body = H.read_response(c)
    assert.equal(200, status)
    local handled = tonumber(body)
    assert.is_true(handled >= 2 and handled <= 3,
      "requests handled while the slow one was owed: " .. handled)
    for i = 1, 40 do                           -- then all, in order
      local st, _, b = H.read_response(c)
      assert.equal(200, st)
      assert.equal("/big" .. i, b:sub(1, #("/big" .. i)))
      assert.equal(#("/big" .. i) + 128 * 1024, #b)
    end
    c:close()
  end)
end)
