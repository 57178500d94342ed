-- websocket_spec.lua -- WebSocket (RFC 6455, DESIGN §8.3) against real
-- peers: Python's websockets (Debian's python3-websockets) as client and
-- server, a raw LuaSocket client for what a well-behaved library never
-- sends (unmasked frames, bad UTF-8, oversize, garbage, a reset mid-frame,
-- a first frame in the upgrade's packet), and netrun's own client.
local H = require "spec.helper"
local netrun, socket = H.netrun, H.socket

local PY = "/usr/bin/python3 " .. H.root .. "/spec/fixtures/ws/peer.py"
local group = netrun.group { threads = 1, name = "wsspec" }
local seen = netrun.shared.dict("websocket_spec")

-- The server: an HTTP codec whose handler upgrades every request, then
-- echoes messages; "bye" makes it close, "slow" makes it answer nothing.
-- What it saw of closes goes to `seen` under the test's tag.
local App = {}
App.__index = App
function App:channel_read(ctx, msg)
  if msg.method and self.opts.refuse then
    ctx:write { status = 404, body = "no websocket here" }
  elseif msg.method then
    local ok, why = netrun.websocket.upgrade(ctx, msg, self.opts)
    if not ok then seen:set(self.tag .. ":refused", why) end
  elseif msg.data == "bye" then
    ctx:close()
  else
    seen:incr(self.tag .. ":messages", 1, 0)
    ctx:write(msg.type == "text" and msg.data or msg)
  end
end
function App:channel_read_complete(ctx) ctx:flush() end
function App:user_event_triggered(ctx, e)
  if type(e) == "table" and e.type == "close" then
    seen:set(self.tag .. ":close", e.code .. " " .. e.reason)
  end
end
function App:channel_inactive(ctx) seen:incr(self.tag .. ":inactive", 1, 0) end
function App:exception_caught(ctx, err)
  seen:set(self.tag .. ":exception", tostring(err))
  ctx:close()
end

local servers = {}
local function ws_server(tag, opts, tls)
  local s = H.sync(netrun.server {
    group = group, host = "127.0.0.1", port = 0, tls = tls,
    init = function(ch)
      ch:pipeline():add_last("http", netrun.codec.http_server())
      ch:pipeline():add_last("app", setmetatable({ tag = tag, opts = opts or {} }, App))
    end,
  })
  servers[#servers + 1] = s
  local _, port = s:local_address()
  return port
end

local function url(port) return "ws://127.0.0.1:" .. port .. "/ws" end

local function py(args)
  local out, st = H.run("timeout 90 " .. PY .. " " .. args)
  assert(st == 0, "peer.py " .. args .. " failed:\n" .. out)
  return out
end

-- ---- a raw client -----------------------------------------------------------

local KEY, ACCEPT = "dGhlIHNhbXBsZSBub25jZQ==", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
local UPGRADE = "GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
  .. "Connection: Upgrade\r\nSec-WebSocket-Key: " .. KEY
  .. "\r\nSec-WebSocket-Version: 13\r\n\r\n"

-- A frame as a client sends it (masked unless o.mask == false).
local function frame(op, payload, o)
  o = o or {}
  local b0 = (o.fin == false and 0 or 0x80) | (o.rsv or 0) | op
  local m = o.mask == false and 0 or 0x80
  local n = o.len or #payload
  local head
  if n < 126 then head = string.char(b0, m | n)
  elseif n < 65536 then head = string.char(b0, m | 126) .. string.pack(">I2", n)
  else head = string.char(b0, m | 127) .. string.pack(">I8", n) end
  if m == 0 then return head .. payload end
  local key = { 0x37, 0xfa, 0x21, 0x3d }
  local out = {}
  for i = 1, #payload do
    out[i] = string.char(payload:byte(i) ~ key[(i - 1) % 4 + 1])
  end
  return head .. string.char(table.unpack(key)) .. table.concat(out)
end

-- Connect and upgrade (extra: bytes sent in the same packet); returns the
-- socket once the 101 head has been read.
local function raw(port, extra)
  local c = H.client(port)
  c:send(UPGRADE .. (extra or ""))
  local status = c:receive("*l")
  assert.equal("HTTP/1.1 101 Switching Protocols", status)
  local accept
  repeat
    local line = assert(c:receive("*l"))
    accept = accept or line:match("^Sec%-WebSocket%-Accept: (.*)$")
  until line == ""
  assert.equal(ACCEPT, accept)
  return c
end

-- Connect and upgrade offering permessage-deflate; returns the socket and
-- the server's Sec-WebSocket-Extensions (nil: declined).
local function raw_deflate(port)
  local c = H.client(port)
  c:send(UPGRADE:gsub("\r\n\r\n$", "\r\nSec-WebSocket-Extensions: permessage-deflate; "
    .. "client_max_window_bits\r\n\r\n"))
  assert.equal("HTTP/1.1 101 Switching Protocols", c:receive("*l"))
  local ext
  repeat
    local line = assert(c:receive("*l"))
    ext = ext or line:match("^Sec%-WebSocket%-Extensions: (.*)$")
  until line == ""
  return c, ext
end

-- A server frame: opcode and payload (a close's: code and reason), or nil
-- and the socket's error.
local function read_frame(c)
  local h, err = c:receive(2)
  if not h then return nil, err end
  local b0, b1 = h:byte(1, 2)
  assert.equal(0, b1 & 0x80, "a server frame is never masked")
  local n = b1 & 0x7f
  if n == 126 then n = string.unpack(">I2", c:receive(2))
  elseif n == 127 then n = string.unpack(">I8", c:receive(8)) end
  local payload = n > 0 and assert(c:receive(n)) or ""
  local op = b0 & 0x0f
  if op == 8 then
    return op, #payload >= 2 and string.unpack(">I2", payload) or 1005, payload:sub(3)
  end
  return op, payload
end

-- The close the server sends, and then the end of the connection.
local function expect_close(c, code)
  local op, got, why = read_frame(c)
  assert.equal(8, op, "expected a close frame, got " .. tostring(op))
  assert.equal(code, got, why)
  local _, err = c:receive(1)
  assert.equal("closed", err)
  return why
end

describe("websocket", function()
  teardown(function()
    for _, s in ipairs(servers) do s:close():sync() end
    H.shutdown(group)
  end)

  it("echoes Python's client: text, binary, its ping answered, a clean close", function()
    local out = py("echo " .. url(ws_server("py")))
    assert.matches("text héllo\n", out, 1, true)
    assert.matches("binary 0001ff\n", out, 1, true)
    assert.matches("pong\n", out, 1, true)
    assert.matches("close_code 1000\n", out, 1, true)
    assert.equal("1000 ", H.eventually(function() return seen:get("py:close") end))
  end)

  it("reassembles a fragmented message", function()
    local out = py("fragments " .. url(ws_server("frag")))
    assert.matches("text frag-1 é frag-2 frag-3\n", out, 1, true)
  end)

  it("answers the peer's close with its status; the handlers see code and reason", function()
    local out = py("close " .. url(ws_server("close")) .. " 4001 done-here")
    assert.matches("close_code 4001\n", out, 1, true)
    assert.equal("4001 done-here", H.eventually(function() return seen:get("close:close") end))
  end)

  it("closes from the server: the close handshake with Python's client", function()
    local out = py("wait_close " .. url(ws_server("bye")))
    assert.matches("close_code 1000\n", out, 1, true)
  end)

  it("serves 200 concurrent connections", function()
    local port = ws_server("many")
    local out = py("many " .. url(port) .. " 200 5")
    assert.matches("connections 200\n", out, 1, true)
    assert.equal(1000, seen:get("many:messages"))
  end)

  it("closes a message over max_message with 1009, to Python's client", function()
    local out = py("big " .. url(ws_server("big", { max_message = 1000 })) .. " 5000")
    assert.matches("close_code 1009\n", out, 1, true)
    local out2 = py("big " .. url(ws_server("big2", { max_message = 10000 })) .. " 5000")
    assert.matches("echoed 5000\n", out2, 1, true)
  end)

  it("decodes a first frame sent in the same packet as the upgrade request", function()
    local c = raw(ws_server("same"), frame(1, "early") .. frame(2, "bird"))
    assert.same({ 1, "early" }, { read_frame(c) })
    assert.same({ 2, "bird" }, { read_frame(c) })
    c:close()
  end)

  it("answers pings with pongs and takes a frame that arrives a few bytes at a time", function()
    local c = raw(ws_server("drip"))
    c:send(frame(9, "are you there"))
    assert.same({ 10, "are you there" }, { read_frame(c) })
    local f = frame(1, "slowly, slowly")
    for i = 1, #f, 4 do
      c:send(f:sub(i, i + 3))
      socket.select(nil, nil, 0.05)      -- pacing, not synchronisation
    end
    assert.same({ 1, "slowly, slowly" }, { read_frame(c) })
    c:close()
  end)

  it("refuses an unmasked client frame with 1002", function()
    local c = raw(ws_server("unmasked"))
    c:send(frame(1, "naked", { mask = false }))
    expect_close(c, 1002)
    assert.equal(0, seen:get("unmasked:messages") or 0)
  end)

  it("refuses reserved bits and opcodes, and a stray continuation, with 1002", function()
    local port = ws_server("reserved")
    for _, f in ipairs { frame(1, "x", { rsv = 0x40 }), frame(3, "x"), frame(0, "x"),
                         frame(9, "x", { fin = false }) } do
      local c = raw(port)
      c:send(f)
      expect_close(c, 1002)
    end
  end)

  it("checks UTF-8 in text messages (1007), across fragments too", function()
    local port = ws_server("utf8")
    local c = raw(port)
    c:send(frame(1, "ok \xc3\xa9"))
    assert.same({ 1, "ok \xc3\xa9" }, { read_frame(c) })
    -- a character split between two fragments is fine
    c:send(frame(1, "split \xc3", { fin = false }) .. frame(0, "\xa9"))
    assert.same({ 1, "split \xc3\xa9" }, { read_frame(c) })
    c:send(frame(1, "bad \xc3\x28"))
    expect_close(c, 1007)
    -- a message ending inside a character
    c = raw(port)
    c:send(frame(1, "a", { fin = false }) .. frame(0, "\xe2\x82"))
    expect_close(c, 1007)
    -- an overlong form and a surrogate
    for _, bad in ipairs { "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80" } do
      c = raw(port)
      c:send(frame(1, bad))
      expect_close(c, 1007)
    end
  end)

  it("closes with 1009 from a frame's head, before its payload arrives, and across fragments", function()
    local port = ws_server("huge", { max_message = 1000 })
    local c = raw(port)
    c:send(frame(2, "", { len = 1 << 40 }))   -- announces a TiB, sends nothing
    expect_close(c, 1009)
    c = raw(port)
    c:send(frame(2, string.rep("a", 600), { fin = false }) .. frame(0, string.rep("b", 600)))
    expect_close(c, 1009)
  end)

  it("closes a client that sends garbage after the upgrade, and 400s garbage instead of HTTP", function()
    local port = ws_server("garbage")
    local c = raw(port)
    c:send("\255\255\255\255 this is not a frame \0\0\0")
    expect_close(c, 1002)
    c = H.client(port)
    c:send("\22\3\1 hello?\r\n\r\n")
    assert.matches("^HTTP/1.1 400", c:receive("*l"))
    c:close()
  end)

  it("survives a peer that resets mid-frame, and serves the next one", function()
    local port = ws_server("reset")
    local c = raw(port)
    c:send(frame(1, string.rep("z", 1000)):sub(1, 500))
    c:setoption("linger", { on = true, timeout = 0 })
    c:close()                                  -- a reset, mid-frame
    H.eventually(function() return seen:get("reset:inactive") end)
    local c2 = raw(port)
    c2:send(frame(1, "next"))
    assert.same({ 1, "next" }, { read_frame(c2) })
    c2:close()
  end)

  it("closes the socket after close_timeout when the peer never answers our close", function()
    local port = ws_server("deaf", { close_timeout = 0.3 })
    local c = raw(port)
    c:send(frame(1, "bye"))
    local t0 = socket.gettime()
    expect_close(c, 1000)                      -- never answered by us
    local took = socket.gettime() - t0
    assert.is_true(took >= 0.25 and took < 5, "closed after " .. took .. " s")
  end)

  it("closes with 1008 a peer that sends a frame one byte at a time past frame_timeout", function()
    local port = ws_server("drip2", { frame_timeout = 0.5 })
    local c = raw(port)
    c:send(frame(1, "quick"))                  -- a frame in time is fine
    assert.same({ 1, "quick" }, { read_frame(c) })
    local f, t0 = frame(1, string.rep("d", 100)), socket.gettime()
    c:settimeout(0.2)
    local i, op, code = 1, nil, nil
    repeat                                     -- one byte every 0.2 s
      c:send(f:sub(i, i))
      i = i + 1
      op, code = read_frame(c)
    until op or socket.gettime() - t0 > 10
    assert.equal(8, op)
    assert.equal(1008, code)
    local took = socket.gettime() - t0
    assert.is_true(took >= 0.4 and took < 5, "closed after " .. took .. " s")
    assert.equal("1008 frame timeout", H.eventually(function() return seen:get("drip2:close") end))
  end)

  describe("permessage-deflate", function()
    local HELLO = "\xf2\x48\xcd\xc9\xc9\x07\x00"   -- "Hello" compressed (RFC 7692 7.2.3.1)

    it("is agreed with Python's client without context takeover, and echoes through it", function()
      local out = py("deflate " .. url(ws_server("pmd", { deflate = true })))
      assert.matches("extensions permessage-deflate remote_no_context_takeover=True "
        .. "local_no_context_takeover=True remote_max_window_bits=15\n", out, 1, true)
      assert.matches("text 110490\nbinary 16384\nfragments 1606\nrepeated 20\n", out, 1, true)
      assert.matches("close_code 1000\n", out, 1, true)
    end)

    it("honours server_max_window_bits, declines 8, and is off unless asked", function()
      local port = ws_server("pmdbits", { deflate = true })
      assert.matches("remote_max_window_bits=10\n", py("deflate " .. url(port) .. " 10"), 1, true)
      local out = py("deflate " .. url(port) .. " 8")
      assert.matches("extensions none\n", out, 1, true)        -- declined, still served
      assert.matches("repeated 20\n", out, 1, true)
      out = py("deflate " .. url(ws_server("pmdoff")))
      assert.matches("extensions none\n", out, 1, true)
      assert.matches("text 110490\n", out, 1, true)
    end)

    it("compresses what it sends, and refuses RSV1 on control frames and continuations (1002)", function()
      local port = ws_server("pmdraw", { deflate = true })
      local c, ext = raw_deflate(port)
      assert.equal("permessage-deflate; server_no_context_takeover; client_no_context_takeover", ext)
      c:send(frame(1, HELLO, { rsv = 0x40 }))
      local h = c:receive(2)
      assert.equal(0xC1, h:byte(1))                   -- FIN, RSV1, text
      assert.equal(HELLO, c:receive(h:byte(2)))       -- "Hello", compressed alike
      -- a compressed message in fragments: RSV1 on the first only
      c:send(frame(1, HELLO:sub(1, 3), { rsv = 0x40, fin = false }) .. frame(0, HELLO:sub(4)))
      h = c:receive(2)
      assert.equal(HELLO, c:receive(h:byte(2)))
      c:send(frame(9, "x", { rsv = 0x40 }))
      expect_close(c, 1002)
      c = raw_deflate(port)
      c:send(frame(1, HELLO:sub(1, 3), { rsv = 0x40, fin = false })
        .. frame(0, HELLO:sub(4), { rsv = 0x40 }))
      expect_close(c, 1002)
      c = raw(port)                                   -- not agreed on this one
      c:send(frame(1, HELLO, { rsv = 0x40 }))
      expect_close(c, 1002)
    end)

    it("bounds what a connection inflates by what it sent: 1008 past inflate_ratio (64), 0 for none", function()
      -- 1,000,000 zeros (max_message is 1 MiB) come as ~1 KB: inflating
      -- (and echoing) them costs ~3 ms of CPU per KB of the peer's
      local out = py("bomb " .. url(ws_server("ratio", { deflate = true })) .. " 1000000")
      assert.matches("close_code 1008\n", out, 1, true)
      assert.truthy(H.eventually(function() return seen:get("ratio:close") end))
      assert.equal("1008 message inflates past inflate_ratio times what the connection "
        .. "sent compressed", seen:get("ratio:close"))
      out = py("bomb " .. url(ws_server("noratio", { deflate = true, inflate_ratio = 0 }))
        .. " 1000000")
      assert.matches("echoed 1000000\nclose_code 1000\n", out, 1, true)
      -- text compressed 12:1 goes through, message after message
      out = py("deflate " .. url(ws_server("ratio2", { deflate = true, inflate_ratio = 16 })))
      assert.matches("text 110490\nbinary 16384\nfragments 1606\nrepeated 20\n", out, 1, true)
      assert.error_matches(function() netrun.codec.websocket { inflate_ratio = -1 } end,
        "inflate_ratio must be an integer from 0 to 4294967294, got %-1")
    end)

    it("closes a zip bomb with 1009 (100 MB of zeros, max_message 1 MiB)", function()
      local out = py("bomb " .. url(ws_server("bomb", { deflate = true })) .. " 100000000")
      assert.matches("remote_no_context_takeover=True", out, 1, true)
      assert.matches("close_code 1009\n", out, 1, true)
      local c = raw_deflate(ws_server("bad", { deflate = true }))
      c:send(frame(2, "\xff\xff\xff\xff", { rsv = 0x40 }))
      expect_close(c, 1007)                           -- not deflate data
    end)
  end)

  describe("a graceful shutdown", function()
    -- A server on a group of its own, to be shut down by the test.
    local function own_server(tag, opts)
      local g = netrun.group { threads = 1, name = "wsdown" }
      local s = H.sync(netrun.server {
        group = g, host = "127.0.0.1", port = 0,
        init = function(ch)
          ch:pipeline():add_last("http", netrun.codec.http_server())
          ch:pipeline():add_last("app", setmetatable({ tag = tag, opts = opts or {} }, App))
        end,
      })
      local _, port = s:local_address()
      return g, port
    end

    it("sends Python's client a close 1001 \"going away\" and waits for its answer", function()
      local g, port = own_server("down")
      local p = assert(io.popen(PY .. " wait_shutdown " .. url(port), "r"))
      assert.equal("ready", p:read("l"))
      local t0 = socket.gettime()
      H.sync(g:shutdown_gracefully(0, 10))
      local took = socket.gettime() - t0
      local out = p:read("a")
      p:close()
      assert.matches("close_code 1001\nclose_reason going away\n", out, 1, true)
      assert.matches("ok", out)
      assert.is_true(took < 4, "the shutdown took " .. took .. " s")
      assert.equal("1001 going away", seen:get("down:close"))  -- the peer answered
    end)

    it("on SIGTERM: ws_echo.lua --deflate yes says 1001 to its client, after agreeing deflate", function()
      local port = H.free_port()
      local pid = H.start("examples/ws_echo.lua", port, "--deflate yes")
      assert.matches("extensions permessage%-deflate", py("deflate " .. url(port)))
      local p = assert(io.popen(PY .. " wait_shutdown " .. url(port), "r"))
      assert.equal("ready", p:read("l"))
      assert.is_true(H.stop(pid))
      local out = p:read("a")
      p:close()
      assert.matches("close_code 1001\nclose_reason going away\n", out, 1, true)
    end)

    it("does not wait past close_timeout for a peer that never answers the close", function()
      local g, port = own_server("downdeaf", { close_timeout = 0.5 })
      local c = raw(port)
      c:send(frame(1, "ping?"))
      assert.same({ 1, "ping?" }, { read_frame(c) })
      local t0 = socket.gettime()
      local done = g:shutdown_gracefully(0, 20)
      expect_close(c, 1001)                      -- never answered by us
      H.sync(done)
      local took = socket.gettime() - t0
      assert.is_true(took >= 0.4 and took < 5, "the shutdown took " .. took .. " s")
    end)
  end)

  it("refuses a request that is no WebSocket upgrade", function()
    local port = ws_server("plain")
    local c = H.client(port)
    c:send("GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
      .. "Sec-WebSocket-Version: 8\r\nSec-WebSocket-Key: " .. KEY .. "\r\n\r\n")
    local status, headers = H.read_response(c)
    assert.equal(426, status)
    assert.equal("13", headers["sec-websocket-version"])
    c:close()
  end)

  it("examples: ws_echo.lua echoes ws_client.lua, and answers plain HTTP with a page or 426", function()
    local port = H.free_port()
    local pid = H.start("examples/ws_echo.lua", port)
    local out, st = H.run(H.BIN .. " examples/ws_client.lua --url ws://127.0.0.1:" .. port
      .. "/ --count 2 --message hi")
    assert.equal(0, st, out)
    assert.equal('text: "hi 1"\ntext: "hi 2"\nbinary: "\\0\\1\\2"\nclosed: 1000 \nmessages=3\n', out)
    local c = H.client(port)
    c:send("GET / HTTP/1.1\r\nHost: x\r\n\r\nGET /chat HTTP/1.1\r\nHost: x\r\n\r\n")
    local status, _, body = H.read_response(c)
    assert.equal(200, status)
    assert.matches("WebSocket echo", body)
    local status2, headers2 = H.read_response(c)
    assert.equal(426, status2)
    assert.equal("websocket", headers2.upgrade)
    c:close()
    assert.is_true(H.stop(pid))
  end)

  it("stops reading from a client that does not read its echoes, and goes on once it does", function()
    local port = H.free_port()
    local pid = H.start("examples/ws_echo.lua", port)
    local c = raw(port)
    c:settimeout(1)
    local f = frame(2, string.rep("w", 60000))
    local before = H.rss(pid)
    local LIMIT = 256 << 20
    local sent = H.flood(c, f, LIMIT)
    local grown = H.rss(pid) - before
    assert.is_true(sent < LIMIT, "the server took all " .. sent .. " bytes")
    if not H.sanitized then
      assert.is_true(grown < 32 * 1024, "server RSS grew by " .. grown .. " KiB")
    end
    c:settimeout(5)
    local whole, part = sent // #f, sent % #f
    local function echoes(n)
      for i = 1, n do
        local op, data = read_frame(c)
        assert.equal(2, op, "echo " .. i)
        assert.equal(60000, #data)
      end
    end
    echoes(whole)                          -- reading them lets it read on
    if part > 0 then
      assert(c:send(f:sub(part + 1)))      -- finish the frame cut short
      echoes(1)
    end
    c:send(frame(1, "still there?"))
    assert.same({ 1, "still there?" }, { read_frame(c) })
    c:close()
    assert.is_true(H.stop(pid))
  end)

  describe("netrun's client", function()
    local Collect = {}
    Collect.__index = Collect
    function Collect:channel_read(ctx, msg)
      seen:set(self.tag .. ":got" .. seen:incr(self.tag .. ":n", 1, 0), msg.type .. " " .. msg.data)
    end
    function Collect:user_event_triggered(ctx, e)
      if type(e) == "table" and e.type == "close" then
        seen:set(self.tag .. ":close", e.code .. " " .. e.reason)
      end
    end

    local function connect(u, tag)
      return H.sync(netrun.websocket.connect {
        url = u, group = group, timeout = 5,
        init = function(ch) ch:pipeline():add_last("collect", setmetatable({ tag = tag }, Collect)) end,
      })
    end

    it("talks to the netrun server, and closes with the close handshake", function()
      local ch = connect(url(ws_server("nn")), "nnc")
      ch:write("one")
      ch:write_and_flush { type = "binary", data = "\0two" }
      assert.equal("binary \0two", H.eventually(function() return seen:get("nnc:got2") end))
      assert.equal("text one", seen:get("nnc:got1"))
      H.sync(ch:close())
      assert.equal("1000 ", H.eventually(function() return seen:get("nn:close") end))
      assert.equal("1000 ", seen:get("nnc:close"))
    end)

    it("talks to Python's server: its frames masked, its close answered", function()
      local p = assert(io.popen(PY .. " server", "r"))
      local port = assert(tonumber(p:read("l")))
      local ch = connect("ws://127.0.0.1:" .. port .. "/", "pyc")
      ch:write_and_flush("hello python")
      assert.equal("text hello python", H.eventually(function() return seen:get("pyc:got1") end))
      ch:write_and_flush("close-me")
      assert.equal("4000 asked", H.eventually(function() return seen:get("pyc:close") end))
      H.sync(ch:close_future())
      assert.matches("ok", p:read("a"))      -- it served us and exited cleanly
      p:close()
    end)

    it("agrees permessage-deflate with Python's server and with netrun's", function()
      local p = assert(io.popen(PY .. " server deflate", "r"))
      local port = assert(tonumber(p:read("l")))
      local ch = H.sync(netrun.websocket.connect {
        url = "ws://127.0.0.1:" .. port .. "/", group = group, timeout = 5, deflate = true,
        init = function(c) c:pipeline():add_last("collect", setmetatable({ tag = "pyd" }, Collect)) end,
      })
      assert.equal("extensions permessage-deflate remote_no_context_takeover=True "
        .. "local_no_context_takeover=True remote_max_window_bits=15", p:read("l"))
      local long = string.rep("compress me ", 5000)
      ch:write_and_flush(long)
      assert.equal("text " .. long, H.eventually(function() return seen:get("pyd:got1") end))
      ch:write_and_flush { type = "binary", data = "\0\1\2" }
      assert.equal("binary \0\1\2", H.eventually(function() return seen:get("pyd:got2") end))
      ch:write_and_flush("close-me")
      assert.equal("4000 asked", H.eventually(function() return seen:get("pyd:close") end))
      assert.matches("ok", p:read("a"))
      p:close()
      local ch2 = H.sync(netrun.websocket.connect {
        url = url(ws_server("nnd", { deflate = true })), group = group, timeout = 5, deflate = true,
        init = function(c) c:pipeline():add_last("collect", setmetatable({ tag = "nndc" }, Collect)) end,
      })
      ch2:write_and_flush(long)
      assert.equal("text " .. long, H.eventually(function() return seen:get("nndc:got1") end))
      H.sync(ch2:close())
    end)

    it("speaks wss:// through TLS, verifying the server", function()
      local dir = H.tmpdir()
      assert(H.run("bash " .. H.root .. "/spec/fixtures/tls/make_certs.sh " .. dir))
      local port = ws_server("wss", nil, netrun.tls.server {
        cert = dir .. "/server.crt", key = dir .. "/server.key" })
      local ch = H.sync(netrun.websocket.connect {
        url = "wss://localhost:" .. port .. "/secure", group = group, timeout = 5,
        tls = netrun.tls.client { ca = dir .. "/ca.crt" },
        init = function(c) c:pipeline():add_last("collect", setmetatable({ tag = "wssc" }, Collect)) end,
      })
      ch:write_and_flush(string.rep("s", 100000))
      assert.equal("text " .. string.rep("s", 100000),
        H.eventually(function() return seen:get("wssc:got1") end))
      H.sync(ch:close())
      assert.equal("1000 ", H.eventually(function() return seen:get("wss:close") end))
    end)

    it("keeps a channel group of upgraded sockets: 30 broadcasts reach 6 clients whole and in order", function()
      -- The server adds each socket to the group after upgrade returns,
      -- having looked its user up first (30 ms of work in the handler):
      -- each client broadcasts as soon as its connect future completes.
      -- The 101 must not reach a client before its socket is a member, or
      -- what the group sends meanwhile is lost to it.
      local members = netrun.channel_group()
      local Room = {}
      function Room:channel_read(ctx, msg)
        if msg.method then
          assert(netrun.websocket.upgrade(ctx, msg))
          local t = os.clock() + 0.03               -- "who is this user?"
          while os.clock() < t do end
          members:add(ctx.channel)
        end
      end
      function Room:channel_read_complete(ctx) ctx:flush() end
      local loops = netrun.group { threads = 2, name = "wsroom" }
      local server = H.sync(netrun.server {
        group = loops, host = "127.0.0.1", port = 0,
        init = function(ch)
          ch:pipeline():add_last("http", netrun.codec.http_server())
          ch:pipeline():add_last("room", Room)
        end,
      })
      local _, port = server:local_address()
      local Got = {}
      Got.__index = Got
      function Got:channel_read(ctx, msg) seen:set(self.tag, (seen:get(self.tag) or "") .. msg.data .. ",") end
      -- Client c joins, then round c: 30 messages to the group. Client c
      -- gets rounds c .. 6, each whole and in order.
      local clients, rounds = {}, {}
      for c = 1, 6 do
        clients[c] = H.sync(netrun.websocket.connect {
          url = url(port), group = group, timeout = 5,
          init = function(ch) ch:pipeline():add_last("got", setmetatable({ tag = "room" .. c }, Got)) end,
        })
        local r = {}
        for i = 1, 30 do
          r[i] = c .. "." .. i .. ","
          members:write_and_flush(c .. "." .. i)
        end
        rounds[c] = table.concat(r)
      end
      for c = 1, 6 do
        local want = table.concat(rounds, "", c)
        local got = H.eventually(function()
          local got = seen:get("room" .. c) or ""
          return #got >= #want and got
        end, 5) or seen:get("room" .. c)
        assert.equal(want, got, "client " .. c)
      end
      for c = 1, 6 do H.sync(clients[c]:close()) end
      H.sync(server:close())
      H.shutdown(loops)
    end)

    it("wss:// to a name no address of which answers fails with the connect error", function()
      local free = H.free_port()
      local ok, err = pcall(H.sync, netrun.websocket.connect {
        url = "wss://localhost:" .. free .. "/", group = group, timeout = 5 })
      assert.is_false(ok)
      assert.matches("::1:" .. free .. ": ECONNREFUSED: connection refused; 127.0.0.1:" ..
        free .. ": ECONNREFUSED: connection refused", tostring(err), 1, true)
      assert.is_nil(tostring(err):find("TLS", 1, true), err)
    end)

    it("fails its future when the server refuses the upgrade, or is not there", function()
      local port = ws_server("nope", { refuse = true })
      local ok, err = pcall(H.sync, netrun.websocket.connect {
        url = "ws://127.0.0.1:" .. port .. "/", group = group, timeout = 5 })
      assert.is_false(ok)
      assert.matches("handshake failed: the server answered: HTTP/1.1 404", tostring(err))
      local s = assert(socket.bind("127.0.0.1", 0))
      local _, dead = s:getsockname()
      s:close()
      ok, err = pcall(H.sync, netrun.websocket.connect { url = "ws://127.0.0.1:" .. dead .. "/",
        group = group, timeout = 5 })
      assert.is_false(ok)
      assert.matches("refused", tostring(err))
    end)

    it("reports a failed connect once, through its future: nothing logged", function()
      -- a program of its own, so that its whole log can be read
      local refusing, dead = ws_server("once", { refuse = true }), H.free_port()
      local dir = H.tmpdir()
      local certs = dir .. "/certs"
      assert(H.run("bash " .. H.root .. "/spec/fixtures/tls/make_certs.sh " .. certs))
      local wss = ws_server("oncetls", nil, netrun.tls.server {
        cert = certs .. "/server.crt", key = certs .. "/server.key" })
      local f = assert(io.open(dir .. "/once.lua", "w"))
      f:write(string.format([[
        local netrun = require "netrun"
        local urls = { "ws://127.0.0.1:%d/", "ws://127.0.0.1:%d/", "wss://localhost:%d/" }
        for _, u in ipairs(urls) do
          local ok, err = pcall(function()
            return netrun.websocket.connect { url = u, timeout = 5,
              tls = u:find("^wss") and netrun.tls.client { ca = %q } or nil }:await()
          end)
          print(ok, err)
        end
        netrun.spawn(function() netrun.sleep(0.2) end):await()  -- a late log line
        os.exit(0)
      ]], refusing, dead, wss, certs .. "/other-ca.crt"))
      f:close()
      local out, status = H.run(H.BIN .. " " .. dir .. "/once.lua 2>&1")
      assert.equal(0, status, out)
      assert.matches("false\t[^\n]*the server answered: HTTP/1.1 404", out)
      assert.matches("false\t[^\n]*refused", out)
      assert.matches("false\t[^\n]*certificate verify failed", out)
      assert.is_nil(out:find("WARN", 1, true), out)
      assert.is_nil(out:find("ERROR", 1, true), out)
    end)
  end)
end)
