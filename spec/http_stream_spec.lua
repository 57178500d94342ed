-- http_stream_spec.lua -- netrun.codec.http_server { body = "stream" }:
-- the head first, the body in pieces once a handler reads it, no faster
-- than where it goes takes it; 100-continue only on the read; answers
-- before the body; bodies cut short. Real sockets: curl and raw clients.
local H = require "spec.helper"
local netrun = H.netrun
local socket = H.socket

local results = netrun.shared.dict("http_stream_spec")

-- A stream-mode server whose handler is made by `make` (a function
-- returning a handler table), on its own one-loop group.
local function serve(group, make, opts)
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0,
    init = function(ch)
      local o = opts or {}
      o.body = "stream"
      ch:pipeline():add_last("http", require("netrun").codec.http_server(o))
      ch:pipeline():add_last("app", make())
    end,
  }:sync()
  local _, port = server:local_address()
  return server, port
end

-- A handler that reads every body and answers its length, piece count,
-- largest piece, a checksum (the sum of every 4099th byte) and trailers.
local function summing()
  local n, pieces, largest, sum, tr
  return {
    channel_read = function(_, ctx, m)
      if m.type == "body" then
        n, pieces = n + #m.data, pieces + 1
        if #m.data > largest then largest = #m.data end
        for i = 1, #m.data do
          if (n - #m.data + i) % 4099 == 0 then sum = sum + m.data:byte(i) end
        end
        if m.trailers then tr = m.trailers["x-sum"] end
        if m.last then
          ctx:write_and_flush { status = 200, body = string.format("%d %d %d %d %s",
            n, pieces, largest, sum, tostring(tr)) }
        end
        return
      end
      assert(m.streaming == (m.method ~= "GET"))
      if not m.streaming then
        return ctx:write_and_flush { status = 200, body = "whole " .. m.path .. " " .. m.body }
      end
      assert(m.body == nil)
      n, pieces, largest, sum, tr = 0, 0, 0, 0, nil
      ctx:read()
    end,
  }
end

-- What a client offers a server that should stop taking it, and the most
-- it may take: the kernel's socket buffers on both sides (~8 MiB on
-- loopback) and one read. (Smaller under the fault shim, whose short
-- reads make every byte slow.)
local BIG = (H.faults and 16 or 32) * 1024 * 1024
local STALL = (H.faults and 14 or 24) * 1024 * 1024

local function checksum(s)
  local sum = 0
  for i = 4099, #s, 4099 do sum = sum + s:byte(i) end
  return sum
end

