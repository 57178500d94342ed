-- shutdown_spec.lua -- SIGTERM to a live `netrun` process: work already
-- accepted finishes within the shutdown timeout before its channel
-- closes (an HTTP answer still being computed on an executor is
-- delivered, then the connection closes; so is a line server's, whose
-- codec holds nothing: work owed to the loop holds its channels), and an
-- idle server stops at once.
local H = require "spec.helper"

local function log_has(log, text)
  return H.read_file(log):find(text, 1, true) ~= nil
end

local function answered_after_sigterm(mode)
  local port = H.free_port()
  local pid, log = H.start("spec/fixtures/slow_answer.lua", port, "--mode " .. mode)
  local c = H.client(port)
  c:send("GET /late HTTP/1.1\r\nHost: a\r\n\r\n")
  assert.is_truthy(H.eventually(function() return log_has(log, "accepted /late") end))
  os.execute("kill -TERM " .. pid)         -- the answer takes 0.5 s more
  local status, _, body = H.read_response(c)
  assert.are.equal(200, status)
  assert.are.equal("answer for /late", body)
  assert.are.equal(nil, (c:receive(1)))    -- then the server closes
  c:close()
  assert.is_true(H.stop(pid))
  os.remove(log)
end

describe("SIGTERM", function()
  it("lets an answer computed through a future reach the client", function()
    answered_after_sigterm("listener")
  end)

  it("lets an answer computed by a handler on an executor reach the client", function()
    answered_after_sigterm("executor")
  end)

  it("stops an idle server within half a second", function()
    local port = H.free_port()
    local pid, log = H.start("spec/fixtures/slow_answer.lua", port)
    local t0 = H.socket.gettime()
    assert.is_true(H.stop(pid))
    local took = H.socket.gettime() - t0
    -- (a sanitizer's own start and exit take most of a second: there the
    -- bound only tells the old 2 s quiet period apart)
    local bound = H.sanitized and 1.5 or 0.5
    assert.is_true(took < bound, string.format("took %.2f s", took))
    os.remove(log)
  end)

  -- A line server: nothing but the work sent to the executor tells the
  -- loop an answer is owed.
  for _, mode in ipairs { "listener", "task", "channel", "handler", "stages" } do
    it("lets a line server's answer computed on an executor reach the client (" .. mode .. ")", function()
      local port = H.free_port()
      local pid, log = H.start("spec/fixtures/slow_lines.lua", port, "--mode " .. mode)
      local c = H.client(port)
      c:send("hello\n")
      assert.is_truthy(H.eventually(function() return log_has(log, "working on hello") end))
      os.execute("kill -TERM " .. pid)       -- the work takes 0.2 s (0.4 s in stages)
      local want = mode == "stages" and "done done hello" or "done hello"
      assert.are.equal(want, c:receive("*l"))
      assert.are.equal(nil, (c:receive(1)))    -- then the server closes
      c:close()
      local t0 = H.socket.gettime()
      assert.is_true(H.stop(pid))
      assert.is_true(H.socket.gettime() - t0 < 2)
      assert.is_falsy(log_has(log, "has not terminated"))
      os.remove(log)
    end)
  end

  it("accepts no connection while it waits for the work owed", function()
    local port = H.free_port()
    local pid, log = H.start("spec/fixtures/slow_lines.lua", port, "--mode listener --work 1")
    local c = H.client(port)
    c:send("slow\n")
    assert.is_truthy(H.eventually(function() return log_has(log, "working on slow") end))
    os.execute("kill -TERM " .. pid)
    assert.is_truthy(H.eventually(function()
      local s = H.socket.connect("127.0.0.1", port)
      if s then s:close() end
      return s == nil
    end, 0.8), "a connection was accepted during the shutdown")
    c:settimeout(0)
    local line, err = c:receive("*l")
    assert.are.same({ nil, "timeout" }, { line, err })         -- still being worked on
    c:settimeout(5)
    assert.are.equal("done slow", c:receive("*l"))
    c:close()
    assert.is_true(H.stop(pid))
    os.remove(log)
  end)

  it("stops an idle line server (with executor groups) within half a second", function()
    local port = H.free_port()
    local pid, log = H.start("spec/fixtures/slow_lines.lua", port, "--mode listener")
    local c = H.client(port)                 -- connected, idle
    local t0 = H.socket.gettime()
    assert.is_true(H.stop(pid))
    local took = H.socket.gettime() - t0
    assert.is_true(took < (H.sanitized and 1.5 or 0.5), string.format("took %.2f s", took))
    c:close()
    os.remove(log)
  end)
end)
