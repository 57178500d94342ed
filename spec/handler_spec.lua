-- handler_spec.lua -- the native utility handlers: idle_state fires reader,
-- writer and all idleness as user events and is reset by traffic; logging
-- writes a line per event and operation (checked in a child process, since
-- log lines go to stderr).
local H = require "spec.helper"
local netrun, socket = H.netrun, H.socket
local BIN = os.getenv("NETRUN_BIN") or (H.build .. "/bin/netrun")

-- A server whose pipeline is idle_state(opts) followed by a handler that
-- reports each idle event to the peer as a line "<kind> <first>", and
-- echoes whatever it reads.
local function idle_server(group, opts)
  local Report = {}
  function Report:user_event_triggered(ctx, evt)
    if type(evt) == "table" and evt.idle then
      ctx:write_and_flush(evt.idle .. " " .. tostring(evt.first) .. "\n")
    end
  end
  function Report:channel_read(ctx, msg) ctx:write(msg) end
  function Report:channel_read_complete(ctx) ctx:flush() end
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0,
    init = function(ch)
      ch:pipeline():add_last("idle", netrun.handler.idle_state(opts))
      ch:pipeline():add_last("report", Report)
    end,
  }:sync()
  local _, port = server:local_address()
  return server, port
end

describe("netrun.handler.idle_state", function()
  local group
  before_each(function() group = netrun.group { threads = 1, name = "idle" } end)
  after_each(function() H.shutdown(group) end)

  it("fires a reader idle event on a silent connection", function()
    local _, port = idle_server(group, { reader = 0.1 })
    local c = H.client(port)
    local t0 = socket.gettime()
    assert.equal("reader true", c:receive("*l"))
    assert.is_true(socket.gettime() - t0 >= 0.09)
    -- The next one is a subsequent event, one period later.
    assert.equal("reader false", c:receive("*l"))
    c:close()
  end)

  it("fires writer idle events, each write starting the period again", function()
    local _, port = idle_server(group, { writer = 0.1 })
    local c = H.client(port)
    -- The report itself is a write: every event is a "first" one.
    assert.equal("writer true", c:receive("*l"))
    assert.equal("writer true", c:receive("*l"))
    c:close()
  end)

  it("fires all idle events when neither side talks", function()
    local _, port = idle_server(group, { all = 0.1 })
    local c = H.client(port)
    assert.equal("all true", c:receive("*l"))
    c:close()
  end)

  it("is reset by reads", function()
    local _, port = idle_server(group, { reader = 1 })
    local c = H.client(port)
    -- Traffic every 0.1 s for longer than the timeout: no event may arrive.
    local last
    for i = 1, 15 do
      c:send(i .. "\n")
      assert.equal(tostring(i), c:receive("*l"))   -- echoed: nothing came before it
      last = socket.gettime()
      if i < 15 then socket.sleep(0.1) end
    end
    assert.equal("reader true", c:receive("*l"))
    assert.is_true(socket.gettime() - last >= 0.95,
      "the event came too early: " .. (socket.gettime() - last) .. " s after the last read")
    c:close()
  end)

  it("starts when added to an active channel, and stops when removed", function()
    local Late = {}
    function Late:channel_active(ctx)
      ctx.pipeline:add_first("idle", netrun.handler.idle_state { reader = 0.05 })
    end
    function Late:user_event_triggered(ctx, evt)
      ctx.pipeline:remove("idle")                    -- one event only
      ctx:write_and_flush(evt.idle .. "\n")
    end
    function Late:channel_read(ctx, msg) ctx:write_and_flush("got " .. msg) end
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch) ch:pipeline():add_last("late", Late) end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    assert.equal("reader", c:receive("*l"))
    c:send("x\n")
    assert.equal("got x", c:receive("*l"))
    -- Removed: no further event comes (it would after 0.05 s).
    c:settimeout(0.5)
    local line, err = c:receive("*l")
    assert.is_nil(line)
    assert.equal("timeout", err)
    c:close()
  end)

  it("rejects bad options", function()
    assert.has_error(function() netrun.handler.idle_state { reader = -1 } end)
    assert.has_error(function() netrun.handler.idle_state(5) end)
  end)
end)

-- Run a netrun script in a child process; returns its output (stdout and
-- stderr) and exit status.
local function run_script(code, env)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(code)
  f:close()
  -- The log shows what each read() brought: the script runs without the
  -- fault shim's short reads (spec/fault), which would split "ping\n".
  local p = assert(io.popen(string.format("%s NETRUN_FAULT= timeout 30 %s %s 2>&1; echo \"::status=$?\"",
    env or "", BIN, path)))
  local out = p:read("a")
  p:close()
  os.remove(path)
  assert.not_matches("Sanitizer", out)
  assert.not_matches("runtime error", out)
  return out:gsub("::status=%d+%s*$", ""), tonumber(out:match("::status=(%d+)%s*$"))
end

-- A child that serves an echo with a logging handler in front, talks to
-- it once and shuts down.
local LOGGED = [[
local netrun = require "netrun"
local g = netrun.group { threads = 1, name = "lg" }
local Echo = {}
function Echo:channel_read(ctx, msg) ctx:write(msg) end
function Echo:channel_read_complete(ctx) ctx:flush() end
local server = netrun.server {
  group = g, host = "127.0.0.1", port = 0,
  init = function(ch)
    ch:pipeline():add_last("wire", netrun.handler.logging { level = "%s" })
    ch:pipeline():add_last("echo", Echo)
  end,
}:sync()
local _, port = server:local_address()
local got = netrun.promise()
local Client = {}
function Client:channel_read(ctx, msg) got:try_success(msg) end
local ch = netrun.connect { group = g, host = "127.0.0.1", port = port,
  init = function(ch) ch:pipeline():add_last("client", Client) end }:sync()
ch:write_and_flush("ping\n")
print("echoed " .. got:sync())
ch:close():sync()
g:shutdown_gracefully(0, 5):sync()
]]

describe("netrun.handler.logging", function()
  it("logs each event and operation with the channel id and handler name", function()
    local out, st = run_script(LOGGED:format("debug"), "NETRUN_LOG=debug")
    assert.equal(0, st, out)
    assert.matches("echoed ping", out)
    for _, what in ipairs { "HANDLER ADDED", "REGISTERED", "ACTIVE",
                            'READ 5B "ping\\n"', "READ COMPLETE",
                            'WRITE 5B "ping\\n"', "FLUSH", "INACTIVE",
                            "UNREGISTERED", "HANDLER REMOVED" } do
      assert.matches("DEBUG %[lg%-1%] channel %d+ 'wire': " .. what:gsub("%p", "%%%0"), out)
    end
  end)

  it("logs at its own level, so the process log level filters it", function()
    local out, st = run_script(LOGGED:format("debug"), "NETRUN_LOG=info")
    assert.equal(0, st, out)
    assert.matches("echoed ping", out)
    assert.not_matches("'wire'", out)
    out, st = run_script(LOGGED:format("warn"), "NETRUN_LOG=info")
    assert.equal(0, st, out)
    assert.matches("WARN  %[lg%-1%] channel %d+ 'wire': ACTIVE", out)
  end)

  it("rejects an unknown level", function()
    assert.has_error(function() netrun.handler.logging { level = "loud" } end)
  end)
end)
