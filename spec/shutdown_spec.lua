-- shutdown_spec.lua -- SIGTERM to a live `netrun` process: work already
-- accepted finishes within the shutdown timeout before its channel
-- closes (an HTTP answer still being computed on an executor is
-- delivered, then the connection closes), and an idle server stops at once.
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
end)
