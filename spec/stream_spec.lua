-- stream_spec.lua -- a byte stream arrives whole and in order, however the
-- sockets split it: a netrun client writes 2 MiB in pieces of every size
-- (strings and gathered arrays, flushed at random points) through a netrun
-- echo server, and gets back exactly what it wrote. Run under the fault
-- shim (lua-fault/stream_spec) every read and write on both sides may be
-- short, meet EAGAIN or EINTR.
local H = require "spec.helper"
local netrun = H.netrun

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
