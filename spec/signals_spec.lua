-- signals_spec.lua -- programs a script starts (io.popen, os.execute, from
-- the main state and from a loop thread) get an empty signal mask and
-- default dispositions, not netrun's blocked SIGINT/SIGTERM/SIGHUP, and
-- none of netrun's fds; io.popen and os.execute return what stock Lua's do.
-- The children are exec'd by the shell: dash clears the mask of the ones it
-- forks (`sleep 30 &`), so only a program it execs (or bash's last command)
-- showed the bug.
local H = require "spec.helper"
local socket = H.socket

local FIXTURE = "spec/fixtures/spawn_children.lua"

-- Run netrun on FIXTURE, fds above 2 closed first (the test runner's own
-- would be inherited by everything and blur the fd check), bounded by
-- timeout(1). Returns the read end of its stdout.
local function start_fixture()
  local err = os.tmpname()
  local cmd = "for fd in $(ls /proc/$$/fd); do [ $fd -gt 2 ] && eval \"exec $fd>&-\"; done; " ..
    string.format("exec timeout -k 2 25 %s %s 2>%s", H.BIN, FIXTURE, err)
  return assert(io.popen("exec bash -c '" .. cmd .. "'")), err  -- dash: fds < 10
end

-- Wait (bounded) until process pid is gone; true if it went in time.
local function gone_within(pid, secs)
  local deadline = socket.gettime() + secs
  while H.alive(pid) do
    if socket.gettime() > deadline then return false end
    socket.select(nil, nil, 0.02)
  end
  return true
end

describe("programs a netrun script starts", function()
  local lines, killed = {}, {}

  setup(function()
    local f, err = start_fixture()
    for l in f:lines() do
      lines[#lines + 1] = l
      local tag, how, pid = l:match("^(%a+) (%a+) (%d+)$")
      if pid then                   -- a child announced itself: TERM it
        os.execute("kill -TERM " .. pid)
        killed[tag .. " " .. how] = gone_within(pid, 3)
        os.execute("kill -KILL " .. pid .. " 2>/dev/null")  -- unblock a failed run
      end
    end
    f:close()
    os.remove(err)
  end)

  local function field(tag, name)
    for _, l in ipairs(lines) do
      local v = l:match("^" .. tag .. " " .. name .. " (.*)$")
      if v then return v end
    end
  end

  for _, tag in ipairs { "main", "loop" } do
    it("ends at kill -TERM when started from the " .. tag .. " state", function()
      assert.is_true(killed[tag .. " popen"], "io.popen's sleep ignored SIGTERM")
      assert.is_true(killed[tag .. " execute"], "os.execute's sleep ignored SIGTERM")
      assert.equal("nil signal 15", field(tag, "popen%-result"))
      assert.equal("nil signal 15", field(tag, "execute%-result"))
    end)

    it("has no signal blocked and ignores none netrun does not (" .. tag .. ")", function()
      local ign = {}
      for _, l in ipairs(lines) do
        local who, mask = l:match("^(%a+) status SigIgn: (%x+)$")
        if who then ign[who] = tonumber(mask:sub(-8), 16) end  -- glibc's own above 31
      end
      local blk = {}
      for _, l in ipairs(lines) do
        if l:match("^" .. tag .. " status SigBlk: ") then blk[#blk + 1] = l end
      end
      assert.same({ tag .. " status SigBlk: 0000000000000000" }, blk)
      assert.is_number(ign.netrun)
      assert.equal(ign.netrun, ign[tag])
    end)

    it("holds none of netrun's fds (" .. tag .. ")", function()
      local fds = {}
      for _, l in ipairs(lines) do
        local fd, target = l:match("^" .. tag .. " fd (%d+) (.*)$")
        if fd and not target:match("^/proc/%d+/fd$") then   -- ls's directory
          fds[#fds + 1] = tonumber(fd)
        end
      end
      table.sort(fds)
      assert.same({ 0, 1, 2 }, fds)
    end)
  end

  it("runs the fixture to its end", function()
    assert.equal("end", lines[#lines])
  end)
end)

describe("io.popen and os.execute", function()
  -- The same chunk under stock lua5.4, in netrun's main state and on a
  -- loop thread: every result printed.
  local CHUNK = [[
    local r = {}
    local function add(...)
      local t = table.pack(...)
      for i = 1, t.n do t[i] = tostring(t[i]) end
      r[#r + 1] = table.concat(t, ",")
    end
    for _, c in ipairs { "exit 0", "exit 3", "kill -TERM $$", "echo hi",
                         "printf 'a\\nb'", "-x" } do
      local f = io.popen(c)
      add(c, io.type(f), f:read("a"), f:close())
      add(c, io.type(f), os.execute(c .. " 2>/dev/null"))
    end
    local f = io.popen("cat >/dev/null", "w")
    add(f:write("data") == f, f:close())
    f = io.popen("exit 5", "w")
    add(f:close())
    f = io.popen("printf '1\\n2\\n'")
    for l in f:lines() do add(l) end
    add(f:close())
    add(pcall(io.popen, "true", "rw"))
    add(pcall(f.read, f))
    add(os.execute())
    return table.concat(r, "\n")
  ]]

  local function run(cmd)
    local f = assert(io.popen(cmd .. " 2>/dev/null"))  -- sh's complaint about -x
    local s = f:read("a")
    f:close()
    return s
  end

  local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

  it("return what stock Lua's return, in the main state and on a loop", function()
    local src = "print(load(" .. string.format("%q", CHUNK) .. ")())"
    local stock = run("lua5.4 -e " .. quote(src))
    assert.matches("exit 3,file,,nil,exit,3", stock, 1, true)
    assert.equal(stock, run("timeout 20 " .. H.BIN .. " -e " .. quote(src)))
    local on_loop = "local g = require('netrun').group { threads = 1 } " ..
      "print(g:submit(function(s) return load(s)() end, " ..
      string.format("%q", CHUNK) .. "):sync()) g:shutdown_gracefully(0, 1)"
    assert.equal(stock, run("timeout 20 " .. H.BIN .. " -e " .. quote(on_loop)))
  end)
end)
