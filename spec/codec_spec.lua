-- spec/codec_spec.lua -- the native frame codecs (netrun.codec.*) and the
-- embedded channel they are tested with; then the codecs behind a real
-- server on 127.0.0.1 with a LuaSocket client.
local H = require "spec.helper"
local netrun, socket = H.netrun, H.socket

local codec = netrun.codec

-- Frames that reach the tail when `chunks` are written one by one.
local function decode(c, chunks)
  local ch = netrun.embedded(c)
  for _, chunk in ipairs(chunks) do ch:write_inbound(chunk) end
  local frames = ch:read_all_inbound()
  ch:close()
  return frames
end

-- The stream cut at every byte boundary (two reads), and byte by byte,
-- gives the frames of the whole stream.
local function same_at_every_split(make, stream, expected)
  assert.same(expected, decode(make(), { stream }))
  for cut = 0, #stream do
    assert.same(expected, decode(make(), { stream:sub(1, cut), stream:sub(cut + 1) }),
                "split at " .. cut)
  end
  local bytes = {}
  for i = 1, #stream do bytes[i] = stream:sub(i, i) end
  assert.same(expected, decode(make(), bytes), "byte by byte")
end

describe("netrun.codec", function()
  describe("frames whatever the split", function()
    it("line: \\n or \\r\\n, stripped or kept", function()
      same_at_every_split(function() return codec.line {} end,
        "GET / HTTP/1.1\r\nHost: x\n\nlast\n", { "GET / HTTP/1.1", "Host: x", "", "last" })
      same_at_every_split(function() return codec.line { strip = false } end,
        "a\r\nb\n", { "a\r\n", "b\n" })
    end)

    it("delimiter: the delimiter giving the shortest frame wins", function()
      same_at_every_split(function() return codec.delimiter { delimiters = { "\0", "||" } } end,
        "a\0bb||c\0||", { "a", "bb", "c", "" })
      same_at_every_split(function() return codec.delimiter { delimiters = { "abc", "b" } } end,
        "xabcyb", { "x", "y" })
      same_at_every_split(function()
        return codec.delimiter { delimiters = { "\r\n" }, strip = false }
      end, "one\r\ntwo\r\n", { "one\r\n", "two\r\n" })
    end)

    it("length_field: big-endian lengths of 1, 2, 3, 4 and 8 bytes", function()
      for _, n in ipairs { 1, 2, 3, 4, 8 } do
        local fmt = ">I" .. n
        local stream = string.pack(fmt, 5) .. "hello" .. string.pack(fmt, 0)
          .. string.pack(fmt, 3) .. "abc"
        same_at_every_split(function() return codec.length_field { length = n } end,
          stream, { "hello", "", "abc" })
      end
      -- A type byte before the length, a length that counts the whole
      -- frame, and nothing stripped.
      local frame = "T" .. string.pack(">I2", 6) .. "xyz"
      same_at_every_split(function()
        return codec.length_field { offset = 1, length = 2, adjustment = -3, strip = 0 }
      end, frame .. frame, { frame, frame })
    end)

    it("fixed_length", function()
      same_at_every_split(function() return codec.fixed_length { length = 3 } end,
        "abcdefghi", { "abc", "def", "ghi" })
    end)

    it("length_prepender and length_field round-trip", function()
      local out = netrun.embedded(codec.length_prepender { length = 2 })
      out:write_outbound("hello", "", { "gat", "her", "ed" })
      local wire = table.concat(out:read_all_outbound())
      assert.equal(string.pack(">I2", 5) .. "hello" .. string.pack(">I2", 0)
                   .. string.pack(">I2", 8) .. "gathered", wire)
      same_at_every_split(function() return codec.length_field { length = 2 } end,
        wire, { "hello", "", "gathered" })
    end)
  end)

  describe("limits", function()
    it("a too-long line fails with a clear error and decoding goes on", function()
      local errors = {}
      local ch = netrun.embedded(codec.line { max_length = 8 }, {
        exception_caught = function(_, _, err) errors[#errors + 1] = err end,
      })
      ch:write_inbound("ok\n0123456789", "abcdef", "ghi\nnext\n")
      assert.same({ "ok", "next" }, ch:read_all_inbound())
      assert.same({ "line: frame of more than 8 bytes" }, errors)
      -- A line of exactly max_length passes, "\r\n" included.
      ch:write_inbound("12345678\r", "\n")
      assert.equal("12345678", ch:read_inbound())
      assert.is_false(ch:finish())
    end)

    it("an exception nobody handled is raised by write_inbound", function()
      local ch = netrun.embedded(codec.delimiter { delimiters = { ";" }, max_length = 4 })
      assert.has_error(function() ch:write_inbound("abcdefgh;xy;") end,
                       "delimiter: frame of more than 4 bytes")
      assert.same({ "xy" }, ch:read_all_inbound())
    end)

    it("a too-long length_field frame is skipped by count", function()
      local ch = netrun.embedded(codec.length_field { length = 2, max_frame = 16 })
      local big = string.pack(">I2", 100) .. string.rep("x", 100)
      local ok = string.pack(">I2", 2) .. "ok"
      assert.has_error(function() ch:write_inbound(big:sub(1, 10)) end,
                       "length_field: frame of 102 bytes is longer than max_frame (16)")
      ch:write_inbound(big:sub(11, 60), big:sub(61) .. ok)
      assert.same({ "ok" }, ch:read_all_inbound())
    end)

    it("a megabyte without a delimiter is never cumulated", function()
      local ch = netrun.embedded(codec.line { max_length = 100 })
      local chunk = string.rep("x", 65536)
      for i = 1, 16 do
        pcall(ch.write_inbound, ch, chunk)
        assert.is_true(netrun.codec.buffered(ch:channel(), "handler1") <= 101)
      end
      ch:write_inbound("\nfine\n")
      assert.same({ "fine" }, ch:read_all_inbound())
      assert.equal(0, netrun.codec.buffered(ch:channel(), "handler1"))
    end)

    it("length_prepender refuses a message its field cannot hold", function()
      local ch = netrun.embedded(codec.length_prepender { length = 1 })
      assert.has_error(function() ch:write_outbound(string.rep("x", 256)) end,
                       "length_prepender: a message of 256 bytes does not fit a 1-byte length field")
      assert.is_nil(ch:read_outbound())
      ch:write_outbound(string.rep("x", 255))
      assert.equal(256, #ch:read_outbound())
    end)
  end)

  describe("malformed input", function()
    it("a length shorter than the header is corrupt", function()
      local ch = netrun.embedded(codec.length_field { length = 1, adjustment = -4 })
      assert.has_error(function() ch:write_inbound("\2ab") end,
                       "length_field: frame length -1 is shorter than its 1-byte header")
    end)

    it("a frame cut by the end of input is reported at close", function()
      local ch = netrun.embedded(codec.fixed_length { length = 4 })
      ch:write_inbound("abcdef")
      assert.equal("abcd", ch:read_inbound())
      assert.has_error(function() ch:finish() end,
                       "fixed_length: input ended inside a frame (2 bytes discarded)")
    end)

    it("decodes gathered bytes and passes on other messages", function()
      local ch = netrun.embedded(codec.line {})
      ch:write_inbound({ "a\nb", "c\n" }, { kind = "table" })
      assert.same({ "a", "bc", { kind = "table" } }, ch:read_all_inbound())
    end)
  end)

  describe("options", function()
    local cases = {
      { "length_field", { length = 5 }, "netrun.codec.length_field: length must be 1, 2, 3, 4 or 8" },
      { "length_prepender", { length = 0 }, "netrun.codec.length_prepender: length must be 1, 2, 3, 4 or 8" },
      { "line", { max_length = 0 }, "netrun.codec.line: max_length must be a size in bytes from 1 to" },
      { "line", { max_len = 10 }, "netrun.codec.line: unknown option 'max_len'" },
      { "line", { strip = "yes" }, "netrun.codec.line: strip must be a boolean, got \"yes\"" },
      { "delimiter", {}, "netrun.codec.delimiter: delimiters must be an array of 1 to 8 strings, got nil" },
      { "delimiter", { delimiters = { "" } }, "netrun.codec.delimiter: delimiters[1] must be a non-empty string" },
      { "fixed_length", {}, "netrun.codec.fixed_length: length must be a size in bytes from 1 to 1099511627776, got nil" },
      { "fixed_length", { length = 1.5 }, "netrun.codec.fixed_length: length must be a size in bytes from 1 to 1099511627776, got 1.5" },
      { "length_field", { offset = 4, max_frame = 6 },
        "netrun.codec.length_field: max_frame (6) must be at least offset + length (8)" },
    }
    for _, case in ipairs(cases) do
      it(case[1] .. " " .. case[3]:match(": (.*)$"), function()
        local ok, err = pcall(codec[case[1]], case[2])
        assert.is_false(ok)
        assert.truthy(tostring(err):find(case[3], 1, true), err)
      end)
    end

    it("one codec value serves many pipelines, each with its own state", function()
      local line = codec.line {}
      local a, b = netrun.embedded(line), netrun.embedded(line)
      a:write_inbound("from a, part")
      b:write_inbound("from b\n")
      a:write_inbound(" two\n")
      assert.same({ "from a, part two" }, a:read_all_inbound())
      assert.same({ "from b" }, b:read_all_inbound())
      assert.equal("netrun.codec.line", tostring(line))
    end)
  end)

  describe("embedded channel", function()
    it("captures what reaches the head and the tail", function()
      local events = {}
      local ch = netrun.embedded({
        channel_active = function(_, ctx) events[#events + 1] = "active"; ctx:fire_channel_active() end,
        channel_inactive = function(_, ctx) events[#events + 1] = "inactive" end,
        channel_read = function(_, ctx, msg)
          ctx:write({ echo = msg })
          ctx:fire_channel_read(msg:upper())
        end,
      })
      assert.same({ "active" }, events)
      assert.is_true(ch:write_inbound("hi"))
      assert.equal("HI", ch:read_inbound())
      assert.same({ echo = "hi" }, ch:read_outbound())
      assert.is_nil(ch:read_outbound())
      assert.same({ "handler1" }, ch:pipeline():names())
      assert.is_true(ch:channel():is_active())
      assert.is_false(ch:finish())
      assert.same({ "active", "inactive" }, events)
      assert.is_false(ch:channel():is_open())
    end)

    it("a decoder removed mid-read hands the rest of the stream on, in order", function()
      local ch
      ch = netrun.embedded(codec.line {}, {
        channel_read = function(_, ctx, msg)
          if msg == "SWITCH" then ctx.pipeline:remove("handler1") end
          ctx:fire_channel_read(msg)
        end,
      })
      ch:write_inbound("a\nSWITCH\nraw\nbytes", "more\n")
      assert.same({ "a", "SWITCH", "raw\nbytes", "more\n" }, ch:read_all_inbound())
      assert.same({ "handler2" }, ch:pipeline():names())
    end)

    it("input written from inside a handler is decoded after the current read", function()
      local ch
      ch = netrun.embedded(codec.line {}, {
        channel_read = function(_, ctx, msg)
          if msg == "again" then ch:write_inbound("x\ny") end
          ctx:fire_channel_read(msg)
        end,
      })
      ch:write_inbound("again\nrest", "\n")
      assert.same({ "again", "restx", "y" }, ch:read_all_inbound())
    end)

    it("a Lua handler after length_prepender sees the gathered write as an array", function()
      local seen
      local ch = netrun.embedded({
        write = function(_, ctx, msg, p) seen = msg; ctx:write(msg, p) end,
      }, codec.length_prepender { length = 1 })
      ch:write_outbound("abc")
      assert.same({ "\3", "abc" }, seen)
      assert.equal("\3abc", ch:read_outbound())
    end)
  end)
end)

describe("codecs on a real socket", function()
  local group
  setup(function() group = netrun.group { threads = 1, name = "codec" } end)
  teardown(function() H.shutdown(group) end)

  it("line codec: echoes lines, reports a too-long one, holds nothing when idle", function()
    local got = netrun.promise()
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        got:try_success(ch)
        ch:pipeline():add_last("frame", netrun.codec.line { max_length = 64 })
        ch:pipeline():add_last("app", {
          channel_read = function(_, ctx, line) ctx:write(line:upper() .. "\n") end,
          channel_read_complete = function(_, ctx) ctx:flush() end,
          exception_caught = function(_, ctx, err) ctx:write_and_flush("ERR " .. err .. "\n") end,
        })
      end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    c:send("hello\r\nwor")
    assert.equal("HELLO", c:receive("*l"))
    local child = got:sync()
    local function held()
      return child:loop():submit(function(ch)
        return require("netrun").codec.buffered(ch, "frame")
      end, child):sync()
    end
    assert.equal(3, held())                 -- "wor" waits for its newline
    c:send("ld\n")
    assert.equal("WORLD", c:receive("*l"))
    assert.equal(0, held())                 -- idle: no cumulation
    c:send(string.rep("z", 200) .. "\nafter\n")
    assert.equal("ERR line: frame of more than 64 bytes", c:receive("*l"))
    assert.equal("AFTER", c:receive("*l"))
    assert.equal(0, held())
    c:close()
    server:close():sync()
  end)

  it("line codec: stops reading and decoding for a peer that reads nothing, then goes on", function()
    local BIG = string.rep("y", 16384)
    local paused = netrun.promise()
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("frame", netrun.codec.line {})
        ch:pipeline():add_last("app", {
          channel_read = function(_, ctx, line)
            _G.lines_ch = ctx.channel
            _G.lines = (_G.lines or 0) + 1
            ctx:write(line .. " " .. BIG .. "\n")
          end,
          channel_read_complete = function(_, ctx) ctx:flush() end,
          channel_writability_changed = function(_, ctx)
            if not ctx.channel:is_writable() then paused:try_success(true) end
          end,
        })
      end,
    }:sync()
    local _, port = server:local_address()
    local N = 4000                              -- 24 KB of lines, 64 MB of answers
    local c = H.client(port)
    local lines = {}
    for i = 1, N do lines[i] = tostring(i) .. "\n" end
    assert(c:send(table.concat(lines)))
    H.sync(paused, 10)
    local n = H.stalled(group:next(), function()
      if not _G.lines_ch:is_writable() then return _G.lines end
    end)
    assert.is_truthy(n)
    assert.is_true(n < N / 4, "decoded " .. n .. " of " .. N .. " lines for a peer that reads nothing")
    for i = 1, N do
      assert.equal(tostring(i) .. " " .. BIG, c:receive("*l"))
    end
    c:close()
    server:close():sync()
  end)

  it("a peer that half-closes mid-frame gets the incomplete frame reported", function()
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      child_options = { allow_half_closure = true },
      init = function(ch)
        ch:pipeline():add_last("frame", netrun.codec.line {})
        ch:pipeline():add_last("app", {
          channel_read = function(_, ctx, line) ctx:write_and_flush(line:upper() .. "\n") end,
          exception_caught = function(_, ctx, err) ctx:write_and_flush("ERR " .. err .. "\n") end,
          user_event_triggered = function(_, ctx, evt)
            ctx:write_and_flush("EVENT " .. tostring(evt) .. "\n")
            ctx:close()
          end,
        })
      end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    c:send("a\npartial")
    assert.equal("A", c:receive("*l"))
    c:shutdown("send")
    assert.equal("ERR line: input ended inside a frame (7 bytes discarded)", c:receive("*l"))
    assert.equal("EVENT input_shutdown", c:receive("*l"))
    local line, err = c:receive("*l")
    assert.is_nil(line)
    assert.equal("closed", err)
    c:close()
    server:close():sync()
  end)

  it("length_field and length_prepender: a framed echo", function()
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        local p = ch:pipeline()
        p:add_last("decode", netrun.codec.length_field { length = 4 })
        p:add_last("encode", netrun.codec.length_prepender { length = 4 })
        p:add_last("echo", {
          channel_read = function(_, ctx, msg) ctx:write_and_flush(msg:reverse()) end,
        })
      end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    local msgs = { "abc", "", string.rep("0123456789", 1000) }
    local wire = {}
    for i, m in ipairs(msgs) do wire[i] = string.pack(">s4", m) end
    wire = table.concat(wire)
    -- Sent in awkward pieces: the server sees arbitrary splits.
    local i = 1
    while i <= #wire do
      assert(c:send(wire:sub(i, i + 6)))
      i = i + 7
      if i > 200 then assert(c:send(wire:sub(i))); break end
    end
    for _, m in ipairs(msgs) do
      local len = string.unpack(">I4", H.recv(c, 4))
      assert.equal(#m, len)
      assert.equal(m:reverse(), len > 0 and H.recv(c, len) or "")
    end
    c:close()
    server:close():sync()
  end)
end)
