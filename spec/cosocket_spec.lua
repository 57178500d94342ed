-- cosocket_spec.lua -- DESIGN.md §8.2: streams (OpenResty's cosockets).
-- netrun.server { stream = fn } against LuaSocket, netrun.tcp.connect
-- against netrun servers; timeouts, closed peers, many streams on one
-- loop, and the inbound buffer's bound.
local H = require "spec.helper"
local netrun = H.netrun

-- Run fn(...) in a coroutine on loop; returns its result (bounded).
local function on_loop(loop, fn, ...)
  local spawned = H.sync(loop:submit(function(f, ...)
    return netrun.spawn(f, ...)
  end, fn, ...))
  return H.sync(spawned, 30)
end

-- A stream server on group; returns it and its port.
local function stream_server(group, fn, child_options)
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0, stream = fn,
    child_options = child_options,
  }:sync()
  local _, port = server:local_address()
  return server, port
end

describe("streams", function()
  local group
  setup(function() group = netrun.group { threads = 2, name = "stream" } end)
  teardown(function() H.shutdown(group) end)

  it("a stream echo server answers a LuaSocket client line by line", function()
    local server, port = stream_server(group, function(s)
      while true do
        local line, err = s:receive("*l")
        if not line then break end
        assert(s:send({ "[", line, "]\n" }))
      end
    end)
    local c = H.client(port)
    local long = string.rep("x", 200000)
    assert(c:send("one\ntwo\r\n" .. long .. "\n\n"))
    assert.equal("[one]", c:receive("*l"))
    assert.equal("[two]", c:receive("*l"))
    assert.equal("[" .. long .. "]", c:receive("*l"))
    assert.equal("[]", c:receive("*l"))
    c:close()
    server:close():sync()
  end)

  it("a stream reads when it receives even if child_options turn auto_read off", function()
    local server, port = stream_server(group, function(s)
      s:send("got " .. tostring(s:receive("*l")) .. "\n")
    end, { auto_read = false })
    local c = H.client(port)
    c:settimeout(3)
    c:send("x\n")
    assert.equal("got x", c:receive("*l"))
    c:close()
    server:close():sync()
  end)

  it("codecs below a stream: a line codec's frames arrive as bytes; tables close the channel", function()
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch) ch:pipeline():add_last("line", netrun.codec.line { strip = false }) end,
      stream = function(s)
        local a, b = s:receive("*l"), s:receive("*l")
        s:send(a .. "+" .. b .. "\n")
      end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    c:send("one\ntw")
    c:send("o\n")
    assert.equal("one+two", c:receive("*l"))
    c:close()
    server:close():sync()
    local http = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch) ch:pipeline():add_last("http", netrun.codec.http_server {}) end,
      stream = function(s) s:receive("*l") end,
    }:sync()
    _, port = http:local_address()
    c = H.client(port)
    c:send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    local data, err = c:receive("*a")
    assert.is_true(data == "" or err == "closed", tostring(err))   -- closed, no answer
    c:close()
    http:close():sync()
  end)

  it("client streams: send, receive n, receive_until and *a against netrun servers", function()
    local echo, echo_port = H.echo_server(group)
    local server, port = stream_server(group, function(s)
      local n = tonumber(s:receive("*l"))
      s:send(string.rep("z", n))
    end)
    local got = on_loop(group:next(), function(p1, p2)
      local s = netrun.tcp.connect("127.0.0.1", p1, { timeout = 2 }):await()
      assert(s:send("GET / HTTP/1.1\r\nHost: x\r\n\r\nbody12345"))
      local head = s:receive_until("\r\n\r\n")
      local body = s:receive(5)
      local rest = s:receive(4)
      s:close()
      local t = netrun.tcp.connect("localhost", p2):await()   -- a name: resolved off the loop
      t:send("300000\n")
      local all = t:receive("*a")
      local again, err = t:receive(1)
      return { head = head, body = body, rest = rest, n = #all,
               ok = all == string.rep("z", 300000), again = again, err = err,
               channel = t:channel():id() > 0 }
    end, echo_port, port)
    assert.equal("GET / HTTP/1.1\r\nHost: x", got.head)
    assert.equal("body1", got.body)
    assert.equal("2345", got.rest)
    assert.equal(300000, got.n)
    assert.is_true(got.ok)
    assert.is_nil(got.again)
    assert.equal("closed", got.err)
    assert.is_true(got.channel)
    echo:close():sync()
    server:close():sync()
  end)

  it("a timeout returns nil, 'timeout' and the stream is still usable; a loop timer kept firing", function()
    local echo, port = H.echo_server(group)
    local got = on_loop(group:next(), function(p)
      local ticks = 0
      local timer = netrun.current():schedule_at_fixed_rate(0.01, 0.01, function() ticks = ticks + 1 end)
      local s = netrun.tcp.connect("127.0.0.1", p):await()
      s:settimeout(0.2)
      local t0 = netrun.now()
      local data, err, partial = s:receive(5)
      local waited = netrun.now() - t0
      local line, lerr = s:receive("*l")
      assert(s:send("hello"))
      local after = s:receive(5)
      s:settimeout(nil)
      assert(s:send("line\n"))
      local l2 = s:receive("*l")
      timer:cancel()
      s:close()
      return { data = data, err = err, partial = partial, waited = waited,
               lerr = lerr, after = after, l2 = l2, ticks = ticks, line = line }
    end, port)
    assert.is_nil(got.data)
    assert.equal("timeout", got.err)
    assert.equal("", got.partial)
    assert.is_true(got.waited >= 0.19 and got.waited < 2, "waited " .. got.waited)
    assert.is_nil(got.line)
    assert.equal("timeout", got.lerr)
    assert.equal("hello", got.after)
    assert.equal("line", got.l2)
    assert.is_true(got.ticks >= 10, "ticks " .. got.ticks)
    echo:close():sync()
  end)

  it("a closed peer returns nil, 'closed' and what was read; a send after its FIN goes out", function()
    local server, port = stream_server(group, function(s)
      local what = s:receive("*l")
      s:send(what == "n" and "partial" or "no newline")
    end)
    local got = on_loop(group:next(), function(p)
      -- without half-closure the peer's FIN closes the channel: sends fail
      local s = netrun.tcp.connect("127.0.0.1", p, { options = { allow_half_closure = false } }):await()
      s:send("n\n")
      local a, aerr, apart = s:receive(100)
      local d, derr = s:send("late")
      -- by default the stream stays half-open: TCP cannot tell a peer that
      -- only stopped sending from one that is gone, so a send goes out; the
      -- peer that is gone answers it with a reset, which closes the stream
      local t = netrun.tcp.connect("127.0.0.1", p):await()
      t:send("l\n")
      local b, berr, bpart = t:receive("*l")
      local c, cerr = t:send("late")
      local e, eerr, tries = true, nil, 0
      repeat
        netrun.sleep(0.01)
        e, eerr = t:send("x")
        tries = tries + 1
      until not e or tries == 500
      local f, ferr = t:receive(1)
      return { a = a, aerr = aerr, apart = apart, b = b, berr = berr, bpart = bpart,
               c = c, cerr = cerr, d = d, derr = derr, e = e, eerr = eerr, f = f, ferr = ferr }
    end, port)
    assert.same({ aerr = "closed", apart = "partial", derr = "closed",
                  berr = "closed", bpart = "no newline", c = true,
                  eerr = "closed", ferr = "closed" }, got)
    server:close():sync()
  end)

  it("a line without its end past max_line returns nil, 'line too long' and keeps the bytes", function()
    local echo, port = H.echo_server(group)
    local got = on_loop(group:next(), function(p)
      local stream = require "netrun.stream"
      local max = stream.max_line
      stream.max_line = 1000
      local s = netrun.tcp.connect("127.0.0.1", p):await()
      s:send(string.rep("a", 5000))
      local line, err = s:receive("*l")
      stream.max_line = max
      local bytes = s:receive(5000)
      s:close()
      return { line = line, err = err, n = #bytes }
    end, port)
    assert.is_nil(got.line)
    assert.equal("line too long", got.err)
    assert.equal(5000, got.n)
    echo:close():sync()
  end)

  it("a receive past max_receive returns nil, 'too long' and keeps the bytes; after close, 'closed'", function()
    local echo, port = H.echo_server(group)
    local got = on_loop(group:next(), function(p)
      local stream = require "netrun.stream"
      local max = stream.max_receive
      stream.max_receive = 1000
      local s = netrun.tcp.connect("127.0.0.1", p):await()
      -- a length the peer might have sent: refused before anything is read
      local big, big_err = s:receive(1 << 40)
      s:send(string.rep("a", 5000))
      s:settimeout(5)
      local all, all_err = s:receive("*a")           -- the echo server never closes
      stream.max_receive = max
      local bytes = s:receive(5000)
      s:close()
      local after, after_err = s:receive(1)
      local line, line_err = s:receive("*l")
      return { big = big, big_err = big_err, all = all, all_err = all_err, n = #bytes,
               after = after, after_err = after_err, line = line, line_err = line_err }
    end, port)
    assert.same({ big_err = "too long", all_err = "too long", n = 5000,
                  after_err = "closed", line_err = "closed" }, got)
    echo:close():sync()
  end)

  it("a second coroutine receiving on a busy stream gets nil, 'busy'", function()
    local echo, port = H.echo_server(group)
    local got = on_loop(group:next(), function(p)
      local s = netrun.tcp.connect("127.0.0.1", p):await()
      local first = netrun.spawn(function() return s:receive(3) end)
      local data, err = s:receive(3)
      s:send("abc")
      local r = first:await()
      s:close()
      return { data = data, err = err, r = r }
    end, port)
    assert.is_nil(got.data)
    assert.equal("busy", got.err)
    assert.equal("abc", got.r)
    echo:close():sync()
  end)

  it("an error in the stream function closes the connection", function()
    local server, port = stream_server(group, function(s)
      local line = s:receive("*l")
      if line == "boom" then error("stream boom") end
      s:send("fine\n")
    end)
    local c = H.client(port)
    c:send("boom\n")
    local data, err = c:receive("*l")
    assert.is_nil(data)
    assert.equal("closed", err)
    c:close()
    server:close():sync()
  end)

  it("1000 concurrent streams on one loop", function()
    local loop_group = netrun.group { threads = 1, name = "streams1k" }
    local server, port = stream_server(loop_group, function(s)
      local line = s:receive("*l")
      if line then s:send(line .. "\n") end
    end)
    local n = 1000
    local got = on_loop(loop_group:next(), function(p, count)
      local futures = {}
      for i = 1, count do
        futures[i] = netrun.spawn(function()
          local s = netrun.tcp.connect("127.0.0.1", p, { timeout = 10 }):await()
          s:send("conn " .. i .. "\n")
          local line, err = s:receive("*l")
          s:close()
          return line == "conn " .. i
        end)
      end
      local ok = 0
      for _, r in ipairs(netrun.all(futures):await()) do
        if r then ok = ok + 1 end
      end
      return ok
    end, port, n)
    assert.equal(n, got)
    server:close():sync()
    H.shutdown(loop_group)
  end)

  it("a peer sending 10 MiB to a stream that never receives: the buffer stays bounded", function()
    local go, total = netrun.promise(), netrun.promise()
    local server, port = stream_server(group, function(s)
      go:await()                       -- receives nothing until told
      local n = 0
      s:settimeout(10)
      while true do
        local data, err, partial = s:receive(65536)
        n = n + #(data or partial)
        if not data then break end
      end
      total:set_success(n)
    end, { rcvbuf = 65536 })
    collectgarbage()
    local before = H.rss()
    local c = H.client(port)
    c:settimeout(0.5)
    local chunk = string.rep("f", 65536)
    local sent = H.flood(c, chunk, 10 * 1024 * 1024)
    collectgarbage()
    local grown = H.rss() - before
    assert.is_true(sent < 10 * 1024 * 1024, "the stream read everything: " .. sent)
    if not H.sanitized then
      assert.is_true(grown < 3 * 1024, "RSS grew by " .. grown .. " KiB")
    end
    go:set_success(true)                -- now it reads: everything arrives
    c:settimeout(10)
    local rest = string.rep("r", 100000)
    assert(c:send(rest))
    c:close()
    assert.equal(sent + #rest, H.sync(total, 30))
    server:close():sync()
  end)

  it("send waits while the channel is unwritable: a peer that reads nothing holds it", function()
    local chunks = 160                       -- 10 MiB in 64 KiB sends
    local server, port = stream_server(group, function(s)
      local progress = netrun.shared.dict("stream_spec_send")
      local chunk = string.rep("s", 65536)
      for i = 1, 160 do
        assert(s:send(chunk))
        progress:set("sent", i)
      end
    end, { sndbuf = 65536 })
    local progress = netrun.shared.dict("stream_spec_send")
    progress:set("sent", 0)
    collectgarbage()
    local before = H.rss()
    local c = H.client(port)
    local held = H.stalled(group:next(), function()
      local n = netrun.shared.dict("stream_spec_send"):get("sent")
      return n ~= nil and n > 0 and n or nil
    end)
    local grown = H.rss() - before
    assert.is_true(held < chunks, "every send went through: " .. tostring(held))
    if not H.sanitized then
      assert.is_true(grown < 3 * 1024, "RSS grew by " .. grown .. " KiB")
    end
    c:settimeout(10)
    assert.equal(chunks * 65536, #H.recv(c, chunks * 65536))
    assert.equal(chunks, progress:get("sent"))
    c:close()
    server:close():sync()
  end)

  it("receive outside a coroutine raises; a stream used on another loop raises", function()
    local echo, port = H.echo_server(group)
    local loop = group:next()
    local got = on_loop(loop, function(p)
      local s = netrun.tcp.connect("127.0.0.1", p):await()
      local done = netrun.promise()
      netrun.current():execute(function()
        local ok, err = pcall(s.receive, s)
        done:set_success(err)
      end)
      local err = done:await()
      return { err = err, s = s }
    end, port)
    assert.matches("netrun stream: s:receive waits, so it must run inside netrun.spawn", got.err, 1, true)
    local ok, err = pcall(got.s.receive, got.s)
    assert.is_false(ok)
    assert.matches("lives on another loop", err, 1, true)
    echo:close():sync()
  end)

  it("misuse raises clear errors", function()
    assert.has_error(function() netrun.tcp.connect("127.0.0.1", 1) end,
      "netrun.tcp.connect: a stream lives on a loop: call it inside netrun.spawn on one (the main thread is not a loop)")
    assert.has_error(function() netrun.tcp.connect("127.0.0.1", "http") end,
      'netrun.tcp.connect: port must be an integer from 1 to 65535, got "http"')
    assert.has_error(function() netrun.server { group = group, port = 0, stream = 42 } end,
      "netrun.server: stream must be a function, got 42")
    local ok, err = pcall(netrun.server, { group = group, port = 0, straem = print })
    assert.is_false(ok)
    assert.matches("did you mean 'stream'", err, 1, true)
  end)

  it("a refused connect fails the future naming host and port", function()
    local port = H.free_port()
    local err = on_loop(group:next(), function(p)
      local ok, e = pcall(function() return netrun.tcp.connect("127.0.0.1", p):await() end)
      return e
    end, port)
    assert.matches("netrun.tcp.connect: 127.0.0.1:" .. port, err, 1, true)
  end)
end)
