-- cli_spec.lua -- the netrun executable (DESIGN.md §5) and its console.
local H = require "spec.helper"
local socket = H.socket
local BIN = os.getenv("NETRUN_BIN") or (H.build .. "/bin/netrun")

-- Run a shell command; returns its output and exit status.
local function run(cmd)
  local f = assert(io.popen(cmd .. " 2>&1; echo \"::status=$?\""))
  local out = f:read("a")
  f:close()
  local status = tonumber(out:match("::status=(%d+)%s*$"))
  return out:gsub("::status=%d+%s*$", ""), status
end

-- Start netrun in the background; returns its pid and its output file.
local function spawn(args, env)
  local log = os.tmpname()
  local f = assert(io.popen(string.format("%s %s %s > %s 2>&1 & echo $!",
    env or "", BIN, args, log)))
  local pid = tonumber(f:read("l"))
  f:close()
  return pid, log
end

local read_file = H.read_file

-- Wait (bounded) for a line in a log: the process tells us it is ready.
local function wait_for(log, pattern, secs)
  local deadline = socket.gettime() + (secs or 10)
  repeat
    local m = read_file(log):match(pattern)
    if m then return m end
    socket.sleep(0.02)
  until socket.gettime() > deadline
  error("timed out waiting for " .. pattern .. " in:\n" .. read_file(log))
end

local function alive(pid) return os.execute("kill -0 " .. pid .. " 2>/dev/null") == true end

-- Wait (bounded) for a process to exit; returns its status via `wait`-less
-- polling of /proc (the shell that started it is gone).
local function wait_exit(pid, secs)
  local deadline = socket.gettime() + (secs or 20)
  while alive(pid) and socket.gettime() < deadline do socket.sleep(0.02) end
  return not alive(pid)
end

