-- http_spec.lua -- netrun.codec.http_server against real clients: curl for
-- what a user's client does (keep-alive, POST, chunked uploads,
-- 100-continue), raw LuaSocket connections for the protocol edges
-- (pipelining order, errors and closes, HTTP/1.0), and the two HTTP
-- examples run as `netrun examples/X.lua --port N`.
local H = require "spec.helper"
local netrun, socket = H.netrun, H.socket

-- A prepared response, made in this state and copied to the loop's with
-- the handler that writes it.
local Prepared = netrun.codec.http_response {
  status = 202, reason = "Taken", headers = { ["content-type"] = "text/plain", ["x-p"] = 1 },
  body = "prepared body",
}

-- The handler every in-process server runs: it describes the request.
local Describe = {}
function Describe:channel_read(ctx, req)
  if req.path == "/prepared" then
    ctx:write(Prepared)
    return
  end
  local names = {}
  for k in pairs(req.headers) do names[#names + 1] = k end
  table.sort(names)
  local hs = {}
  for _, k in ipairs(names) do hs[#hs + 1] = k .. "=" .. req.headers[k] end
  local ts = {}
  for k, v in pairs(req.trailers) do ts[#ts + 1] = k .. "=" .. v end
  table.sort(ts)
  if req.path == "/stream" then
    ctx:write { status = 200, stream = true, headers = { ["content-type"] = "text/plain" } }
    for i = 1, 3 do ctx:write("part " .. i .. ";") end
    ctx:write(false)
    return
  end
  if req.path == "/fields" then
    ctx:write { status = 201, reason = "Made It", body = 12345,
                headers = { ["set-cookie"] = { "a=1", "b=2" }, ["x-num"] = 1.5,
                            ["content-type"] = "text/plain" } }
    return
  end
  if req.path == "/slow-answer" then      -- a slow handler, not a slow client
    -- (the task is copied into this state: it finds ctx by a number)
    _G.slow, _G.slow_n = _G.slow or {}, (_G.slow_n or 0) + 1
    _G.slow[_G.slow_n] = { ctx, req.method }
    netrun.current():schedule(0.4, function(n)
      local c, method = _G.slow[n][1], _G.slow[n][2]
      _G.slow[n] = nil
      c:write { status = 200, body = "slow " .. method }
      c:flush()
    end, _G.slow_n)
    return
  end
  if req.path == "/bad-header" then
    ctx:write { status = 200, headers = { ["x-evil"] = "a\r\nInjected: 1" }, body = "no" }
    return
  end
  ctx:write {
    status = tonumber(req.headers["x-status"]) or 200,
    headers = { ["content-type"] = "text/plain", ["x-count"] = 7 },
    body = string.format("%s %s q=%s %s ka=%s ch=%d len=%d sum=%d hs=%s ts=%s",
      req.method, req.path, tostring(req.query), req.version,
      tostring(req.keep_alive), ctx.channel:id(), #req.body,
      (function(s) local n = 0 for i = 1, #s do n = (n + s:byte(i)) % 65536 end return n end)(req.body),
      table.concat(hs, ","), table.concat(ts, ",")),
  }
end
function Describe:channel_read_complete(ctx) ctx:flush() end
function Describe:exception_caught(ctx, err)
  ctx:write { status = 500, body = "handler error: " .. tostring(err) }
  ctx:flush()
end

local function serve(opts, app)     -- app: Describe unless given
  local group = netrun.group { threads = 1, name = "http" }
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0,
    init = function(ch)
      ch:pipeline():add_last("http", netrun.codec.http_server(opts or {}))
      ch:pipeline():add_last("app", app or Describe)
    end,
  }:sync()
  local _, port = server:local_address()
  return group, port
end

local run = H.run

local function tmpfile(content)
  local path = os.tmpname()
  local f = assert(io.open(path, "wb"))
  f:write(content)
  f:close()
  return path
end

local function checksum(s)
  local n = 0
  for i = 1, #s do n = (n + s:byte(i)) % 65536 end
  return n
end

local read_response = H.read_response

-- One GET answered with resp on the embedded codec channel ch: the bytes
-- written, but for the Date line.
local function answer_get(ch, resp)
  ch:write_inbound("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
  assert.equal(1, #ch:read_all_inbound())
  ch:write_outbound(resp)
  return (table.concat(ch:read_all_outbound()):gsub("\r\nDate: [^\r]*", ""))
end

local function assert_closed(c)
  local data, err = c:receive(1)
  assert.is_nil(data)
  assert.equal("closed", err)
end

describe("http_server with curl", function()
  local group, port
  before_each(function() group, port = serve { max_body = 4 << 20 } end)
  after_each(function() H.shutdown(group) end)

  it("answers GET with Server, Date and Content-Length, and reuses the connection", function()
    local url = "http://127.0.0.1:" .. port
    local out, st = run(string.format("curl -sS -i %s/a?x=1 %s/b", url, url))
    assert.equal(0, st)
    assert.matches("HTTP/1.1 200 OK\r\n", out, 1, true)
    assert.matches("Server: netrun\r\n", out, 1, true)
    assert.matches("Date: %a%a%a, %d%d %a%a%a %d%d%d%d %d%d:%d%d:%d%d GMT\r\n", out)
    assert.matches("x-count: 7\r\n", out, 1, true)
    local a = out:match("GET /a q=x=1 HTTP/1.1 ka=true ch=(%d+)")
    local b = out:match("GET /b q=nil HTTP/1.1 ka=true ch=(%d+)")
    assert.truthy(a and b, out)
    assert.equal(a, b)                  -- one keep-alive connection for both
    local len = out:match("Content%-Length: (%d+)\r\n")
    local body = out:match("\r\n\r\n(GET /a[^\n]-hs=[^\n]-)HTTP/1%.1") or ""
    assert.equal(tonumber(len), #body)
  end)

  it("receives POST bodies", function()
    local data = string.rep("0123456789", 5000)
    local path = tmpfile(data)
    local out, st = run(string.format("curl -sS --data-binary @%s http://127.0.0.1:%d/post", path, port))
    os.remove(path)
    assert.equal(0, st)
    assert.matches("^POST /post q=nil HTTP/1.1 ka=true ch=%d+ len=50000 sum=" .. checksum(data), out)
  end)

  it("receives chunked uploads with Transfer-Encoding: chunked", function()
    local data = string.rep("chunky bacon ", 20000)
    local path = tmpfile(data)
    local out, st = run(string.format(
      "curl -sS -H 'Transfer-Encoding: chunked' --data-binary @%s http://127.0.0.1:%d/up", path, port))
    os.remove(path)
    assert.equal(0, st)
    assert.matches("^POST /up q=nil HTTP/1.1 ka=true ch=%d+ len=" .. #data .. " sum=" .. checksum(data), out)
    assert.matches("transfer%-encoding=chunked", out)
  end)

  it("sends 100 Continue before reading a body with Expect: 100-continue", function()
    local data = string.rep("x", 100000)
    local path = tmpfile(data)
    local out, st = run(string.format(
      "curl -sS -v -H 'Expect: 100-continue' --expect100-timeout 30 --data-binary @%s http://127.0.0.1:%d/e",
      path, port))
    os.remove(path)
    assert.equal(0, st)
    assert.matches("< HTTP/1.1 100 Continue", out, 1, true)
    assert.matches("POST /e q=nil HTTP/1.1 ka=true ch=%d+ len=100000", out)
  end)

  it("lowercases header names and joins repeated ones", function()
    local out, st = run(string.format(
      "curl -sS -H 'X-Multi: one' -H 'x-MULTI: two' http://127.0.0.1:%d/h", port))
    assert.equal(0, st)
    assert.matches("x%-multi=one, two", out)
    assert.matches("user%-agent=curl/", out)
  end)

  it("streams a chunked response and leaves HEAD bodies out", function()
    local out, st = run(string.format("curl -sS -i http://127.0.0.1:%d/stream", port))
    assert.equal(0, st)
    assert.matches("Transfer-Encoding: chunked\r\n", out, 1, true)
    assert.matches("\r\n\r\npart 1;part 2;part 3;$", out)
    out, st = run(string.format("curl -sS -I http://127.0.0.1:%d/x", port))
    assert.equal(0, st)
    assert.matches("^HTTP/1.1 200 OK\r\n", out)
    assert.matches("Content%-Length: %d+\r\n", out)
    assert.not_matches("HEAD /x", out)
  end)
end)

describe("http_server on raw connections", function()
  local group, port
  before_each(function() group, port = serve { max_header = 1024, max_body = 1000 } end)
  after_each(function() H.shutdown(group) end)

  it("answers 16 pipelined requests in order on one connection", function()
    local c = H.client(port)
    local reqs = {}
    for i = 1, 16 do
      reqs[i] = string.format("GET /%d HTTP/1.1\r\nHost: x\r\n\r\n", i)
    end
    reqs[8] = "POST /8 HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
    assert(c:send(table.concat(reqs)))
    for i = 1, 16 do
      local status, _, body = read_response(c)
      assert.equal(200, status)
      assert.matches("^%u+ /" .. i .. " ", body)
    end
    -- still open: keep-alive
    assert(c:send("GET /again HTTP/1.1\r\nHost: h\r\n\r\n"))
    local _, _, body = read_response(c)
    assert.matches("^GET /again ", body)
    c:close()
  end)

  -- RFC 9112 9.3.2: answers in the order of the requests. Before the codec
  -- held a later request's answer, each answer was taken for the oldest
  -- request owed in the order written: /first /second /third went out as
  -- /second, /third, /first, each labelled for the wrong request (more in
  -- http_pipelining_spec.lua).
  it("answers pipelined requests in order when an earlier one is answered last", function()
    local Later = {}
    function Later:channel_read(ctx, req)
      local res = { status = 200, body = req.path }
      if req.path == "/first" then       -- answered from a timer, after the others
        ctx.channel:loop():schedule(0.2, function() ctx:write_and_flush(res) end)
      else
        ctx:write_and_flush(res)
      end
    end
    local g, p = serve({}, Later)
    local c = H.client(p)
    assert(c:send("GET /first HTTP/1.1\r\nHost: x\r\n\r\nGET /second HTTP/1.1\r\nHost: x\r\n\r\n"
      .. "GET /third HTTP/1.1\r\nHost: x\r\n\r\n"))
    local got = {}
    for i = 1, 3 do got[i] = select(3, read_response(c)) end
    c:close()
    H.shutdown(g)
    assert.same({ "/first", "/second", "/third" }, got)
  end)

  it("answers a malformed request line with 400 and closes", function()
    local c = H.client(port)
    assert(c:send("GET /ok HTTP/1.1\r\nHost: h\r\n\r\nNOT A REQUEST\r\n\r\n"))
    local status, _, body = read_response(c)
    assert.equal(200, status)
    assert.matches("^GET /ok", body)
    local headers
    status, headers, body = read_response(c)
    assert.equal(400, status)
    assert.equal("close", headers.connection)
    assert.equal("Bad Request\n", body)
    assert_closed(c)
    c:close()
  end)

  it("answers oversized headers with 431 and closes", function()
    local c = H.client(port)
    assert(c:send("GET / HTTP/1.1\r\nHost: h\r\nX-Big: " .. string.rep("a", 2000) .. "\r\n\r\n"))
    local status, headers = read_response(c)
    assert.equal(431, status)
    assert.equal("close", headers.connection)
    assert_closed(c)
    c:close()
  end)

  it("answers an oversized body with 413 and closes, Content-Length or chunked", function()
    local c = H.client(port)
    assert(c:send("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1001\r\n\r\n"))
    local status, headers = read_response(c)
    assert.equal(413, status)
    assert.equal("close", headers.connection)
    assert_closed(c)
    c:close()
    c = H.client(port)
    assert(c:send("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n" ..
                  "200\r\n" .. string.rep("b", 512) .. "\r\n" ..
                  "200\r\n" .. string.rep("b", 512) .. "\r\n0\r\n\r\n"))
    status = read_response(c)
    assert.equal(413, status)
    assert_closed(c)
    c:close()
  end)

  it("lets a refused upload finish before closing, so the 413 is not reset", function()
    local c = H.client(port)
    -- more than socket buffers hold: a server that closed at once would
    -- reset the connection under this send
    local big = string.rep("u", 8 << 20)
    assert(c:send("POST /up HTTP/1.1\r\nHost: h\r\nContent-Length: " .. #big .. "\r\n\r\n" .. big))
    local status, headers = read_response(c)
    assert.equal(413, status)
    assert.equal("close", headers.connection)
    assert_closed(c)
    c:close()
  end)

  -- pending under the fault shim: pipelined behind a close (see H.faults)
  it("closes after answering HTTP/1.0 without keep-alive, keeps it with", function()
    local c = H.client(port)
    assert(c:send("GET /old HTTP/1.0\r\n\r\nGET /ignored HTTP/1.0\r\n\r\n"))
    local status, headers, body = read_response(c)
    assert.equal(200, status)
    assert.equal("close", headers.connection)
    assert.matches("^GET /old q=nil HTTP/1.0 ka=false", body)
    assert_closed(c)
    c:close()
    c = H.client(port)
    assert(c:send("GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"))
    status, headers, body = read_response(c)
    assert.equal("keep-alive", headers.connection)
    assert(c:send("GET /b HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"))
    status, headers, body = read_response(c)
    assert.matches("^GET /b ", body)
    c:close()
  end)

  it("closes after a request with Connection: close", function()
    local c = H.client(port)
    assert(c:send("GET /last HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"))
    local status, headers = read_response(c)
    assert.equal(200, status)
    assert.equal("close", headers.connection)
    assert_closed(c)
    c:close()
  end)

  it("handles a request split across many writes", function()
    local c = H.client(port)
    local req = "PUT /slow?a=b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" ..
                "3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n"
    c:setoption("tcp-nodelay", true)     -- each piece its own segment
    for i = 1, #req, 7 do
      assert(c:send(req:sub(i, i + 6)))
    end
    local status, _, body = read_response(c)
    assert.equal(200, status)
    assert.matches("^PUT /slow q=a=b HTTP/1.1 ka=true ch=%d+ len=5 sum=" .. checksum("abcde"), body)
    -- the trailer is in req.trailers only, never among the headers
    assert.matches("hs=host=x,transfer%-encoding=chunked ts=x%-trailer=t$", body)
    c:close()
  end)

  it("streams to an HTTP/1.0 client unframed, ending with the close", function()
    local c = H.client(port)
    assert(c:send("GET /stream HTTP/1.0\r\n\r\n"))
    local status, headers = read_response(c)
    assert.equal(200, status)
    assert.equal("close", headers.connection)
    assert.is_nil(headers["transfer-encoding"])
    assert.is_nil(headers["content-length"])
    local body, err, partial = c:receive("*a")
    assert.equal("part 1;part 2;part 3;", body or partial, err)
    c:close()
  end)

  it("answers pipelined HEAD and GET in order, HEAD without a body", function()
    local c = H.client(port)
    assert(c:send("HEAD /h HTTP/1.1\r\nHost: h\r\n\r\nGET /g HTTP/1.1\r\nHost: h\r\n\r\n"))
    local status, headers = read_response(c, true)
    assert.equal(200, status)
    assert.truthy(tonumber(headers["content-length"]) > 0)
    local _, _, body = read_response(c)
    assert.matches("^GET /g ", body)
    c:close()
  end)

  it("writes a prepared response as often as asked, with Date, and no body for HEAD", function()
    local c = H.client(port)
    assert(c:send("GET /prepared HTTP/1.1\r\nHost: h\r\n\r\nHEAD /prepared HTTP/1.1\r\nHost: h\r\n\r\n" ..
                  "GET /prepared HTTP/1.0\r\n\r\n"))
    for i, head in ipairs { false, true, false } do
      local status, headers, body, line = read_response(c, head)
      assert.equal("HTTP/1.1 202 Taken", line)
      assert.equal(202, status)
      assert.equal("13", headers["content-length"])
      assert.equal("netrun", headers.server)
      assert.equal("1", headers["x-p"])
      assert.truthy(headers.date)
      assert.equal(head and "" or "prepared body", body)
      if i == 3 then assert.equal("close", headers.connection) end
    end
    assert_closed(c)             -- the HTTP/1.0 request asked for the close
    c:close()
  end)

  it("encodes reason, numeric body and header values, and repeated headers", function()
    local c = H.client(port)
    assert(c:send("GET /fields HTTP/1.1\r\nHost: h\r\n\r\n"))
    local line = assert(c:receive("*l"))
    assert.equal("HTTP/1.1 201 Made It", line)
    local cookies, headers = {}, {}
    while true do
      local l = assert(c:receive("*l"))
      if l == "" then break end
      local k, v = l:match("^([^:]+): (.*)$")
      if k == "set-cookie" then cookies[#cookies + 1] = v else headers[k:lower()] = v end
    end
    assert.same({ "a=1", "b=2" }, cookies)
    assert.equal("1.5", headers["x-num"])
    assert.equal("5", headers["content-length"])
    assert.equal("12345", H.recv(c, 5))
    c:close()
  end)

  it("refuses a response whose header carries CR LF (no injection)", function()
    local c = H.client(port)
    assert(c:send("GET /bad-header HTTP/1.1\r\nHost: h\r\n\r\n"))
    local status, headers, body = read_response(c)
    assert.equal(500, status)
    assert.is_nil(headers.injected)
    assert.matches("control character", body)
    c:close()
  end)
end)

-- Responses written in place in the outbound buffer (the codec's writes go
-- straight to the head) and through a scratch buffer (a handler between
-- them sees each write): the same bytes, but for the date. (A prepared
-- response and its table differ in the order of their headers: the spec
-- above compares them.)
local Variants = {
  plain = { status = 200, headers = { ["content-type"] = "text/plain" }, body = "Hello, World!" },
  reason = { status = 202, reason = "Taken", headers = { ["x-p"] = 1 }, body = "prepared body" },
  big = { status = 200, body = string.rep("0123456789abcdef", 400) },
  none = { status = 204, headers = { ["x-n"] = "1" }, body = "dropped" },
  empty = { status = 200 },
  dated = { status = 200, headers = { date = "Tue, 01 Jan 2030 00:00:00 GMT" }, body = "d" },
  closing = { status = 200, headers = { connection = "close" }, body = "bye" },
  server = { status = 200, headers = { server = "other", ["content-length"] = "1" }, body = "s" },
}
local PreparedVariants = {}
for k, v in pairs(Variants) do PreparedVariants[k] = netrun.codec.http_response(v) end

local Variant = {}
function Variant:channel_read(ctx, req)
  local kind, name = req.path:match("^/(%a+)/(%a+)$")
  ctx:write(kind == "prepared" and PreparedVariants[name] or Variants[name])
end
function Variant:channel_read_complete(ctx) ctx:flush() end

describe("http_server timeouts", function()
  local group
  after_each(function()
    if group then H.shutdown(group) end
    group = nil
  end)
  local function start(opts)
    local g, port = serve(opts)
    group = g
    return port
  end
  local function since(t0) return socket.gettime() - t0 end

  it("has nginx's defaults -- 60 s a head, 60 s between body reads, 75 s idle -- and checks them", function()
    assert.matches("max_headers = 64, header_timeout = 60, body_timeout = 60, keepalive_timeout = 75,",
                   tostring(netrun.codec.http_server {}), 1, true)
    assert.matches("header_timeout = 0.25, body_timeout = 0, keepalive_timeout = 1.5,",
                   tostring(netrun.codec.http_server { header_timeout = 0.25, body_timeout = 0,
                                                      keepalive_timeout = 1.5 }), 1, true)
    assert.matches("header_timeout = 1,", tostring(netrun.codec.http_server { header_timeout = "1" }))
    assert.has_error(function() netrun.codec.http_server { header_timeout = "soon" } end,
      'netrun.codec.http_server: header_timeout must be a number of seconds from 0 to 1e9, got "soon"')
    assert.has_error(function() netrun.codec.http_server { keepalive_timeout = -1 } end,
      "netrun.codec.http_server: keepalive_timeout must be a number of seconds from 0 to 1e9, got -1")
    assert.has_error(function() netrun.codec.http_server { max_headers = 513 } end,
      "netrun.codec.http_server: max_headers must be an integer from 1 to 512, got 513")
  end)

  it("answers a half-sent head with 408 and closes", function()
    local port = start { header_timeout = 0.2 }
    local c = H.client(port)
    local t0 = socket.gettime()
    assert(c:send("GET /half HTTP/1.1\r\nHost: h\r\nX-Partial: "))
    local status, headers, body = read_response(c)
    local took = since(t0)
    assert.equal(408, status)
    assert.equal("close", headers.connection)
    assert.equal("Request Timeout\n", body)
    assert_closed(c)
    c:close()
    assert.is_true(took > 0.18 and took < 3, "408 after " .. took .. " s")
  end)

  it("times a head from its first byte: one byte every 50 ms still gets 408 at the timeout", function()
    local port = start { header_timeout = 0.2 }
    local c = H.client(port)
    c:setoption("tcp-nodelay", true)      -- each byte its own segment
    local head = "GET /drip HTTP/1.1\r\nHost: h\r\nX-Drip: " .. string.rep("d", 100) .. "\r\n\r\n"
    local t0, sent = socket.gettime(), 0
    for i = 1, #head do
      assert(c:send(head:sub(i, i)))
      sent = i
      if socket.select({ c }, nil, 0.05)[1] then break end   -- the client's pace
    end
    local status, headers = read_response(c)
    local took = since(t0)
    assert.equal(408, status)
    assert.equal("close", headers.connection)
    assert_closed(c)
    c:close()
    assert.is_true(sent < 20, sent .. " bytes sent")
    assert.is_true(took > 0.18 and took < 1.5, "408 after " .. took .. " s")
  end)

  it("answers a body that stalls with 408 and closes, Content-Length or chunked", function()
    local port = start { body_timeout = 0.2 }
    for _, req in ipairs { "POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc",
                           "POST /b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
                           "POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n" } do
      local c = H.client(port)
      local t0 = socket.gettime()
      assert(c:send(req))
      local status, headers = read_response(c)
      local took = since(t0)
      assert.equal(408, status)
      assert.equal("close", headers.connection)
      assert_closed(c)
      c:close()
      assert.is_true(took > 0.18 and took < 3, "408 after " .. took .. " s")
    end
  end)

  it("times a body between two reads: a byte every 50 ms is not too slow", function()
    local port = start { body_timeout = 0.4, header_timeout = 0.4 }
    local c = H.client(port)
    c:setoption("tcp-nodelay", true)
    assert(c:send("POST /drip HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n"))
    for _ = 1, 10 do                       -- 0.5 s in all: more than a timeout
      socket.select(nil, nil, 0.05)
      assert(c:send("x"))
    end
    local status, _, body = read_response(c)
    assert.equal(200, status)
    assert.matches("^POST /drip .* len=10 ", body)
    c:close()
  end)

  it("closes an idle keep-alive connection after keepalive_timeout, silently", function()
    local port = start { keepalive_timeout = 0.2 }
    local c = H.client(port)
    assert(c:send("GET /1 HTTP/1.1\r\nHost: h\r\n\r\n"))
    assert.equal(200, (read_response(c)))
    local t0 = socket.gettime()
    assert_closed(c)                       -- no 408: nothing was asked
    local took = since(t0)
    c:close()
    assert.is_true(took > 0.18 and took < 3, "closed after " .. took .. " s")
  end)

  it("closes a connection that sends nothing after header_timeout, silently", function()
    local port = start { header_timeout = 0.2, keepalive_timeout = 5 }
    local c = H.client(port)
    local t0 = socket.gettime()
    assert_closed(c)
    local took = since(t0)
    c:close()
    assert.is_true(took > 0.18 and took < 3, "closed after " .. took .. " s")
  end)

  it("leaves a client that keeps within every timeout alone", function()
    local port = start { header_timeout = 1, body_timeout = 1, keepalive_timeout = 1 }
    local c = H.client(port)
    c:setoption("tcp-nodelay", true)
    for i = 1, 8 do                        -- about 3 s in all: three times each timeout
      socket.select(nil, nil, 0.12)        -- idle between requests
      assert(c:send("POST /" .. i .. " HTTP/1.1\r\nHost: h\r\n"))
      socket.select(nil, nil, 0.12)        -- the head in two parts
      assert(c:send("Content-Length: 2\r\n\r\na"))
      socket.select(nil, nil, 0.12)        -- the body in two reads
      assert(c:send("b"))
      local status, _, body = read_response(c)
      assert.equal(200, status)
      assert.matches("^POST /" .. i .. " .* len=2 ", body)
    end
    c:close()
  end)

  it("times each head from its own first byte, also behind a request answered at once", function()
    local port = start { header_timeout = 0.6 }
    local c = H.client(port)
    c:setoption("tcp-nodelay", true)
    -- an Upgrade request reaches the handler at once (not in a read batch),
    -- so it is answered while the read that completed it is parsed, and
    -- that read also begins the next head
    assert(c:send("GET /a HTTP/1.1\r\nHost: h\r\nUpgrade: x\r\n"))
    socket.select(nil, nil, 0.4)
    assert(c:send("\r\nGET /b HTTP/1.1\r\n"))
    local status, _, body = read_response(c)
    assert.equal(200, status)
    assert.matches("^GET /a ", body)
    socket.select(nil, nil, 0.4)           -- 0.8 s after /a began, 0.4 s after /b
    assert(c:send("Host: h\r\n\r\n"))
    status, _, body = read_response(c)
    assert.equal(200, status)
    assert.matches("^GET /b ", body)
    c:close()
  end)

  it("does not time out requests the handler answers slowly, nor the connection after", function()
    local port = start { header_timeout = 0.1, body_timeout = 0.1, keepalive_timeout = 0.25 }
    local c = H.client(port)
    c:setoption("tcp-nodelay", true)
    local t0 = socket.gettime()
    assert(c:send("POST /slow-answer HTTP/1.1\r\nHost: h\r\n"))
    socket.select(nil, nil, 0.05)          -- the head's timer runs, then it is whole
    assert(c:send("Content-Length: 2\r\n\r\nab" ..
                  "GET /slow-answer HTTP/1.1\r\nHost: h\r\n\r\n"))
    for _, method in ipairs { "POST", "GET" } do
      local status, _, body = read_response(c)
      assert.equal(200, status)
      assert.equal("slow " .. method, body)
    end
    assert.is_true(since(t0) > 0.4)        -- past every timeout: the handler's
                                           -- time is not the client's
    assert(c:send("GET /after HTTP/1.1\r\nHost: h\r\n\r\n"))
    local status, _, body = read_response(c)
    assert.equal(200, status)
    assert.matches("^GET /after ", body)
    c:close()
  end)

  it("takes its timer along when it leaves the pipeline (a protocol switch)", function()
    local Switch = {}
    function Switch:channel_read(ctx, msg)
      if type(msg) == "string" then          -- after the switch: echo
        ctx:write(msg)
        ctx:flush()
        return
      end
      ctx:write { status = 101, headers = { upgrade = "echo", connection = "upgrade" } }
      ctx:flush()
      ctx.channel:pipeline():remove("http")
    end
    group = netrun.group { threads = 1, name = "http" }
    local codec = netrun.codec.http_server { header_timeout = 0.1, keepalive_timeout = 0.1 }
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("http", codec)
        ch:pipeline():add_last("switch", Switch)
      end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    assert(c:send("GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: echo\r\nConnection: upgrade\r\n\r\n"))
    assert.equal(101, (read_response(c, true)))
    socket.select(nil, nil, 0.35)            -- past both timeouts, twice
    assert(c:send("ping"))
    assert.equal("ping", H.recv(c, 4))
    c:close()
  end)

  it("cancels the timers of connections that go away mid-request", function()
    local port = start { header_timeout = 0.15, body_timeout = 0.15 }
    local gone, stay = {}, {}
    for i = 1, 40 do
      local c = H.client(port)
      assert(c:send(i % 2 == 0 and "GET /half HTTP/1.1\r\nHo"
                    or "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 9\r\n\r\nab"))
      if i % 4 < 2 then gone[#gone + 1] = c else stay[#stay + 1] = c end
    end
    for _, c in ipairs(gone) do c:close() end
    for _, c in ipairs(stay) do
      assert.equal(408, (read_response(c)))
      assert_closed(c)
      c:close()
    end
    local c = H.client(port)                 -- and the server goes on
    assert(c:send("GET /ok HTTP/1.1\r\nHost: h\r\n\r\n"))
    assert.equal(200, (read_response(c)))
    c:close()
  end)
end)

-- What differential testing against llhttp and nginx found: one request
-- per rule, on a raw connection, and the exact status it gets (the codec
-- then closes).
describe("http_server conformance", function()
  local group, port
  before_each(function() group, port = serve { max_headers = 4, max_body = 1000 } end)
  after_each(function() H.shutdown(group) end)

  local CHUNKED = "POST /up HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
  local function status_of(req)
    local c = H.client(port)
    assert(c:send(req))
    local status, headers, body = read_response(c)
    if status >= 400 then
      assert.equal("close", headers.connection)
      assert_closed(c)
    end
    c:close()
    return status, body
  end

  local rules = {
    { "a trailer Host", CHUNKED .. "1\r\na\r\n0\r\nHost: evil\r\n\r\n", 400 },
    { "a trailer Content-Length", CHUNKED .. "1\r\na\r\n0\r\nContent-Length: 5\r\n\r\n", 400 },
    { "a trailer Transfer-Encoding", CHUNKED .. "1\r\na\r\n0\r\nTransfer-Encoding: chunked\r\n\r\n", 400 },
    { "a trailer line starting with a bare CR", CHUNKED .. "1\r\na\r\n0\r\n\rX-A: 1\r\n\r\n", 400 },
    { "HTTP/1.1 without Host", "GET / HTTP/1.1\r\n\r\n", 400 },
    { "two Hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400 },
    { "two Hosts in HTTP/1.0", "GET / HTTP/1.0\r\nHost: a\r\nhost: a\r\n\r\n", 400 },
    { "an invalid Host", "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400 },
    { "an IPv6 Host", "GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n", 200 },
    { "Transfer-Encoding in HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400 },
    { "a Content-Length past int64", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 9223372036854775808\r\n\r\n", 400 },
    { "a Content-Length within int64 but over max_body", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 9223372036854775807\r\n\r\n", 413 },
    { "a chunk size past int64", CHUNKED .. "10000000000000000\r\n", 400 },
    { "a chunk size with leading zeros", CHUNKED .. "000000000000000A\r\n0123456789\r\n0\r\n\r\n", 200 },
    { "two Transfer-Encoding lines", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400 },
    { "chunked twice in one Transfer-Encoding", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", 400 },
    { "a folded Transfer-Encoding", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n", 400 },
    { "max_headers header lines", "GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", 200 },
    { "more than max_headers header lines", "GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n", 431 },
    { "more than max_headers with the trailers", CHUNKED .. "0\r\nX-A: 1\r\nX-B: 2\r\nX-C: 3\r\n\r\n", 431 },
  }
  for _, rule in ipairs(rules) do
    it(("answers %s with %d"):format(rule[1], rule[3]), function()
      assert.equal(rule[3], (status_of(rule[2])))
    end)
  end

  it("keeps trailers in req.trailers only", function()
    local status, body = status_of(CHUNKED .. "3\r\nabc\r\n0\r\nX-Sum: 1\r\n\r\n")
    assert.equal(200, status)
    assert.matches("len=3 .* hs=host=h,transfer%-encoding=chunked ts=x%-sum=1$", body)
  end)

  it("refuses a bad request line at its first bad byte, without waiting for its end", function()
    for _, start in ipairs { "\22\3\1\2\0", "GET /a\1", "G@T", "GET / HTTX" } do
      local c = H.client(port)
      assert(c:send(start))                 -- no line end follows
      local status, headers = read_response(c)
      assert.equal(400, status)
      assert.equal("close", headers.connection)
      assert_closed(c)
      c:close()
    end
  end)
end)

describe("http_server and a client that does not read", function()
  it("stops reading and parsing while its answers cannot drain, then answers all in order", function()
    local BIG = string.rep("x", 16384)
    local paused = netrun.promise()
    local group = netrun.group { threads = 1, name = "http-unread" }
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("http", netrun.codec.http_server {})
        ch:pipeline():add_last("app", {
          channel_read = function(_, ctx, req)
            _G.ch = ctx.channel
            _G.delivered = (_G.delivered or 0) + 1
            ctx:write { status = 200, headers = { ["x-n"] = req.path:sub(2) }, body = BIG }
          end,
          channel_read_complete = function(_, ctx) ctx:flush() end,
          channel_writability_changed = function(_, ctx)
            if not ctx.channel:is_writable() then paused:try_success(_G.delivered) end
          end,
        })
      end,
    }:sync()
    local _, port = server:local_address()
    local N = 4000                              -- 120 KB of requests, 64 MB of answers
    local c = H.client(port)
    local reqs = {}
    for i = 1, N do reqs[i] = "GET /" .. i .. " HTTP/1.1\r\nHost: x\r\n\r\n" end
    assert(c:send(table.concat(reqs)))
    H.sync(paused, 10)
    -- Once the kernel's buffers are full too, the channel stays unwritable
    -- and nothing more is delivered: a few hundred answers, not all.
    local loop = group:next()
    local n = H.stalled(loop, function()
      if not _G.ch:is_writable() then return _G.delivered end
    end)
    assert.is_truthy(n)
    assert.is_true(n < N / 4, "delivered " .. n .. " of " .. N .. " to a client that reads nothing")
    -- reading drains the buffer: the held requests are parsed, every one answered in order
    for i = 1, N do
      local status, headers, body = read_response(c)
      assert.equal(200, status)
      assert.equal(tostring(i), headers["x-n"])
      assert.equal(#BIG, #body)
    end
    assert.equal(N, loop:submit(function() return _G.delivered end):sync())
    c:close()
    H.shutdown(group)
  end)
end)

-- One response table, written for every request and changed by some:
-- /same writes it as it is, /reset a new one, /body/X sets its body, /type/X its
-- content-type, /add and /drop a field, /status/N its status.
local Mutating = {}
function Mutating:channel_read(ctx, req)
  local what, arg = req.path:match("^/(%a+)/?(.*)$")
  local t = self.t
  if not t or what == "reset" then
    t = { status = 200, body = "first", headers = { ["content-type"] = "text/plain" } }
    self.t = t
  end
  if what == "body" then t.body = arg
  elseif what == "type" then t.headers["content-type"] = arg
  elseif what == "add" then t.headers["x-added"] = "yes"
  elseif what == "drop" then t.headers["x-added"] = nil
  elseif what == "status" then t.status = tonumber(arg)
  end
  ctx:write(t)
end
function Mutating:channel_read_complete(ctx) ctx:flush() end

-- A new table per request with the same status and headers, and the
-- request's path as its body: /type/X makes a new headers table, /status/N
-- sets the status, /reset goes back to the first ones.
local Varying = {}
function Varying:channel_read(ctx, req)
  local what, arg = req.path:match("^/(%a+)/?(.*)$")
  if what == "type" then self.h = { ["content-type"] = arg }
  elseif what == "status" then self.status = tonumber(arg)
  elseif what == "reset" then self.h, self.status = nil, nil end
  self.h = self.h or { ["content-type"] = "text/plain" }
  ctx:write { status = self.status or 200, headers = self.h, body = req.path }
end
function Varying:channel_read_complete(ctx) ctx:flush() end

describe("http_server writing one response table again and again", function()
  it("sends each change at once, pipelined, on a loop that made no memo before", function()
    local group, port = serve(nil, Mutating)
    local steps = {     -- path, then the status, content-type, x-added and body it gets
      { "/reset", 200, "text/plain", nil, "first" }, { "/same", 200, "text/plain", nil, "first" },
      { "/same", 200, "text/plain", nil, "first" }, { "/same", 200, "text/plain", nil, "first" },
      { "/body/second", 200, "text/plain", nil, "second" },
      { "/same", 200, "text/plain", nil, "second" }, { "/same", 200, "text/plain", nil, "second" },
      { "/type/text/html", 200, "text/html", nil, "second" },
      { "/same", 200, "text/html", nil, "second" }, { "/same", 200, "text/html", nil, "second" },
      { "/add", 200, "text/html", "yes", "second" }, { "/same", 200, "text/html", "yes", "second" },
      { "/same", 200, "text/html", "yes", "second" },
      { "/drop", 200, "text/html", nil, "second" }, { "/same", 200, "text/html", nil, "second" },
      { "/status/404", 404, "text/html", nil, "second" }, { "/same", 404, "text/html", nil, "second" },
      { "/same", 404, "text/html", nil, "second" }, { "/status/200", 200, "text/html", nil, "second" },
    }
    for _, batch in ipairs { 1, 3, #steps } do   -- one at a time, then pipelined
      local c = H.client(port)
      for i = 1, #steps, batch do
        local reqs = {}
        for j = i, math.min(i + batch - 1, #steps) do
          reqs[#reqs + 1] = "GET " .. steps[j][1] .. " HTTP/1.1\r\nHost: h\r\n\r\n"
        end
        assert(c:send(table.concat(reqs)))
        for j = i, math.min(i + batch - 1, #steps) do
          local step = steps[j]
          local status, headers, body = H.read_response(c)
          assert.same({ step[2], step[3], step[4], step[5] },
                      { status, headers["content-type"], headers["x-added"], body }, step[1])
        end
      end
      c:close()
    end
    H.shutdown(group)
  end)

  it("sends a head memoised with each request's body, pipelined, HEAD and close included", function()
    local group, port = serve(nil, Varying)
    local steps = {}    -- method, path, status and content-type it gets
    local status, ctype = 200, "text/plain"
    for i = 1, 60 do
      local path = "/b/" .. ("x"):rep(i % 7) .. i
      if i == 1 then path = "/reset" end
      if i == 20 then path, ctype = "/type/text/html", "text/html" end
      if i == 35 then path, status = "/status/404", 404 end
      if i == 50 then path, status = "/status/200", 200 end
      steps[i] = { i % 5 == 0 and "HEAD" or "GET", path, status, ctype }
    end
    for _, batch in ipairs { 1, 7, #steps } do   -- one at a time, then pipelined
      local c = H.client(port)
      for i = 1, #steps, batch do
        local reqs = {}
        for j = i, math.min(i + batch - 1, #steps) do
          reqs[#reqs + 1] = steps[j][1] .. " " .. steps[j][2] .. " HTTP/1.1\r\nHost: h\r\n" ..
                            (j == #steps and "Connection: close\r\n" or "") .. "\r\n"
        end
        assert(c:send(table.concat(reqs)))
        for j = i, math.min(i + batch - 1, #steps) do
          local step = steps[j]
          local head = step[1] == "HEAD"
          local st, headers, body = read_response(c, head)
          assert.same({ step[3], step[4], tostring(#step[2]), head and "" or step[2] },
                      { st, headers["content-type"], headers["content-length"], body }, step[2])
          assert.equal(j == #steps and "close" or nil, headers.connection)
        end
      end
      assert_closed(c)
      c:close()
    end
    H.shutdown(group)
  end)
end)

describe("http_server writing in place", function()
  local group, direct, relayed
  setup(function()
    group = netrun.group { threads = 1, name = "http" }
    local function serve_variants(relay)
      local server = netrun.server {
        group = group, host = "127.0.0.1", port = 0,
        init = function(ch)
          if relay then
            ch:pipeline():add_last("relay", {
              write = function(_, ctx, msg, p) ctx:write(msg, p) end,
            })
          end
          ch:pipeline():add_last("http", netrun.codec.http_server {})
          ch:pipeline():add_last("app", Variant)
        end,
      }:sync()
      local _, port = server:local_address()
      return port
    end
    direct, relayed = serve_variants(false), serve_variants(true)
  end)
  teardown(function() H.shutdown(group) end)

  -- Everything a connection gets for these requests (a last one closes
  -- it, unless `closes`: the server closes after them, and a request sent
  -- past that point could make its close a reset that loses the answers),
  -- dates blanked.
  local function exchange(port, reqs, closes)
    local c = H.client(port)
    assert(c:send(table.concat(reqs) ..
      (closes and "" or "GET /table/empty HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")))
    local all, err, partial = c:receive("*a")
    c:close()
    all = all or partial
    assert.truthy(#all > 0, err)
    return (all:gsub("\r\nDate: [^\r]*", "\r\nDate: -"))
  end

  it("gives the bytes a relayed write gives, prepared or not, for every kind of request", function()
    local forms = { "GET /%s HTTP/1.1\r\nHost: h\r\n\r\n", "HEAD /%s HTTP/1.1\r\nHost: h\r\n\r\n",
                    "GET /%s HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
                    "GET /%s HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
                    "GET /%s HTTP/1.0\r\n\r\n" }
    for name in pairs(Variants) do
      for _, form in ipairs(forms) do
        for _, kind in ipairs { "prepared", "table" } do
          local path = kind .. "/" .. name
          -- three pipelined, so some land after others in one chunk
          local reqs = { form:format(path) }
          local closes = form:find("close") or form:find("1.0\r\n\r\n") or
                         name == "closing"
          if not closes then
            reqs = { reqs[1], reqs[1], reqs[1] }
          end
          assert.equal(exchange(relayed, reqs, closes), exchange(direct, reqs, closes),
                       path .. " " .. form)
        end
      end
    end
  end)

  it("gives the same bytes when responses fill more than one outbound chunk", function()
    local reqs, names = {}, { "plain", "reason", "empty", "none", "big" }
    for i = 1, 300 do
      local kind = i % 3 == 0 and "table" or "prepared"
      reqs[i] = ("GET /%s/%s HTTP/1.1\r\nHost: h\r\n\r\n"):format(kind, names[i % #names + 1])
    end
    local a = exchange(direct, reqs)
    assert.truthy(#a > 3 * 16384)
    assert.equal(exchange(relayed, reqs), a)
  end)

  it("fills a date in every response", function()
    local c = H.client(direct)
    assert(c:send("GET /prepared/plain HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"))
    local all = c:receive("*a")
    c:close()
    assert.matches("\r\nDate: %a%a%a, %d%d %a%a%a %d%d%d%d %d%d:%d%d:%d%d GMT\r\n", all)
  end)
end)

describe("http_server construction", function()
  it("checks its options", function()
    assert.has_error(function() netrun.codec.http_server { max_body = "big" } end,
      'netrun.codec.http_server: max_body must be a size in bytes from 0 to 1099511627776, got "big"')
    assert.has_error(function() netrun.codec.http_server { max_header = 1 } end,
      "netrun.codec.http_server: max_header must be a size in bytes from 64 to 1073741824, got 1")
    -- the client codec's options read the same way (one family, lopts.c)
    assert.has_error(function() netrun.codec.http_client { max_headers = 0 } end,
      "netrun.codec.http_client: max_headers must be an integer from 1 to 512, got 0")
    assert.has_error(function() netrun.codec.http_client { raw = 1 } end,
      "netrun.codec.http_client: raw must be a boolean, got 1")
    assert.matches("max_header = 8192", tostring(netrun.codec.http_server()))
  end)
end)

-- The examples, run as users run them.
local free_port, start, stop = H.free_port, H.start, H.stop

describe("HTTP examples", function()
  describe("the request a handler receives", function()
    local function parse(bytes)
      local ch = netrun.embedded(netrun.codec.http_server {})
      ch:write_inbound(bytes)
      local reqs = ch:read_all_inbound()
      return reqs[1], ch
    end
    local raw = "POST /p/a?x=1&y=2 HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nx-a: 2\r\n" ..
                "Content-Length: 4\r\n\r\nbody"

    it("reads like a table: method, path, query, version, headers, body, keep_alive", function()
      local req, ch = parse(raw)
      assert.equal("userdata", type(req))
      assert.equal("POST", req.method)
      assert.equal("/p/a", req.path)
      assert.equal("x=1&y=2", req.query)
      assert.equal("HTTP/1.1", req.version)
      assert.same({ host = "h", ["x-a"] = "1, 2", ["content-length"] = "4" }, req.headers)
      assert.equal("body", req.body)
      assert.is_true(req.keep_alive)
      assert.is_nil(req.nothing)
      assert.equal("netrun.http.request: POST /p/a", tostring(req))
      local get = parse("GET / HTTP/1.0\r\n\r\n")
      assert.is_nil(get.query)
      assert.equal("", get.body)
      assert.equal("HTTP/1.0", get.version)
      assert.is_false(get.keep_alive)
      assert.same({}, get.headers)
      ch:close()
    end)

    it("keeps its headers table and the fields a handler assigns; pairs sees them all", function()
      local req, ch = parse(raw)
      assert.equal(req.headers, req.headers)
      req.headers.added = "yes"
      assert.equal("yes", req.headers.added)
      req.user = { id = 7 }
      req.path = "/rewritten"
      assert.equal(7, req.user.id)
      assert.equal("/rewritten", req.path)
      local seen = {}
      for k, v in pairs(req) do seen[k] = v end
      assert.same({ method = "POST", path = "/rewritten", query = "x=1&y=2",
                    target = "/p/a?x=1&y=2", args = { x = "1", y = "2" },
                    version = "HTTP/1.1", body = "body", keep_alive = true,
                    user = { id = 7 }, trailers = {},
                    headers = { host = "h", ["x-a"] = "1, 2", ["content-length"] = "4",
                                added = "yes" } }, seen)
      ch:close()
    end)

    it("is checked once when prepared; a bad one raises at once", function()
      local r = netrun.codec.http_response { body = "x" }
      assert.equal("netrun.codec.http_response (200, 1 bytes of body)", tostring(r))
      assert.has_error(function() netrun.codec.http_response { status = "200" } end,
        "netrun.codec.http_response: http response: status must be an integer, got a string")
      assert.has_error(function() netrun.codec.http_response { stream = true } end,
        "netrun.codec.http_response: http response: a prepared response cannot be streamed")
      assert.has_error(function()
        netrun.codec.http_response { headers = { ["x"] = "a\r\nb: c" } }
      end, "netrun.codec.http_response: http response: the value of header 'x' contains a control character")
      assert.has_error(function() netrun.codec.http_response { status = 42 } end,
        "netrun.codec.http_response: http response: status 42 is not in 100..999")
      local ch = netrun.embedded()
      assert.has_error(function() ch:pipeline():add_last("r", r) end,
        "netrun.codec.http_response: a response to write, not a handler")
      ch:close()
    end)

    it("prepared, encodes the bytes its table does; HEAD and HTTP/1.0 as for a table", function()
      local t = { status = 404, reason = "Gone Fishing", body = "nothing here",
                  headers = { ["content-type"] = "text/plain", ["x-a"] = { "1", "2" } } }
      local prepared = netrun.codec.http_response(t)
      local function answer(req, resp)
        local ch = netrun.embedded(netrun.codec.http_server {})
        ch:write_inbound(req)
        assert.equal(1, #ch:read_all_inbound())
        ch:write_outbound(resp)
        local out = table.concat(ch:read_all_outbound())
        ch:close()
        local lines = {}
        for l in out:gmatch("([^\n]*)\n") do
          if not l:match("^Date: ") then lines[#lines + 1] = l end
        end
        table.sort(lines)
        return table.concat(lines, "\n") .. "|" .. out:match("\r\n\r\n(.*)$")
      end
      for _, req in ipairs { "GET / HTTP/1.1\r\nHost: h\r\n\r\n", "HEAD / HTTP/1.1\r\nHost: h\r\n\r\n",
                             "GET / HTTP/1.0\r\n\r\n",
                             "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
                             "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n" } do
        assert.equal(answer(req, t), answer(req, prepared), req)
      end
      assert.matches("HTTP/1.1 404 Gone Fishing", answer("GET / HTTP/1.1\r\nHost: h\r\n\r\n", prepared), 1, true)
    end)

    it("takes numbers as header values, however many (a table and a prepared response alike)", function()
      local headers = { ["x-list"] = { 1, "two", 3.5 } }
      for i = 1, 40 do headers["x-n" .. i] = 1234567890123456 + i end   -- 17 digits each
      local t = { status = 200, body = "ok", headers = headers }
      for _, resp in ipairs { t, netrun.codec.http_response(t) } do
        local ch = netrun.embedded(netrun.codec.http_server {})
        ch:write_inbound("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        assert.equal(1, #ch:read_all_inbound())
        ch:write_outbound(resp)
        local out = table.concat(ch:read_all_outbound())
        ch:close()
        assert.matches("^HTTP/1%.1 200 OK\r\n", out)
        for i = 1, 40 do
          assert.truthy(out:find("\r\nx-n" .. i .. ": " .. (1234567890123456 + i) .. "\r\n", 1, true), out)
        end
        assert.truthy(out:find("\r\nx-list: 1\r\nx-list: two\r\nx-list: 3.5\r\n", 1, true), out)
      end
      assert.has_error(function() netrun.codec.http_response { headers = { x = { "a", true } } } end,
        "netrun.codec.http_response: http response: header 'x' value 2 is a boolean")
    end)

    it("checks response header names and values on every write, however often they passed", function()
      local ch = netrun.embedded(netrun.codec.http_server {})
      local function ask()
        ch:write_inbound("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        assert.equal(1, #ch:read_all_inbound())
      end
      local function refused(resp, why)
        local ok, err = pcall(ch.write_outbound, ch, resp)
        assert.is_false(ok)
        assert.matches(why, tostring(err))
        assert.same({}, ch:read_all_outbound())
      end
      for _ = 1, 3 do
        for i = 1, 100 do     -- more strings than the codec remembers as checked
          ask()
          ch:write_outbound { status = 200, body = "ok",
                              headers = { ["x-" .. i] = "v" .. i, ["content-type"] = "text/plain" } }
          assert.matches("\r\nx%-" .. i .. ": v" .. i .. "\r\n", table.concat(ch:read_all_outbound()))
        end
        ask()
        refused({ headers = { ["content-type"] = "text/plain\r\nInjected: 1" } }, "control character")
        refused({ headers = { ["x-1"] = { "v1", "a\0b" } } }, "control character")
        refused({ headers = { ["bad name"] = "v1" } }, "is not a token")
        refused({ headers = { ["x-1"] = "v1", ["x:"] = "v1" } }, "is not a token")
        ch:write_outbound { status = 200, body = "after" }   -- answers it
        assert.matches("after$", table.concat(ch:read_all_outbound()))
      end
      ch:close()
    end)

    it("re-reads a response table written again and again: every change shows in the next write", function()
      -- The same strings written in a row are sent as a prepared response
      -- (lhttp_memo.c); each change below must reach the wire at once.
      local ch = netrun.embedded(netrun.codec.http_server {})
      local function send(resp) return answer_get(ch, resp) end
      local function refused(resp, why)
        ch:write_inbound("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        assert.equal(1, #ch:read_all_inbound())
        local ok, err = pcall(ch.write_outbound, ch, resp)
        assert.is_false(ok)
        assert.matches(why, tostring(err))
        assert.same({}, ch:read_all_outbound())
        ch:write_outbound { status = 204 }      -- answers it
        ch:read_all_outbound()
      end
      local t = { status = 200, body = "hello", headers = { ["content-type"] = "text/plain" } }
      local function expect(status_line, headers, body, resp)
        resp = resp or t
        for _ = 1, 4 do     -- a memo is filled on the second write, used from the third
                            -- (a state's first memo made on a second, filled on a third)
          local out = send(resp)
          assert.equal(status_line .. "\r\nServer: netrun\r\nContent-Length: " .. #body .. "\r\n" ..
                       headers .. "\r\n" .. body, out)
        end
      end
      expect("HTTP/1.1 200 OK", "content-type: text/plain\r\n", "hello")
      t.body = "other"
      expect("HTTP/1.1 200 OK", "content-type: text/plain\r\n", "other")
      t.status = 404
      expect("HTTP/1.1 404 Not Found", "content-type: text/plain\r\n", "other")
      t.reason = "Gone"
      expect("HTTP/1.1 404 Gone", "content-type: text/plain\r\n", "other")
      t.reason, t.status = nil, nil   -- the default, 200
      expect("HTTP/1.1 200 OK", "content-type: text/plain\r\n", "other")
      t.headers["content-type"] = "text/html"
      expect("HTTP/1.1 200 OK", "content-type: text/html\r\n", "other")
      t.headers["content-type"] = ("text/" .. "html"):rep(20)   -- a long string, made anew
      expect("HTTP/1.1 200 OK", "content-type: " .. ("text/html"):rep(20) .. "\r\n", "other")
      t.headers["content-type"] = "text/plain"
      t.headers["x-added"] = "1"
      local out = send(t)
      assert.truthy(out:find("\r\nx-added: 1\r\n", 1, true), out)
      assert.truthy(out:find("\r\ncontent-type: text/plain\r\n", 1, true), out)
      t.headers["x-added"] = nil
      expect("HTTP/1.1 200 OK", "content-type: text/plain\r\n", "other")
      t.headers["content-type"] = nil
      expect("HTTP/1.1 200 OK", "", "other")
      t.headers = nil
      expect("HTTP/1.1 200 OK", "", "other")
      t.headers = { ["content-type"] = "text/plain" }   -- another table, the same strings
      expect("HTTP/1.1 200 OK", "content-type: text/plain\r\n", "other")
      t.headers = { ["x-n"] = 42 }
      expect("HTTP/1.1 200 OK", "x-n: 42\r\n", "other")
      t.headers = { ["content-type"] = "text/plain" }
      t.body = 12345
      expect("HTTP/1.1 200 OK", "content-type: text/plain\r\n", "12345")
      t.body = nil
      expect("HTTP/1.1 200 OK", "content-type: text/plain\r\n", "")
      t.body = "other"
      expect("HTTP/1.1 200 OK", "content-type: text/plain\r\n", "other")
      -- what was checked once is checked again once it changes
      t.status = 200.0
      refused(t, "status must be an integer, got a number")
      t.status = 42
      refused(t, "bad status 42")
      t.status = 200
      t.body = true
      refused(t, "body must be a string, got a boolean")
      t.body = "other"
      t.headers["content-type"] = "text/plain\r\nInjected: 1"
      refused(t, "control character")
      t.headers["content-type"] = "text/plain"
      t.headers["bad name"] = "v"
      refused(t, "is not a token")
      t.headers["bad name"] = nil
      t.headers[1] = "v"
      refused(t, "header names must be strings, got a number")
      t.headers[1] = nil
      expect("HTTP/1.1 200 OK", "content-type: text/plain\r\n", "other")
      -- a stream after the same table plain
      t.stream = true
      local streamed = send(t)
      assert.equal("HTTP/1.1 200 OK\r\nServer: netrun\r\nTransfer-Encoding: chunked\r\n" ..
                   "content-type: text/plain\r\n\r\n5\r\nother\r\n", streamed)
      ch:write_outbound(false)
      assert.equal("0\r\n\r\n", table.concat(ch:read_all_outbound()))
      t.stream = false
      expect("HTTP/1.1 200 OK", "content-type: text/plain\r\n", "other")
      t.stream = nil
      expect("HTTP/1.1 200 OK", "content-type: text/plain\r\n", "other")
      ch:close()
    end)

    it("gives a table's bytes and its prepared form's alike, byte for byte, for every kind of request", function()
      local function answer(req, resp)
        local ch = netrun.embedded(netrun.codec.http_server {})
        local outs = {}
        for i = 1, 4 do     -- the last writes of a table are its memo's
          ch:write_inbound(req)
          assert.equal(1, #ch:read_all_inbound())
          ch:write_outbound(resp)
          outs[i] = (table.concat(ch:read_all_outbound()):gsub("\r\nDate: [^\r]*", ""))
          if req:find("close") or req:find("1.0\r\n\r\n") then break end
        end
        ch:close()
        return table.concat(outs, "|")
      end
      for _, req in ipairs { "GET / HTTP/1.1\r\nHost: h\r\n\r\n", "HEAD / HTTP/1.1\r\nHost: h\r\n\r\n",
                             "GET / HTTP/1.0\r\n\r\n",
                             "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
                             "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n" } do
        -- a body no write has sent yet: the table's first write is encoded
        -- from it, its last sent as its memo
        local t = { status = 200, body = ("same %d"):format(math.random(1 << 40)),
                    headers = { ["content-type"] = "text/plain" } }
        assert.equal(answer(req, netrun.codec.http_response(t)), answer(req, t), req)
      end
    end)

    it("sends a memo's head with other bodies as a table encoded anew, byte for byte, for every kind of request", function()
      -- A table with a reason is never memoised (lhttp_memo.c): its bytes
      -- are write_response's, the reference for the memo's head.
      local function answer(req, t)
        local ch = netrun.embedded(netrun.codec.http_server {})
        ch:write_inbound(req)
        assert.equal(1, #ch:read_all_inbound())
        ch:write_outbound(t)
        local out = (table.concat(ch:read_all_outbound()):gsub("\r\nDate: [^\r]*", ""))
        ch:close()
        return out
      end
      local long = ("0123456789"):rep(60)
      local bodies = { "first", "second", "", nil, long, "first", "a" .. long, 12345, "second",
                       ("x"):rep(5000), "first" }   -- past SMALL_BODY: encoded anew
      local heads = {
        { 200, "OK", { ["content-type"] = "text/plain" } },
        { 404, "Not Found", { ["content-type"] = "text/plain", ["x-a"] = "1" } },
        { 200, "OK", { date = "Thu, 01 Jan 1970 00:00:00 GMT", server = "s", ["x-b"] = "2" } },
        { 200, "OK", { connection = "close" } },
        { 201, "Created", {} },
        { 204, "No Content", { ["x-a"] = "1" } },
        { 200, "OK", { ["content-length"] = "5" } },
        { 200, "OK", { ["Content-Length"] = "5", ["x-a"] = "1" } },   -- netrun's spelling
        { 200, "OK", { ["Transfer-Encoding"] = "identity" } },
        { 200, "OK", nil },
      }
      for _, req in ipairs { "GET / HTTP/1.1\r\nHost: h\r\n\r\n", "HEAD / HTTP/1.1\r\nHost: h\r\n\r\n",
                             "GET / HTTP/1.0\r\n\r\n",
                             "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
                             "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n" } do
        for _, head in ipairs(heads) do
          local status, reason, headers = head[1], head[2], head[3]
          for _ = 1, 3 do    -- the head memoised
            answer(req, { status = status, headers = headers, body = "warm" })
          end
          for i = 1, #bodies + 1 do
            local b = bodies[i]
            local want = answer(req, { status = status, reason = reason, headers = headers, body = b })
            local got = answer(req, { status = status, headers = headers, body = b })
            assert.equal(want, got, req .. tostring(status) .. " body " .. i)
          end
        end
      end
    end)

    it("sends a changed status or header at once after a head memo, whatever the body", function()
      local ch = netrun.embedded(netrun.codec.http_server {})
      local function send(resp) return answer_get(ch, resp) end
      local h = { ["content-type"] = "text/plain" }
      local status
      local function expect(status_line, fields, length)
        for i = 1, 6 do      -- a body other than the last one each time
          local body = ({ "one", "three", "" })[i % 3 + 1]
          local out = send { status = status, headers = h, body = body }
          assert.equal(status_line .. "\r\nServer: netrun\r\n" ..
                       (length or "Content-Length: " .. #body .. "\r\n") .. fields .. "\r\n" ..
                       (status_line:find("204") and "" or body), out)
        end
      end
      expect("HTTP/1.1 200 OK", "content-type: text/plain\r\n")
      h["content-type"] = "text/html"
      expect("HTTP/1.1 200 OK", "content-type: text/html\r\n")
      status = 404
      expect("HTTP/1.1 404 Not Found", "content-type: text/html\r\n")
      status = 204
      expect("HTTP/1.1 204 No Content", "content-type: text/html\r\n", "")
      status = 200
      h["x-added"] = "1"
      local out = send { status = status, headers = h, body = "b" }
      assert.truthy(out:find("\r\nx-added: 1\r\n", 1, true), out)
      h["x-added"] = nil
      expect("HTTP/1.1 200 OK", "content-type: text/html\r\n")
      h["content-length"] = "3"    -- the user's length, sent as given, no other
      for _ = 1, 4 do
        assert.equal("HTTP/1.1 200 OK\r\nServer: netrun\r\n", send { headers = h, body = "one" }:sub(1, 33))
        out = send { headers = h, body = "three" }
        assert.is_nil(out:find("Content-Length", 1, true), out)
        assert.truthy(out:find("\r\ncontent-length: 3\r\n", 1, true), out)
      end
      h["content-length"] = nil
      expect("HTTP/1.1 200 OK", "content-type: text/html\r\n")
      h["content-type"] = "text/plain\r\nInjected: 1"
      local ok, err = pcall(send, { headers = h, body = "one" })
      assert.is_false(ok)
      assert.matches("control character", tostring(err))
      ch:close()
    end)

    it("its metamethods and a prepared response's refuse other values", function()
      local req, ch = parse(raw)
      local mt = getmetatable(req)
      for _, bad in ipairs { {}, "s", 1, io.stdout } do
        assert.has_error(function() mt.__index(bad, "method") end)
        assert.has_error(function() mt.__newindex(bad, "x", 1) end)
        assert.has_error(function() mt.__pairs(bad) end)
        assert.has_error(function() mt.__tostring(bad) end)
      end
      local big = {}
      for i = 1, 64 do big[i] = i end
      local rmt = getmetatable(netrun.codec.http_response { body = "x" })
      assert.equal("netrun.codec.http_response (0, 0 bytes of body)", rmt.__tostring(big))
      assert.equal("POST", req.method)
      ch:close()
    end)

    it("crosses to another state as a plain table of its fields", function()
      local req, ch = parse(raw)
      req.user = "u"
      local group = netrun.group { threads = 1, name = "req-copy" }
      local got = group:next():submit(function()
        return { type(req), req.method, req.path, req.query, req.headers["x-a"], req.body,
                 req.user, req.keep_alive }
      end):sync()
      H.shutdown(group)
      assert.same({ "table", "POST", "/p/a", "x=1&y=2", "1, 2", "body", "u", true }, got)
      ch:close()
    end)
  end)

  it("http_hello.lua says Hello, World! over keep-alive", function()
    local port = free_port()
    local pid = start("examples/http_hello.lua", port)
    local url = "http://127.0.0.1:" .. port .. "/"
    local out, st = run("curl -sS " .. url .. " " .. url)
    stop(pid)
    assert.equal(0, st)
    assert.equal("Hello, World!Hello, World!", out)
  end)

  it("http_hello.lua and http_kv.lua time their clients out (nginx's defaults, or as told)", function()
    for _, script in ipairs { "examples/http_hello.lua", "examples/http_kv.lua" } do
      local port = free_port()
      local pid = start(script, port, "--header-timeout 0.2 --keepalive-timeout 0.2")
      local ok, err = pcall(function()
        local c = H.client(port)
        assert(c:send("GET /half HTTP/1.1\r\nHost: h\r\n"))
        local status, headers = read_response(c)
        assert.equal(408, status)
        assert.equal("close", headers.connection)
        assert_closed(c)
        c:close()
        c = H.client(port)
        assert(c:send("GET /k HTTP/1.1\r\nHost: h\r\n\r\n"))
        assert.is_true(read_response(c) < 408)
        local t0 = socket.gettime()
        assert_closed(c)                     -- idle: closed silently
        assert.is_true(socket.gettime() - t0 < 3)
        c:close()
      end)
      stop(pid)
      assert(ok, err)
    end
  end)

  it("http_kv.lua stores, reads and deletes keys; 404 for missing ones", function()
    local port = free_port()
    local pid = start("examples/http_kv.lua", port)
    local base = "http://127.0.0.1:" .. port
    local function curl(args)
      local out = run("curl -sS -o /dev/stderr -w '%{http_code}' " .. args .. " 2>&1")
      return tonumber(out:sub(-3)), out:sub(1, -4)
    end
    local ok, err = pcall(function()
      assert.equal(404, (curl(base .. "/k")))
      assert.equal(201, (curl("-X PUT --data-binary 'some value' " .. base .. "/k")))
      local code, body = curl(base .. "/k")
      assert.equal(200, code)
      assert.equal("some value", body)
      assert.equal(200, (curl("-X PUT --data-binary v2 " .. base .. "/k")))
      assert.equal(204, (curl("-X DELETE " .. base .. "/k")))
      assert.equal(404, (curl(base .. "/k")))
      assert.equal(404, (curl("-X DELETE " .. base .. "/k")))
    end)
    stop(pid)
    assert(ok, err)
  end)
end)

-- What a handler matches on is what the request names: an absolute-form
-- target's path and host (RFC 9112 3.2.2), a path normalized as nginx
-- matches locations; the target as it came is req.target.
describe("http_server and request targets", function()
  local group, server, port
  setup(function()
    group = netrun.group { threads = 1, name = "http-target" }
    server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("http", netrun.codec.http_server {})
        ch:pipeline():add_last("app", {
          channel_read = function(_, ctx, req)
            -- a rule on the path and on the host, as a proxy's would be
            local denied = req.path:find("^/admin") or req.headers.host ~= "public.example"
            ctx:write_and_flush { status = denied and 403 or 200,
              body = table.concat({ req.path, tostring(req.query), req.target,
                                    tostring(req.headers.host) }, " ") }
          end,
        })
      end,
    }:sync()
    port = select(2, server:local_address())
  end)
  teardown(function()
    server:close():sync()
    H.shutdown(group)
  end)

  local function ask(line, host)
    local c = H.client(port)
    c:send(line .. "\r\n" .. (host and ("Host: " .. host .. "\r\n") or "") .. "Connection: close\r\n\r\n")
    local status, _, body = H.read_response(c)
    c:close()
    return status, body
  end

  it("takes an absolute-form target's path and host, whatever Host says", function()
    local status, body = ask("GET http://evil.example/admin?k=1 HTTP/1.1", "public.example")
    assert.equal(403, status)
    assert.equal("/admin k=1 http://evil.example/admin?k=1 evil.example", body)
    status, body = ask("GET HTTP://public.example:80 HTTP/1.1", "other.example")
    assert.equal(403, status)                   -- the host is "public.example:80"
    assert.equal("/ nil HTTP://public.example:80 public.example:80", body)
    status, body = ask("GET http://public.example/pub HTTP/1.0")   -- 1.0: no Host sent
    assert.equal(200, status)
    assert.equal("/pub nil http://public.example/pub public.example", body)
  end)

  it("normalizes the path before a handler matches it", function()
    local status, body = ask("GET /public/../admin HTTP/1.1", "public.example")
    assert.equal(403, status)
    assert.equal("/admin nil /public/../admin public.example", body)
    status, body = ask("GET //%61dmin/./x/%2e%2E/y HTTP/1.1", "public.example")
    assert.equal(403, status)
    assert.equal("/admin/y nil //%61dmin/./x/%2e%2E/y public.example", body)
    status, body = ask("GET /pub//a%2fb?x=/../y HTTP/1.1", "public.example")
    assert.equal(200, status)                   -- %2F stays encoded; the query as it came
    assert.equal("/pub/a%2Fb x=/../y /pub//a%2fb?x=/../y public.example", body)
  end)

  it("refuses with 400 a path above the root, a dot segment behind an encoded slash, and other forms", function()
    for _, line in ipairs { "GET /../etc/passwd HTTP/1.1", "GET /a/%2e%2e/.. HTTP/1.1",
                            "GET /public/..%2Fadmin HTTP/1.1", "GET /a%00 HTTP/1.1",
                            "GET /a#b HTTP/1.1", "GET /%zz HTTP/1.1", "GET admin HTTP/1.1",
                            "GET http://u:p@evil.example/ HTTP/1.1", "GET * HTTP/1.1" } do
      local status = ask(line, "public.example")
      assert.equal(400, status, line)
    end
  end)
end)
