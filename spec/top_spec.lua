-- top_spec.lua -- `netrun top CONSOLE_PATH` (DESIGN.md §8.5) on a real
-- pseudo-terminal (tmux): it shows a live process's loops, its numbers
-- move under load, q quits with status 0; a console path that does not
-- exist is a one-line error.
local H = require "spec.helper"
local socket = H.socket
local BIN = H.BIN
local have_tmux = os.execute("command -v tmux > /dev/null") == true

local SESSION = "netrun-top-" .. tostring(os.time()) .. "-" .. tostring(math.random(1e6))

local function tmux(args)
  local f = assert(io.popen("tmux " .. args .. " 2>&1"))
  local out = f:read("a")
  f:close()
  return out
end

local function screen()
  return (tmux("capture-pane -p -J -t " .. SESSION):gsub("[ \n]+$", ""))
end

local function expect(pattern, secs)
  local deadline = socket.gettime() + (secs or 10)
  repeat
    local s = screen()
    if s:match(pattern) then return s end
    socket.sleep(0.05)
  until socket.gettime() > deadline
  error("the screen never showed " .. pattern .. ":\n" .. screen())
end

-- The row of a loop on the screen: channels, pending, tasks/s, busy%.
local function row(s, name)
  local line = s:match("\n(" .. name:gsub("%-", "%%-") .. " [^\n]*)")
  if not line then return nil end
  local f = {}
  for w in line:gmatch("%S+") do f[#f + 1] = w end
  return { state = f[2], channels = tonumber(f[3]), pending = tonumber(f[4]),
           rate = tonumber(f[5]), busy = tonumber(f[6]), stalls = tonumber(f[7]), mem = f[8] }
end

describe("netrun top", function()
  it("says in one line that a console path does not exist", function()
    local out, st = H.run(BIN .. " top /nonexistent-netrun-dir/x.sock")
    assert.equal(1, st)
    assert.equal("netrun top: /nonexistent-netrun-dir/x.sock: No such file or directory "
      .. "(is the server running with --console /nonexistent-netrun-dir/x.sock?)\n", out)
  end)

  it("rejects a bad refresh interval", function()
    local out, st = H.run(BIN .. " top -d nope /tmp/x.sock")
    assert.equal(2, st)
    assert.matches("usage: netrun top", out)
  end)

  if not have_tmux then
    it("needs tmux", function() pending("tmux is not installed") end)
    return
  end

  local dir, path, pid, port

  setup(function()
    dir = H.tmpdir()
    path = dir .. "/console.sock"
    local f = assert(io.open(dir .. "/server.lua", "w"))
    -- every line is answered from a task of its loop: load shows as tasks/s
    f:write([[
local netrun = require "netrun"
local port = netrun.option("port", 0)
local Echo = {}
function Echo:channel_read(ctx, msg)
  ctx:loop():execute(function() ctx:write_and_flush(msg .. "\n") end)
end
netrun.server { group = netrun.group { threads = 1, name = "tload" }, host = "127.0.0.1", port = port,
  init = function(ch)
    ch:pipeline():add_last("line", netrun.codec.line {})
    ch:pipeline():add_last("echo", Echo)
  end }:sync()
netrun.log.info("listening on :%d", port)
]])
    f:close()
    port = H.free_port()
    pid = H.start("--console " .. path .. " " .. dir .. "/server.lua", port)
    tmux(string.format("new-session -d -s %s -x 120 -y 30 '%s top -d 0.3 %s; echo status=$?; sleep 60'",
      SESSION, BIN, path))
  end)
  teardown(function()
    tmux("kill-session -t " .. SESSION)
    if pid then H.stop(pid) end
    os.execute("rm -rf " .. dir)
  end)

  it("shows the loops, its numbers move under load, and q quits with status 0", function()
    local s = expect("LOOP%s+STATE%s+CHANNELS%s+PENDING%s+TASKS/s%s+BUSY%%%s+STALLS%s+LUA_MEM")
    assert.matches("netrun top %- pid %d+ %- " .. path:gsub("%p", "%%%0"), s)
    s = expect("\ntload%-1%s+started")
    assert.matches("\nconsole%-1%s+started", s)
    local idle = row(s, "tload-1")
    assert.equal(1, idle.channels)          -- the listener
    -- load: five clients sending lines until the screen shows them
    local clients = {}
    for i = 1, 5 do clients[i] = H.client(port) end
    local seen, sent = nil, 0
    local deadline = socket.gettime() + 10
    while socket.gettime() < deadline and sent < 20000 do
      for _, c in ipairs(clients) do
        assert(c:send("ping\n"))
        assert.equal("ping", c:receive("*l"))
        sent = sent + 1
      end
      if sent % 50 == 0 then
        local r = row(screen(), "tload-1")
        if r and r.channels == 6 and r.rate and r.rate > 0 then
          seen = r
          break
        end
      end
    end
    assert.truthy(seen, "the screen never showed the load:\n" .. screen())
    for _, c in ipairs(clients) do c:close() end
    tmux("send-keys -t " .. SESSION .. " q")
    expect("status=0$")
  end)
end)