describe("http_server body = \"stream\"", function()
  local group
  setup(function() group = netrun.group { threads = 1, name = "stream" } end)
  teardown(function() H.shutdown(group) end)

  it("hands up a curl upload in pieces, each at most one read, intact", function()
    local server, port = serve(group, summing, { max_body = 64 << 20 })
    local path = os.tmpname()
    local f = assert(io.open(path, "wb"))
    local parts = {}
    for i = 1, 5 * 1024 do parts[i] = string.rep(string.char(32 + i % 90), 1024) end
    local data = table.concat(parts)
    f:write(data)
    f:close()
    local out, st = H.run(string.format(
      "curl -s -H 'Expect:' --data-binary @%s http://127.0.0.1:%d/up", path, port))
    assert.equal(0, st, out)
    local n, pieces, largest, sum = out:match("^(%d+) (%d+) (%d+) (%d+)")
    assert.equal(#data, tonumber(n))
    assert.equal(checksum(data), tonumber(sum))
    assert.is_true(tonumber(pieces) > 1)
    assert.is_true(tonumber(largest) <= 65536, "a piece of " .. largest)
    -- chunked, as curl sends a stream
    out, st = H.run(string.format(
      "curl -s -H 'Expect:' -H 'Transfer-Encoding: chunked' --data-binary @%s http://127.0.0.1:%d/up",
      path, port))
    assert.equal(0, st, out)
    n, pieces, largest, sum = out:match("^(%d+) (%d+) (%d+) (%d+)")
    assert.equal(#data, tonumber(n))
    assert.equal(checksum(data), tonumber(sum))
    -- curl's own "Expect: 100-continue" (its default past 1 MiB): the 100
    -- comes as the handler reads
    out, st = H.run(string.format(
      "curl -s -v --data-binary @%s http://127.0.0.1:%d/up", path, port))
    assert.equal(0, st, out)
    assert.matches("Expect: 100%-continue", out)
    assert.matches("HTTP/1.1 100 Continue", out)
    assert.matches(#data .. " %d+ %d+ " .. checksum(data), out)
    os.remove(path)
    server:close():sync()
  end)

  it("gives a chunked body's trailers with its last piece, and requests without a body whole", function()
    local server, port = serve(group, summing)
    local c = H.client(port)
    c:send("POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" ..
           "3\r\nabc\r\n2\r\nde\r\n0\r\nX-Sum: 42\r\n\r\n" ..
           "GET /g HTTP/1.1\r\nHost: x\r\n\r\n")
    local st, _, body = H.read_response(c)
    assert.equal(200, st)
    assert.matches("^5 %d+ %d+ 0 42$", body)
    st, _, body = H.read_response(c)
    assert.equal(200, st)
    assert.equal("whole /g ", body)
    c:close()
    server:close():sync()
  end)

  it("answers 100-continue only when the handler reads", function()
    local server, port = serve(group, function()
      local got = ""
      return {
        channel_read = function(_, ctx, m)
          if m.type == "body" then
            got = got .. m.data
            if m.last then ctx:write_and_flush { status = 200, body = "got " .. got } end
            return
          end
          -- read after 0.3 s: no "100 Continue" may come before
          ctx:loop():schedule(0.3, function() ctx:read() end)
        end,
      }
    end)
    local c = H.client(port)
    c:send("PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    c:settimeout(0.15)
    local early = c:receive("*l")
    assert.is_nil(early)                       -- nothing while unread
    c:settimeout(5)
    assert.equal("HTTP/1.1 100 Continue", c:receive("*l"))
    assert.equal("", c:receive("*l"))
    c:send("abcd")
    local st, _, body = H.read_response(c)
    assert.equal(200, st)
    assert.equal("got abcd", body)
    c:close()
    server:close():sync()
  end)

  it("closes after an answer given before the body was read, without a 100", function()
    local server, port = serve(group, function()
      return { channel_read = function(_, ctx, m)
        ctx:write_and_flush { status = 413, body = "no" }
      end }
    end)
    local c = H.client(port)
    c:send("PUT /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n")
    local st, h, body, line = H.read_response(c)
    assert.equal(413, st, line)
    assert.equal("close", h.connection)
    assert.equal("no", body)
    local rest, err = c:receive("*a")
    assert.equal("", rest or "")                  -- no 100 Continue, then EOF
    c:close()
    server:close():sync()
  end)

  it("reads no faster than the channel the body goes to takes it (req:sink)", function()
    -- the body goes to a TCP peer that reads nothing at first; the client
    -- offers 32 MiB; what the server takes stays within a few windows
    local sink_srv = assert(socket.bind("127.0.0.1", 0, 4))
    local _, sport = sink_srv:getsockname()
    results:set("sink_port", tonumber(sport))
    local server, port = serve(group, function()
      local out, n = nil, 0
      return {
        channel_read = function(_, ctx, m)
          if m.type == "body" then
            n = n + #m.data
            out:write_and_flush(m.data)
            if m.last then
              results:set("got", n)
              ctx:write_and_flush { status = 200, body = tostring(n) }
            end
            return
          end
          local netrun = require "netrun"
          netrun.connect { group = ctx:loop(), host = "127.0.0.1",
                           port = netrun.shared.dict("http_stream_spec"):get("sink_port"),
                           init = function() end }:add_listener(function(f)
            if not f:is_success() then
              io.stderr:write("sink connect failed: ", tostring(f:cause()), "\n")
              return ctx:close()
            end
            out = f:result()
            m:sink(out)
          end)
        end,
      }
    end, { max_body = 1 << 30 })
    local c = H.client(port)
    local total = BIG
    local head = "POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: " .. total .. "\r\n\r\n"
    assert(c:send(head))
    local chunk = string.rep("z", 256 * 1024)
    sink_srv:settimeout(10)
    local peer = assert(sink_srv:accept())
    c:settimeout(1)                                 -- until 1 s with nothing taken
    local sent = H.flood(c, chunk, total)
    c:settimeout(0)
    -- stalled: the kernel's buffers (client send, server receive, peer
    -- receive, server send) and the server's window, not 32 MiB
    assert.is_true(sent < STALL, "the server took " .. sent .. " bytes")
    local stalled = sent
    -- now the peer reads: everything flows, and arrives whole
    peer:settimeout(0)
    local got = 0
    local deadline = socket.gettime() + 60
    while got < total and socket.gettime() < deadline do
      if sent < total then
        local n, err, partial = c:send(chunk, 1, math.min(#chunk, total - sent))
        sent = sent + (n or partial or 0)
      end
      local data, err, partial = peer:receive(1 << 20)
      got = got + #(data or partial or "")
    end
    assert.equal(total, got)
    c:settimeout(10)
    local st, _, body = H.read_response(c)
    assert.equal(200, st)
    assert.equal(tostring(total), body)
    print(string.format("\n  sink that reads nothing: the client got %d KiB of %d MiB", stalled // 1024, BIG >> 20))
    peer:close(); sink_srv:close(); c:close()
    server:close():sync()
  end)

  it("reads no faster than its own client takes a body echoed back to it", function()
    -- a handler streams the body back as its answer; the client sends
    -- 32 MiB and reads nothing: the server stops taking it once its
    -- answer cannot go out, then everything flows when the client reads
    local server, port = serve(group, function()
      return {
        channel_read = function(_, ctx, m)
          if m.type == "body" then
            if #m.data > 0 then ctx:write_and_flush(m.data) end
            if m.last then ctx:write_and_flush("") end
            return
          end
          ctx:write_and_flush { status = 200, stream = true }
          ctx:read()
        end,
      }
    end, { max_body = 1 << 30 })
    local c = H.client(port)
    local total = BIG
    assert(c:send("POST /e HTTP/1.1\r\nHost: x\r\nContent-Length: " .. total .. "\r\n\r\n"))
    local chunk = string.rep("e", 256 * 1024)
    c:settimeout(1)                                 -- until 1 s with nothing taken
    local sent = H.flood(c, chunk, total)
    c:settimeout(0)
    assert.is_true(sent < STALL, "the server took " .. sent .. " bytes")
    local stalled = sent
    -- the client reads: the answer is the body, chunked, whole
    local deadline = socket.gettime() + 60
    local raw, tail = 0, ""
    while tail:sub(-5) ~= "0\r\n\r\n" and socket.gettime() < deadline do
      if sent < total then
        local n, _, partial = c:send(chunk, 1, math.min(#chunk, total - sent))
        sent = sent + (n or partial or 0)
      end
      local data, _, partial = c:receive(1 << 20)
      data = data or partial or ""
      raw = raw + #data
      tail = (tail .. data):sub(-16)
    end
    assert.equal("0\r\n\r\n", tail:sub(-5))     -- the chunked answer's end
    assert.is_true(raw > total, "got " .. raw .. " of " .. total)  -- (and framing)
    print(string.format("\n  echo to a client that reads nothing: it got %d KiB of %d MiB", stalled // 1024, BIG >> 20))
    c:close()
    server:close():sync()
  end)

  it("tells the handler of a body cut short, and answers bad framing 400", function()
    results:set("err", "")
    local server, port = serve(group, function()
      return {
        channel_read = function(_, ctx, m)
          if m.type ~= "body" then ctx:read() end
        end,
        exception_caught = function(_, ctx, err)
          require("netrun").shared.dict("http_stream_spec"):set("err", tostring(err))
        end,
      }
    end)
    local c = H.client(port)
    c:send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nonly some")
    c:close()
    H.eventually(function() return results:get("err") ~= "" end)
    assert.matches("closed in the middle of a request body", results:get("err"))
    results:set("err", "")
    c = H.client(port)
    c:send("POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nZZ\r\n")
    local st, h = H.read_response(c)
    assert.equal(400, st)
    assert.equal("close", h.connection)
    assert.matches("malformed request body", results:get("err"))
    c:close()
    server:close():sync()
  end)

  it("answers 413 past max_body, 500 when a handler raises on a piece, and reads on after a body", function()
    results:set("err", "")
    local server, port = serve(group, function()
      return {
        channel_read = function(_, ctx, m)
          if m.type == "body" then
            if m.data:find("boom", 1, true) then error("piece refused") end
            if m.last then ctx:write_and_flush { status = 200, body = "ok" } end
            return
          end
          if m.streaming then return ctx:read() end
          ctx:write_and_flush { status = 200, body = "next " .. m.path }
        end,
        exception_caught = function(_, ctx, err)
          require("netrun").shared.dict("http_stream_spec"):set("err", tostring(err))
        end,
      }
    end, { max_body = 10 })
    -- a Content-Length body, then a request pipelined behind it
    local c = H.client(port)
    c:send("PUT /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
    local st, _, body = H.read_response(c)
    assert.equal(200, st); assert.equal("ok", body)
    st, _, body = H.read_response(c)
    assert.equal(200, st); assert.equal("next /b", body)
    -- a chunked body that goes past max_body: 413, then the close
    c:send("POST /big HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n12345678\r\n8\r\n12345678\r\n")
    local h
    st, h = H.read_response(c)
    assert.equal(413, st)
    assert.equal("close", h.connection)
    assert.matches("over max_body", results:get("err"))
    assert.equal("", c:receive("*a") or "")       -- then EOF, nothing more
    c:close()
    -- a Content-Length past max_body is refused before its head goes up
    c = H.client(port)
    c:send("POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n")
    st = H.read_response(c)
    assert.equal(413, st)
    c:close()
    -- a handler that raises on a piece: 500; the connection closes when
    -- the body is not all read, and stays when it was
    c = H.client(port)
    c:send("POST /r HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nboom")
    st, h = H.read_response(c)
    assert.equal(500, st)
    assert.equal("close", h.connection)
    c:close()
    c = H.client(port)
    c:send("POST /r HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nboom")
    st, h = H.read_response(c)
    assert.equal(500, st)
    assert.is_nil(h.connection)
    c:send("GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
    st, _, body = H.read_response(c)
    assert.equal("next /after", body)
    c:close()
    server:close():sync()
  end)

  it("answers 408 to a body that stops coming", function()
    local server, port = serve(group, function()
      return { channel_read = function(_, ctx, m) if m.type ~= "body" then ctx:read() end end,
               exception_caught = function() end }
    end, { body_timeout = 0.3 })
    local c = H.client(port)
    c:send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
    local st = H.read_response(c)
    assert.equal(408, st)
    c:close()
    server:close():sync()
  end)
end)

-- Read a request's head from a raw connection (its lines up to the blank one).
local function read_head(c)
  repeat local l = assert(c:receive("*l")) until l == ""
end

local on_loop = H.on_loop

describe("netrun.http request { stream = true }", function()
  local group
  setup(function() group = netrun.group { threads = 1, name = "cstream" } end)
  teardown(function() H.shutdown(group) end)

  -- A netrun server answering GET /n/<bytes> with that many bytes, chunked
  -- (a streamed answer) or with a Content-Length (/l/<bytes>), trailers on
  -- /t; 204 on /none.
  local function origin()
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("http", require("netrun").codec.http_server {})
        ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
          local kind, n = req.path:match("^/(%a+)/(%d+)$")
          if req.path == "/none" then return ctx:write_and_flush { status = 204 } end
          n = tonumber(n)
          local function byte_at(i) return string.char(32 + (i * 7) % 90) end
          local parts = {}
          for i = 0, n - 1, 4096 do
            local t = {}
            for j = i, math.min(n, i + 4096) - 1 do t[#t + 1] = byte_at(j) end
            parts[#parts + 1] = table.concat(t)
          end
          if kind == "l" then
            return ctx:write_and_flush { status = 200, body = table.concat(parts) }
          end
          ctx:write { status = 200, stream = true }
          for _, p in ipairs(parts) do ctx:write(p) end
          ctx:write_and_flush("")
        end })
      end,
    }:sync()
    local _, port = server:local_address()
    return server, port
  end

  local function expected(n)
    local t = {}
    for i = 0, n - 1 do t[#t + 1] = string.char(32 + (i * 7) % 90) end
    return table.concat(t)
  end

  it("gives the head first, then the body piece by piece with res:read()", function()
    local server, port = origin()
    local got = on_loop(group:next(), function(port)
      local http = require("netrun.http")
      local out = {}
      for _, path in ipairs { "/n/300000", "/l/200000", "/none" } do
        local res = assert(http.request { url = "http://127.0.0.1:" .. port .. path,
                                          stream = true, max_body = 1 << 20 }:await())
        local parts, pieces = {}, 0
        assert(res.body == nil)
        while true do
          local d, err = res:read()
          assert(not err, err)
          if d == nil then break end
          pieces = pieces + 1
          parts[#parts + 1] = d
        end
        out[#out + 1] = { status = res.status, body = table.concat(parts), pieces = pieces }
      end
      return out
    end, port)
    assert.equal(200, got[1].status)
    assert.equal(expected(300000), got[1].body)
    assert.is_true(got[1].pieces > 1)
    assert.equal(expected(200000), got[2].body)
    assert.equal(204, got[3].status)
    assert.equal("", got[3].body)
    server:close():sync()
  end)

  it("hands the pieces to a callback with res:each(fn), the request's too", function()
    local server, port = origin()
    local got = on_loop(group:next(), function(port)
      local netrun = require "netrun"
      local client = require("netrun.http").client { max_body = 1 << 20 }
      local done = netrun.promise()
      client:request({ url = "http://127.0.0.1:" .. port .. "/n/100000", stream = true },
        function(res, err)
          assert(res, err)
          local parts = {}
          res:each(function(d, e)
            if d then parts[#parts + 1] = d return end
            done:set_success({ status = res.status, body = table.concat(parts), err = e })
          end)
        end)
      return done:await()
    end, port)
    assert.equal(200, got.status)
    assert.is_nil(got.err)
    assert.equal(expected(100000), got.body)
    server:close():sync()
  end)

  it("sends a body that is a function, chunk by chunk, as the connection takes it", function()
    -- to a streaming server that sums what it reads: 8 MiB made by a
    -- function (2 MiB under the fault shim), intact; a function body
    -- without stream = true is refused
    local CHUNKS = H.faults and 32 or 128
    local server, port = serve(group, summing, { max_body = 64 << 20 })
    local got = on_loop(group:next(), function(port, CHUNKS)
      local http = require("netrun.http")
      local i, calls = 0, 0
      local res = assert(http.request { url = "http://127.0.0.1:" .. port .. "/f", method = "PUT",
        stream = true, body = function()
          calls = calls + 1
          i = i + 1
          if i > CHUNKS then return nil end
          return string.rep(string.char(32 + i % 90), 65536)
        end }:await())
      local parts = {}
      for d in res.read, res do parts[#parts + 1] = d end
      local ok, err = pcall(http.request, { url = "http://127.0.0.1:" .. port .. "/", body = print })
      return { status = res.status, body = table.concat(parts), calls = calls, refused = tostring(err) }
    end, port, CHUNKS)
    assert.equal(200, got.status)
    local want = {}
    for i = 1, CHUNKS do want[i] = string.rep(string.char(32 + i % 90), 65536) end
    want = table.concat(want)
    local n, _, _, sum = got.body:match("^(%d+) (%d+) (%d+) (%d+)")
    assert.equal(#want, tonumber(n))
    assert.equal(checksum(want), tonumber(sum))
    assert.equal(CHUNKS + 1, got.calls)
    assert.matches("a body that is a function needs stream = true", got.refused)
    server:close():sync()
  end)

  it("reads no faster than res:read() takes the body", function()
    -- a raw server offers a body of BIG bytes; the reader takes the head
    -- and waits: the server gets to send a few windows' worth, not BIG
    local srv = assert(socket.bind("127.0.0.1", 0, 4))
    local _, port = srv:getsockname()
    results:set("stalled", -1)
    local f = group:next():submit(function(port, big)
      return netrun.spawn(function()
        local http = require("netrun.http")
        local d = require("netrun").shared.dict("http_stream_spec")
        local res = assert(http.request { url = "http://127.0.0.1:" .. port .. "/big",
                                          stream = true, max_body = 1 << 30 }:await())
        d:set("head", res.status)
        while d:get("stalled") < 0 do require("netrun").sleep(0.05) end
        local n = 0
        while true do
          local data, err = res:read()
          assert(not err, err)
          if not data then break end
          n = n + #data
        end
        return n
      end)
    end, tonumber(port), BIG)
    srv:settimeout(10)
    local c = assert(srv:accept())
    read_head(c)
    c:send("HTTP/1.1 200 OK\r\nContent-Length: " .. BIG .. "\r\n\r\n")
    H.eventually(function() return results:get("head") == 200 end)
    local chunk = string.rep("b", 256 * 1024)
    c:settimeout(1)                                 -- until 1 s with nothing taken
    local sent = H.flood(c, chunk, BIG)
    c:settimeout(0)
    assert.is_true(sent < STALL, "the client took " .. sent .. " bytes")
    local stalled = sent
    results:set("stalled", sent)
    local deadline = socket.gettime() + 60
    while sent < BIG and socket.gettime() < deadline do
      local n, _, partial = c:send(chunk, 1, math.min(#chunk, BIG - sent))
      local took = n or partial or 0
      sent = sent + took
      if took == 0 then socket.select(nil, {c}, 0.1) end
    end
    local spawned = H.sync(f)
    assert.equal(BIG, H.sync(spawned, 60))
    print(string.format("\n  a reader that waits: the server got %d KiB of %d MiB out", stalled // 1024, BIG >> 20))
    c:close(); srv:close()
  end)

  it("says when a body is cut short, over max_body, or the head never comes", function()
    local srv = assert(socket.bind("127.0.0.1", 0, 4))
    local _, port = srv:getsockname()
    port = tonumber(port)
    local f = group:next():submit(function(port)
      return netrun.spawn(function()
        local http = require("netrun.http")
        local out = {}
        for _, max in ipairs { 1000, 10 } do
          local ok, res = pcall(function()
            return http.request { url = "http://127.0.0.1:" .. port .. "/",
                                  stream = true, max_body = max }:await()
          end)
          -- the pieces joined (reads may split them anywhere: the fault
          -- shim's short reads do), then "|" and how it ended
          local parts, ending = {}, nil
          if not ok then ending = "FAILED " .. tostring(res) end
          while ok do
            local d, err = res:read()
            if err then ending = "ERR " .. err break end
            if not d then break end
            parts[#parts + 1] = d
          end
          out[#out + 1] = table.concat(parts) .. (ending and ("|" .. ending) or "")
        end
        local ok, err = pcall(function()
          return http.request { url = "http://127.0.0.1:" .. port .. "/", stream = true,
                                timeout = 0.3 }:await()
        end)
        out[#out + 1] = tostring(ok) .. " " .. tostring(err)
        return out
      end)
    end, port)
    srv:settimeout(10)
    local c = assert(srv:accept())
    read_head(c)
    c:send("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten..")
    socket.select(nil, nil, 0.1)
    c:close()
    c = assert(srv:accept())
    read_head(c)
    c:send("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
    local c3 = assert(srv:accept())               -- says nothing
    local out = H.sync(H.sync(f), 30)
    assert.matches("^only ten%.%.|ERR .*closed in the middle of a response", out[1])
    assert.matches("^|FAILED .*over max_body", out[2])   -- (its Content-Length says so)
    assert.matches("^false .*timeout", out[3])
    c:close(); c3:close(); srv:close()
  end)
end)
