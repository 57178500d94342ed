-- stream_spec.lua -- a byte stream arrives whole and in order, however the
-- sockets split it: a netrun client writes 2 MiB in pieces of every size
-- (strings and gathered arrays, flushed at random points) through a netrun
-- echo server, and gets back exactly what it wrote. Streams (netrun.stream,
-- the cosockets) at the end of their input: a peer that closes, a peer
-- that half-closes (nc -N, nc -q0, shutdown(SHUT_WR), a TLS close_notify
-- from Node), and lines that arrive in pieces as small as one byte. Run
-- under the fault shim (lua-fault/stream_spec) every read and write on
-- both sides may be short, meet EAGAIN or EINTR.
local H = require "spec.helper"
local netrun = H.netrun
local socket = H.socket

local TOTAL = 2 << 20

-- The pieces of the stream: deterministic, so the loop that writes them and
-- the test that checks them agree. Returns an array of pieces, each a string
-- or an array of strings, and whether to flush after it.
local function pieces(total)
  local seed = 12345
  local function rand(n)                      -- 1 .. n
    seed = (seed * 1103515245 + 12345) % 2147483648
    return seed % n + 1
  end
  local out, n, i = {}, 0, 0
  while n < total do
    i = i + 1
    local size = math.min(total - n, rand(4) == 1 and rand(3) or rand(40000))
    local s = string.char(rand(256) - 1):rep(size // 2) .. tostring(i):rep(size):sub(1, size - size // 2)
    if rand(3) == 1 and size > 2 then
      out[#out + 1] = { { s:sub(1, size // 2), s:sub(size // 2 + 1) }, rand(4) == 1 }
    else
      out[#out + 1] = { s, rand(4) == 1 }
    end
    n = n + size
  end
  return out
end

local function flatten(ps)
  local t = {}
  for _, p in ipairs(ps) do
    t[#t + 1] = type(p[1]) == "table" and table.concat(p[1]) or p[1]
  end
  return table.concat(t)
end

describe("a stream", function()
  local group
  setup(function() group = netrun.group { threads = 2, name = "stream" } end)
  teardown(function() H.shutdown(group) end)

  it("comes back whole and in order through an echo server", function()
    local server, port = H.echo_server(group)
    local got = netrun.promise()
    local ch = netrun.connect { group = group, host = "127.0.0.1", port = port, timeout = 5,
      init = function(c)
        local parts, n = {}, 0
        c:pipeline():add_last("collect", {
          channel_read = function(self, ctx, msg)
            parts[#parts + 1] = msg
            n = n + #msg
            if n >= TOTAL then got:try_success(table.concat(parts)) end
          end,
        })
      end }:sync()
    local last = ch:loop():submit(function(c, pieces, total)
      local f
      for _, p in ipairs(pieces(total)) do
        f = p[2] and c:write_and_flush(p[1]) or c:write(p[1])
      end
      c:flush()
      return f
    end, ch, pieces, TOTAL):sync()
    H.sync(last, 60)
    assert.is_true(last:is_success())
    local data = H.sync(got, 60)
    local want = flatten(pieces(TOTAL))
    assert.equal(#want, #data)
    if data ~= want then
      local i = 1
      while data:byte(i) == want:byte(i) do i = i + 1 end
      error("the stream differs from byte " .. i .. " on")
    end
    ch:close():sync()
    server:close():sync()
  end)
end)

-- A stream server on its own port: fn(s) per connection.
local function stream_server(group, fn, opts)
  local o = { group = group, host = "127.0.0.1", port = 0, stream = fn }
  for k, v in pairs(opts or {}) do o[k] = v end
  local server = netrun.server(o):sync()
  local _, port = server:local_address()
  return server, port
end

describe("a stream whose peer closes", function()
  it("gets nil, 'closed' from every receive after EOF; its loop serves the others and shuts down", function()
    local one = netrun.group { threads = 1, name = "stream-eof" }
    local eof, result, ignoring = netrun.promise(), netrun.promise(), netrun.promise()
    local server, port = stream_server(one, function(s)
      local what = s:receive("*l")
      if what == "spin" then
        eof:set_success(s:receive("*a"))           -- "abc": the bytes before the FIN
        -- LuaSocket's loop (bounded in CPU time for the spec's sake)
        local n, t0, data = 0, os.clock()
        repeat data = s:receive("*a"); n = n + 1 until not data or os.clock() - t0 > 5
        local r = { n = n }
        for _, pattern in ipairs { "*l", "*a", 0, 10 } do r[#r + 1] = { s:receive(pattern) } end
        r[#r + 1] = { s:receive_until("\r\n") }
        result:set_success(r)
      elseif what == "ignore" then
        -- a loop that ignores what receive says: each try yields a turn
        local t0, tries = os.clock(), 0
        while os.clock() - t0 < 20 do
          s:receive("*l")
          tries = tries + 1
          if tries == 100 then ignoring:set_success(tries) end
        end
      else
        s:send("pong " .. tostring(what) .. "\n")
      end
    end)
    local a = H.client(port)
    a:send("spin\nabc")
    a:close()
    assert.equal("abc", H.sync(eof))
    local function ping()                          -- another connection on the same loop
      local b = H.client(port)
      b:settimeout(3)
      assert(b:send("ping\n"))
      assert.equal("pong ping", b:receive("*l"))
      b:close()
    end
    ping()
    local c = H.client(port)
    c:send("ignore\n")
    c:close()
    assert.equal(100, H.sync(ignoring))
    ping()
    local closed = { nil, "closed", "" }
    assert.same({ n = 1, closed, closed, closed, closed, closed }, H.sync(result))
    server:close():sync()
    -- the coroutine that ignores errors still loops: a graceful shutdown ends it
    H.sync(one:shutdown_gracefully(0, 5), 10)
    assert.is_true(one:is_terminated())
  end)
end)

describe("a stream whose peer resets", function()
  it("mid-line: nil, 'closed' with what came, then 'closed' from every call", function()
    local got = netrun.promise()
    local one = netrun.group { threads = 1, name = "stream-reset" }
    local server, port = stream_server(one, function(s)
      if s:receive("*l") == "ping" then return s:send("pong\n") end
      local r = { { s:receive("*l") } }
      r[2] = { s:receive("*l") }
      r[3] = { s:receive(1) }
      local ok, err = s:send("late")
      r[4] = { ok, err }
      got:set_success(r)
    end)
    local c = H.client(port)
    c:send("go\nhalf a li")
    local b = H.client(port)                    -- the loop has most likely read c's bytes
    b:send("ping\n")                            -- once it answers this
    assert.equal("pong", b:receive("*l"))
    b:close()
    c:setoption("linger", { on = true, timeout = 0 })
    c:close()                                   -- RST
    local r = H.sync(got)
    -- (a reset may destroy bytes the kernel had not handed over yet)
    assert.is_true(r[1][3] == "half a li" or r[1][3] == "", tostring(r[1][3]))
    r[1][3] = nil
    local closed = { nil, "closed", "" }
    assert.same({ { nil, "closed" }, closed, closed, { nil, "closed" } }, r)
    server:close():sync()
    H.shutdown(one)
  end)
end)

describe("a stream that sends", function()
  it("to a peer that reads as fast as it writes yields a turn every buffer_limit bytes", function()
    local one = netrun.group { threads = 1, name = "stream-send" }
    local discard, port = H.echo_server(one, { channel_read = function() end })
    local loop = one:next()
    local r = H.sync(H.sync(loop:submit(function(p)
      return netrun.spawn(function()
        local s = netrun.tcp.connect("127.0.0.1", p, { timeout = 5 }):await()
        local turns = 0                      -- tasks run while the sends went on
        local function count() turns = turns + 1 end
        local piece = string.rep("s", 1024)
        for i = 1, 1024 do
          netrun.current():execute(count)    -- runs once the coroutine yields
          assert(s:send(piece))
        end
        s:close()
        return turns
      end)
    end, port)), 30)
    -- 1 MiB in 1 KiB sends: a turn at least every 64 KiB, whatever the
    -- kernel's buffers took (backpressure adds turns of its own)
    assert.is_true(r >= 1024 * 1024 // (64 * 1024) - 1, "turns: " .. r)
    discard:close():sync()
    H.shutdown(one)
  end)
end)

describe("a stream whose peer half-closes", function()
  local group, dir
  setup(function()
    group = netrun.group { threads = 1, name = "stream-half" }
    dir = H.tmpdir()
    assert(H.run("bash " .. H.root .. "/spec/fixtures/tls/make_certs.sh " .. dir))
  end)
  teardown(function() H.shutdown(group) end)

  -- Reads lines until its input ends, then answers: after the peer's FIN.
  local function summary(s)
    s:settimeout(5)
    local lines = {}
    repeat
      local line, err, partial = s:receive("*l")
      if not line and partial ~= "" then lines[#lines + 1] = partial end
      lines[#lines + 1] = line or "then " .. err
    until not line
    assert(s:send(table.concat(lines, ",") .. "\n"))
  end

  it("answers nc -N and nc -q0 after their FIN, by default", function()
    local server, port = stream_server(group, summary)
    for _, flag in ipairs { "-N", "-q0" } do
      local out, status = H.run("printf 'one\\ntwo\\r\\n' | timeout 10 nc " .. flag .. " 127.0.0.1 " .. port)
      assert.equal(0, status, out)
      assert.equal("one,two,then closed\n", out)
    end
    server:close():sync()
  end)

  it("sees a raw socket's shutdown(SHUT_WR) as the end, with allow_half_closure asked for or not", function()
    for _, child_options in ipairs { {}, { allow_half_closure = true } } do
      local server, port = stream_server(group, summary, { child_options = child_options })
      local c = H.client(port)
      c:send("x\nlast without newline")
      c:shutdown("send")
      assert.equal("x,last without newline,then closed", c:receive("*l"))
      assert.same({ nil, "closed", "" }, { c:receive("*a") })
      c:close()
      server:close():sync()
    end
  end)

  it("with allow_half_closure = false the FIN closes the channel: the answer cannot go", function()
    local sent = netrun.promise()
    local server, port = stream_server(group, function(s)
      local line = s:receive("*l")
      local _, err = s:receive("*l")
      local ok, send_err = s:send("late\n")
      sent:set_success({ line, err, ok, send_err })
    end, { child_options = { allow_half_closure = false } })
    local c = H.client(port)
    c:send("x\n")
    c:shutdown("send")
    assert.same({ "x", "closed", nil, "closed" }, H.sync(sent))
    c:close()
    server:close():sync()
  end)

  it("takes a TLS close_notify (Node's end()) as the end of the input and still answers", function()
    local tls = netrun.tls.server { cert = dir .. "/server.crt", key = dir .. "/server.key" }
    local server, port = stream_server(group, summary, { tls = tls })
    local js = dir .. "/half_close.js"
    local f = assert(io.open(js, "w"))
    f:write(string.format([[
      const tls = require('tls'), fs = require('fs');
      const s = tls.connect({ port: %d, host: '127.0.0.1', servername: 'localhost',
                              ca: fs.readFileSync('%s/ca.crt'), allowHalfOpen: true,
                              maxVersion: process.argv[2] }, () => s.end('a\nb\n'));
      let got = '';
      s.on('data', d => got += d);
      s.on('end', () => process.stdout.write(s.getProtocol() + ' ' + got));
      s.on('error', e => { console.log('error ' + e.message); process.exitCode = 1; });
    ]], port, dir))
    f:close()
    for _, version in ipairs { "TLSv1.3", "TLSv1.2" } do
      local out, status = H.run("timeout 20 /usr/bin/node " .. js .. " " .. version)
      assert.equal(0, status, out)
      assert.equal(version .. " a,b,then closed\n", out)
    end
    server:close():sync()
  end)

  it("behind TLS starts once the handshake is done: a greeting sent at once, then a return, arrives", function()
    local tls = netrun.tls.server { cert = dir .. "/server.crt", key = dir .. "/server.key" }
    local server, port = stream_server(group, function(s) s:send("greetings\n") end, { tls = tls })
    local out, status = H.run(string.format("timeout 10 openssl s_client -quiet -connect 127.0.0.1:%d " ..
      "-servername localhost -CAfile %s/ca.crt -verify_return_error < /dev/null", port, dir))
    assert.equal(0, status, out)
    assert.matches("\ngreetings\n$", out)      -- after s_client's verify lines
    server:close():sync()
  end)

  it("a client stream sees its server's half-close as the end and can still send", function()
    local listener = assert(socket.bind("127.0.0.1", 0))
    listener:settimeout(5)
    local _, port = listener:getsockname()
    local loop = group:next()
    local done = H.sync(loop:submit(function(p)
      return netrun.spawn(function()
        local s = netrun.tcp.connect("127.0.0.1", p, { timeout = 5 }):await()
        local all, err = s:receive("*a")
        local again, again_err = s:receive("*l")
        local ok = s:send("got " .. tostring(all or err) .. "\n")
        s:close()
        return { all, again, again_err, ok }
      end)
    end, tonumber(port)))
    local c = assert(listener:accept())
    c:settimeout(5)
    c:send("hello")
    c:shutdown("send")
    assert.equal("got hello", c:receive("*l"))
    assert.same({ "hello", nil, "closed", true }, H.sync(done))
    c:close()
    listener:close()
  end)
end)

describe("a stream's lines", function()
  local group
  setup(function() group = netrun.group { threads = 1, name = "stream-lines" } end)
  teardown(function() H.shutdown(group) end)

  -- data split at each delim, as receive_until returns it, and the rest
  local function split(data, delim)
    local out, i = {}, 1
    while true do
      local j = data:find(delim, i, true)
      if not j then return out, data:sub(i) end
      out[#out + 1] = data:sub(i, j - 1)
      i = j + #delim
    end
  end

  it("are found across chunks as small as one byte, delimiters split between them", function()
    local seed, bytes = 7, {}
    for i = 1, 3000 do
      seed = (seed * 1103515245 + 12345) % 2147483648
      bytes[i] = ({ "a", "b", "\r", "\n" })[seed // 65536 % 4 + 1]
    end
    local data = table.concat(bytes)
    for _, len in ipairs { 1, 2, 3, 7 } do
      for _, delim in ipairs { "abab", "\r\n\r\n", "aab", "*l" } do
        local got = netrun.promise()
        local server, port = stream_server(group, function(s)
          local out = {}
          while true do
            local piece, err, partial
            if delim == "*l" then piece, err, partial = s:receive("*l")
            else piece, err, partial = s:receive_until(delim) end
            if not piece then
              got:set_success({ out = out, err = err, rest = partial })
              return
            end
            out[#out + 1] = piece
          end
        end, { init = function(ch)
          ch:pipeline():add_last("split", netrun.codec.fixed_length { length = len })
        end })
        local c = H.client(port)
        c:send(data:sub(1, #data - #data % len))    -- whole frames only
        c:close()
        local want, rest = split(data:sub(1, #data - #data % len), delim == "*l" and "\n" or delim)
        if delim == "*l" then
          for i, l in ipairs(want) do want[i] = l:gsub("\r$", "") end
        end
        assert.same({ out = want, err = "closed", rest = rest }, H.sync(got),
          "frames of " .. len .. ", delimiter " .. delim)
        server:close():sync()
      end
    end
  end)

  it("cost memory linear in their bytes however finely they arrive", function()
    local got = netrun.promise()
    local N = 256 * 1024
    local server, port = stream_server(group, function(s)
      -- what the Lua state allocates meanwhile, the collector stopped
      collectgarbage()
      collectgarbage("stop")
      local m0 = collectgarbage("count")
      local line = s:receive("*l")
      local m1 = collectgarbage("count")
      local head = s:receive_until("\r\n\r\n")
      local m2 = collectgarbage("count")
      collectgarbage("restart")
      got:set_success({ line = #line, head = #head, line_kib = m1 - m0, head_kib = m2 - m1 })
    end, { init = function(ch)
      ch:pipeline():add_last("split", netrun.codec.fixed_length { length = 256 })
    end })
    local c = H.client(port)
    c:send(string.rep("x", N - 1) .. "\n")
    local head = string.rep("y\r\n", (N - 5) // 3)      -- CRLFs, and no CRLFCRLF until the end
    c:send(head .. string.rep("z", N - 4 - #head) .. "\r\n\r\n")
    local r = H.sync(got, 30)
    assert.equal(N - 1, r.line)
    assert.equal(N - 4, r.head)
    -- 1024 wakes of 256 bytes: each byte kept once and copied once, plus a
    -- few hundred bytes a wake; rebuilding the buffer each wake took ~128 MiB
    assert.is_true(r.line_kib < 4096, "a 256 KiB line allocated " .. r.line_kib .. " KiB")
    assert.is_true(r.head_kib < 4096, "a 256 KiB receive_until allocated " .. r.head_kib .. " KiB")
    c:close()
    server:close():sync()
  end)
end)