describe("netrun command", function()
  it("prints its version with -v", function()
    local out, st = run(BIN .. " -v")
    assert.equal(0, st)
    assert.matches("^netrun %d+%.%d+%.%d+ %(Lua 5%.4", out)
  end)

  it("prints its version with --version, and says so in its help", function()
    local out, st = run(BIN .. " --version")
    assert.equal(0, st)
    assert.equal(run(BIN .. " -v"), out)
    assert.matches("^netrun %d+%.%d+%.%d+ %(Lua 5%.4", out)
    assert.matches("%-v, %-%-version", (run(BIN .. " -h")))
  end)

  it("gives every state the command line: netrun.option reads flags on loops and executors", function()
    local out, st = run("timeout -k 1 20 " .. BIN .. " -t 3 spec/fixtures/options.lua --name bob --count=7")
    assert.equal(0, st, out)
    local arg0 = " arg[0]=spec/fixtures/options.lua\n"
    assert.equal("main bob integer 7" .. arg0 .. "loop bob integer 7" .. arg0
      .. "executor bob integer 7" .. arg0 .. "nested 3 bob integer 7" .. arg0, out)
  end)

  it("runs -e code and -l modules in order", function()
    local out, st = run(BIN .. " -l string -e 'print(type(string), 6 * 7)'")
    assert.equal(0, st)
    assert.equal("table\t42\n", out)
  end)

  it("passes the arg table and script arguments like lua", function()
    local out, st = run(BIN .. " spec/fixtures/args.lua one two")
    assert.equal(0, st)
    assert.equal("spec/fixtures/args.lua|one|two|" .. BIN .. "|2|one two\n", out)
  end)

  it("runs a script from stdin with -", function()
    local out, st = run("echo 'print(\"from stdin\", ...)' | " .. BIN .. " - x")
    assert.equal(0, st)
    assert.equal("from stdin\tx\n", out)
  end)

  it("exits 1 with a traceback when the script fails", function()
    local out, st = run(BIN .. " -e 'local function f() error(\"kaput\") end f()'")
    assert.equal(1, st)
    assert.matches("netrun: %(command line%):1: kaput", out)
    assert.matches("stack traceback:", out)
    out, st = run(BIN .. " /nonexistent/script.lua")
    assert.equal(1, st)
    assert.matches("cannot open /nonexistent/script.lua", out)
  end)

  it("rejects unknown options and explains usage", function()
    local out, st = run(BIN .. " --bogus")
    assert.equal(1, st)
    assert.matches("unrecognized option '%-%-bogus'", out)
    assert.matches("usage:", out)
    out, st = run(BIN .. " -t zero -e 1")
    assert.equal(1, st)
    assert.matches("%-t needs a thread count", out)
  end)

  it("explains `netrun attach` without a PATH instead of running a script named attach", function()
    local out, st = run(BIN .. " attach")
    assert.equal(2, st)
    assert.equal("usage: netrun attach PATH\n", out)
    out, st = run(BIN .. " attach a b")
    assert.equal(2, st)
    assert.equal("usage: netrun attach PATH\n", out)
  end)

  it("says in one line that there is no console socket to attach to", function()
    local path = H.tmpdir() .. "/none.sock"
    local out, st = run(BIN .. " attach " .. path)
    assert.equal(1, st)
    assert.equal("netrun attach: " .. path .. ": No such file or directory (is the server running with --console "
      .. path .. "?)\n", out)
  end)

  it("says in one line that a --console directory does not exist", function()
    local out, st = run(BIN .. " --console /nonexistent-netrun-dir/x.sock -e 'x = 1'")
    assert.equal(1, st)
    assert.equal("netrun: --console /nonexistent-netrun-dir/x.sock: directory /nonexistent-netrun-dir does not exist\n", out)
  end)

  it("uses -t N as the default number of worker threads", function()
    local out, st = run(BIN .. " -t 3 -e 'local g = require(\"netrun\").group{} print(#g) g:shutdown_gracefully(0, 1):sync()'")
    assert.equal(0, st)
    assert.equal("3\n", out)
  end)

  it("exits once the script's groups have terminated", function()
    local out, st = run(BIN .. " -e 'local n = require(\"netrun\"); local g = n.group{threads=1}; "
      .. "g:schedule(0.05, function() require(\"netrun\").current():group():shutdown_gracefully(0, 1) end)'")
    assert.equal(0, st)
    assert.equal("", out)
  end)

  -- A script lives while anything of it is alive (Node's rule, libuv's
  -- uv_loop_alive): a task queued or running, a timer of its own, an open
  -- channel (not an idle pooled HTTP connection), work a loop is owed.
  -- Then it exits 0 by itself, with no os.exit.
  describe("ends a script once nothing of it is alive", function()
    local server_pid, server_log, port
    setup(function()
      port = H.free_port()
      server_pid, server_log = H.start("examples/http_hello.lua", port)
    end)
    teardown(function()
      H.stop(server_pid)
      os.remove(server_log)
    end)

    local EXPECT = {
      request = "request\t200\tHello, World!\n", listener = "listener\t200\n",
      timer = "timer fired\n", stream = "stream\tHTTP/1.1 200 OK\n",
      executor = "executor\t42\n", idle = "idle\n",
    }
    for _, mode in ipairs { "request", "listener", "timer", "stream", "executor", "idle" } do
      it("(" .. mode .. ")", function()
        local t0 = socket.gettime()
        local out, st = run("timeout -k 1 20 " .. BIN .. " spec/fixtures/one_shot.lua --mode " .. mode
          .. " --port " .. port)
        local took = socket.gettime() - t0
        assert.equal(0, st, out)
        assert.equal(EXPECT[mode], out)
        assert.is_true(took < 3, string.format("took %.2f s", took))
      end)
    end

    it("(a name lookup under way keeps it: the main thread's and a loop's)", function()
      local D = require "dns_server"
      local g = H.netrun.group { threads = 1, name = "cli-dns" }
      local dns_port = D.start(g, { ["held1.test"] = { held = true, a = { "127.0.0.1" } } })
      local out = os.tmpname()
      local f = assert(io.popen(string.format("NETRUN_DNS_SERVERS=127.0.0.1:%d timeout -k 1 20 %s "
        .. "spec/fixtures/one_shot.lua --mode lookup --name held1.test > %s 2>&1; echo $? >> %s",
        dns_port, BIN, out, out), "r"))
      -- both questions reach the server, and the script waits for them
      assert.is_truthy(H.eventually(function() return D.queries("held1.test") > 0 end, 10))
      H.eventually(function() return false end, 0.3)    -- (it would have ended by now)
      assert.equal("", read_file(out))
      D.release("held1.test")
      f:read("a")                                       -- until it ends
      f:close()
      local text = read_file(out)
      os.remove(out)
      H.shutdown(g)
      assert.matches("lookup\t127.0.0.1\n", text)
      assert.matches("lookup on a loop\t127.0.0.1\n", text)
      assert.matches("\n0\n$", text)
    end)

    it("(prints on three threads at once: every line whole)", function()
      local out, st = run("timeout -k 1 20 " .. BIN .. " spec/fixtures/one_shot.lua --mode prints")
      assert.equal(0, st, out:sub(1, 500))
      local count, bad = {}, {}
      for line in out:gmatch("[^\n]*\n") do
        local who, i, xs = line:match("^([%w-]+)\t(%d+)\t(x*)\n$")
        if who and #xs == tonumber(i) % 50 then count[who] = (count[who] or 0) + 1
        elseif #bad < 3 then bad[#bad + 1] = line end
      end
      assert.same({}, bad)
      assert.same({ main = 2000, ["printer-1"] = 2000, ["printer-2"] = 2000 }, count)
    end)

    it("(a console alone keeps nothing alive)", function()
      local dir = H.tmpdir()
      local out, st = run("timeout -k 1 20 " .. BIN .. " --console " .. dir .. "/c.sock -e "
        .. "'require(\"netrun\").group { threads = 1 } print(\"done\")'")
      os.execute("rm -rf " .. dir)
      assert.equal(0, st, out)
      assert.matches("^done\n", out)
    end)

    for _, mode in ipairs { "server", "interval" } do
      it("but keeps one with a " .. mode .. " up", function()
        local p = H.free_port()
        local pid, log = H.start("spec/fixtures/one_shot.lua --mode " .. mode, p)
        H.eventually(function() return false end, 0.3)      -- (it would have ended by now)
        assert.is_true(H.alive(pid))
        if mode == "server" then
          local c = H.client(p)
          c:send("still here\n")
          assert.equal("still here", c:receive("*l"))
          c:close()
        end
        assert.is_true(H.stop(pid))
        os.remove(log)
      end)
    end
  end)

  it("on SIGTERM shuts down gracefully: accepted writes are flushed, status 0", function()
    local pid, log = spawn("spec/fixtures/bulk_server.lua")
    local port = tonumber(wait_for(log, "ready (%d+)"))
    local c = H.client(port)
    local size = 8 * 1024 * 1024
    assert(c:send("GET " .. size .. "\n"))
    local first = H.recv(c, 1)               -- the write was accepted
    os.execute("kill -TERM " .. pid)
    local rest, err, partial = c:receive(size - 1)
    assert.is_nil(err, "lost bytes: got " .. (rest and #rest or #(partial or "")))
    assert.equal(size, #first + #rest)
    assert.equal(string.rep("0123456789abcdef", 16), (first .. rest):sub(1, 256))
    assert.is_nil((c:receive(1)))             -- then the server closed
    c:close()
    assert.is_true(wait_exit(pid))
    assert.matches("signal 15: shutting down gracefully", read_file(log))
  end)

  it("exits at once with status 130 on a second signal", function()
    local pid, log = spawn("spec/fixtures/bulk_server.lua")
    wait_for(log, "ready (%d+)")
    local f = assert(io.popen("kill -TERM " .. pid .. "; sleep 0.1; kill -TERM " .. pid
      .. "; for i in $(seq 100); do kill -0 " .. pid .. " 2>/dev/null || break; sleep 0.05; done; echo done"))
    f:read("a")
    f:close()
    assert.is_false(alive(pid))
    assert.matches("second signal, exiting now", read_file(log))
  end)
end)

describe("console", function()
  local pid, log, path, dir
  setup(function()
    dir = H.tmpdir()
    path = dir .. "/console.sock"
    pid, log = spawn("--console " .. path .. " spec/fixtures/bulk_server.lua")
    wait_for(log, "ready (%d+)")
  end)
  teardown(function()
    os.execute("kill -TERM " .. pid)
    wait_exit(pid)
    os.execute("rm -rf " .. dir)
  end)

  it("listens on a socket of mode 0600", function()
    local out = run("stat -c %a " .. path)
    assert.equal("600\n", out)
  end)

  it("attach evaluates inside the live server, commands included", function()
    local out, st = run("printf ':loops\\n:loop bulk-1\\nreturn require(\"netrun\").current():name()\\n"
      .. "x = 40\\nx + 2\\n:main\\nreturn require(\"netrun\").current()\\n:quit\\n' | " .. BIN .. " attach " .. path)
    assert.equal(0, st)
    assert.matches("bulk%-1%s+started", out)
    assert.matches('"bulk%-1"', out)
    assert.matches("\n42\n", out)
    assert.matches("evaluating in the main state\nnil\n", out)
  end)

  it("attach shows what an evaluation prints, before its result, not the server's stdout", function()
    local out, st = run("printf 'print(\"in\", \"main\") return 1\n:loop bulk-1\n"
      .. "for i = 1, 2 do print(\"bulk \" .. i) end return 2\n:quit\n' | " .. BIN .. " attach " .. path)
    assert.equal(0, st)
    assert.matches("\nin\tmain\n1\n", out)
    assert.matches("\nbulk 1\nbulk 2\n2\n", out)
    assert.not_matches("bulk 1", read_file(log))
  end)

  it("takes a client's interrupt (\\3) and completion (\\2complete) requests on the wire", function()
    local unix = require "socket.unix"
    local c = assert(unix())
    c:settimeout(5)
    assert(c:connect(path))
    local function response()                  -- lines up to "\1<prompt>"
      local lines = {}
      while true do
        local l = assert(c:receive("*l"))
        if l:sub(1, 1) == "\1" then return table.concat(lines, "\n"), l:sub(2) end
        lines[#lines + 1] = l
      end
    end
    response()                                   -- greeting
    assert(c:send(":loop bulk-1\n"))
    response()
    local t0 = socket.gettime()
    assert(c:send("local t = os.clock() while os.clock() - t < 1 do end\n\3\n"))
    local text, prompt = response()
    assert.matches("interrupted: bulk%-1 is still busy", text)
    assert.equal("netrun(bulk-1)> ", prompt)
    assert.is_true(socket.gettime() - t0 < 0.9)
    assert(c:send("\2complete string.rev\n"))
    assert.equal("string.reverse", (response()))
    assert(c:send("function unfinished()\n"))
    assert.equal(">> ", select(2, response()))
    assert(c:send("\2cancel\n"))
    assert.equal("netrun(bulk-1)> ", select(2, response()))
    c:close()
  end)

  it("serves several consoles at once and survives a client that vanishes mid-evaluation", function()
    local unix = require "socket.unix"
    local a = assert(unix())
    a:settimeout(5)
    assert(a:connect(path))
    local b = assert(unix())
    b:settimeout(5)
    assert(b:connect(path))
    a:receive("*l")                              -- greeting
    assert(a:send(":loop 1\nlocal t = os.clock() while os.clock() - t < 0.3 do end return 1\n"))
    a:close()                                    -- gone while it evaluates
    b:receive("*l")
    assert(b:send("return 6 * 7\n"))
    local got = ""
    local deadline = socket.gettime() + 5
    while not got:find("42") and socket.gettime() < deadline do
      local line = b:receive("*l")
      if not line then break end
      got = got .. line .. "\n"
    end
    assert.matches("42", got)
    b:close()
    local out = run("printf 'return 1 + 1\\n' | " .. BIN .. " attach " .. path)
    assert.matches("\n2\n", out)
  end)

  it("refuses a peer of another uid", function()
    if run("id -u") ~= "0\n" or not run("which setpriv"):match("setpriv") then
      pending("needs root and setpriv to act as another user")
      return
    end
    os.execute("chmod 0666 " .. path .. "; chmod 0755 " .. dir)
    local out = run("setpriv --reuid=65534 --regid=65534 --clear-groups " .. BIN
      .. " attach " .. path .. " < /dev/null")
    os.execute("chmod 0600 " .. path .. "; chmod 0700 " .. dir)
    -- the server refuses it, and attach itself refuses a server of another uid
    assert.matches("runs as uid 0, not as you %(uid 65534%); not attaching", out)
    -- the server logs its refusal on its own loop, maybe after attach exited
    assert.truthy(H.eventually(function()
      return read_file(log):match("refused a peer of uid 65534") end, 10), read_file(log))
  end)
end)

describe("console paths", function()
  local dir
  before_each(function() dir = H.tmpdir() end)
  after_each(function() os.execute("rm -rf " .. dir) end)

  it("--console never replaces a file that is not a socket", function()
    local path = dir .. "/notes.txt"
    local f = assert(io.open(path, "w")); f:write("keep me"); f:close()
    local out, st = run(BIN .. " --console " .. path .. " -e 'print(1)'")
    assert.equal(1, st)
    assert.matches("notes.txt: exists and is not a socket; not replaced", out)
    assert.equal("keep me", read_file(path))
  end)

  it("attach shows a console's control characters escaped, never raw", function()
    local path = dir .. "/fake.sock"
    local script = dir .. "/fake.lua"
    local f = assert(io.open(script, "w"))
    f:write([[
local netrun = require "netrun"
netrun.server { group = netrun.group { threads = 1, name = "fake" }, unix = arg[1],
  init = function(ch) ch:pipeline():add_last("evil", {
    channel_active = function(self, ctx)
      ctx:write_and_flush("hello\27]0;owned\7\27[2J\tend\1netrun\27[31m> \n")
    end,
    channel_read = function(self, ctx, msg)
      ctx:write_and_flush("bye\27[0m\n")
      ctx:close()
    end }) end }:sync()
print("ready")
]])
    f:close()
    local pid, log = spawn(script .. " " .. path)
    wait_for(log, "ready")
    local out = run("printf 'x\\n' | " .. BIN .. " attach " .. path)
    os.execute("kill -TERM " .. pid)
    wait_exit(pid)
    assert.is_nil(out:find("[\1-\8\11-\31\127]"), out)
    assert.matches("hello\\027]0;owned\\007\\027[2J\tend", out, 1, true)
    assert.matches("bye\\027[0m", out, 1, true)
  end)
end)
