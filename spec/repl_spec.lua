-- repl_spec.lua -- the REPL on a real pseudo-terminal (tmux), and without
-- one (redirected stdin: no prompts).
local H = require "spec.helper"
local socket = H.socket
local BIN = os.getenv("NETRUN_BIN") or (H.build .. "/bin/netrun")
local have_tmux = os.execute("command -v tmux > /dev/null") == true

local SESSION = "netrun-spec-" .. tostring(os.time()) .. "-" .. tostring(math.random(1e6))

local function tmux(args)
  local f = assert(io.popen("tmux " .. args .. " 2>&1"))
  local out = f:read("a")
  f:close()
  return out
end

-- The visible screen, trailing blanks trimmed (prompts end in "> ").
local function screen(session)
  return (tmux("capture-pane -p -J -t " .. (session or SESSION)):gsub("[ \n]+$", ""))
end

-- Wait (bounded) until the screen matches a pattern; a terminal offers no
-- event to wait on, so this polls.
local function expect(pattern, secs, session)
  local deadline = socket.gettime() + (secs or 10)
  repeat
    local s = screen(session)
    if s:match(pattern) then return s end
    socket.sleep(0.05)
  until socket.gettime() > deadline
  error("the screen never showed " .. pattern .. ":\n" .. screen(session))
end

local function type_text(text, session)
  tmux("send-keys -t " .. (session or SESSION) .. " -l " .. string.format("%q", text))
end

local function key(name, session)
  tmux("send-keys -t " .. (session or SESSION) .. " " .. name)
end

local function type_line(line, session)
  type_text(line, session)
  key("Enter", session)
end

-- Ctrl-C once the screen shows what was typed: the terminal discards input
-- not yet read when it sends SIGINT, as it would for a person typing.
local function ctrl_c_after(pattern, session)
  expect(pattern, 10, session)
  key("C-c", session)
end

-- A terminal running `cmd` then printing its exit status, in its own
-- tmux session (kept open so the status can be read).
local function terminal(name, cmd)
  tmux(string.format("new-session -d -s %s -x 160 -y 50 'HOME=%s %s; echo status=$?; sleep 60'",
    name, H.tmpdir(), cmd))
end

describe("REPL on a terminal", function()
  if not have_tmux then
    it("needs tmux", function() pending("tmux is not installed") end)
    return
  end

  setup(function()
    tmux(string.format("new-session -d -s %s -x 160 -y 50 'HOME=%s %s'", SESSION,
      H.tmpdir(), BIN))
    expect("netrun>$")
  end)
  teardown(function() tmux("kill-session -t " .. SESSION) end)

  it("evaluates an expression", function()
    type_line("1 + 1")
    expect("netrun> 1 %+ 1\n2\nnetrun>$")
  end)

  it("continues an incomplete chunk with >> and runs the whole function", function()
    type_line("function double(x)")
    expect(">>$")
    type_line("  return x * 2")
    type_line("end")
    type_line("double(21)")
    expect("\n42\nnetrun>$")
  end)

  it("pretty-prints nested tables with sorted keys", function()
    type_line("{ b = { 3, 2 }, a = 1, c = { d = 'x' } }")
    expect('{ a = 1, b = { 3, 2 }, c = { d = "x" } }')
  end)

  it("prints an error with its traceback and keeps the prompt", function()
    type_line("error('kaboom')")
    expect("stdin:1: kaboom\nstack traceback:.-\nnetrun>$")
  end)

  it("lists loops and evaluates inside a loop's own state", function()
    -- no stall reports: they would land between the prompts of the busy-loop case
    type_line("g = require('netrun').group { threads = 2, name = 'worker', stall_threshold = 0 }")
    type_line(":loops")
    expect("worker%-2%s+not_started")
    type_line(":loop 1")
    expect("evaluating in worker%-1\nnetrun%(worker%-1%)>$")
    type_line("require('netrun').current():name()")
    expect('"worker%-1"\nnetrun%(worker%-1%)>$')
    type_line("answer = 42")
    type_line(":main")
    type_line("answer")
    expect("evaluating in the main state\nnetrun> answer\nnil\nnetrun>$")
  end)

  it("abandons the wait on a busy loop with Ctrl-C and stays alive", function()
    type_line(":loop worker-2")
    type_line("while true do end")
    socket.sleep(0.3)
    tmux("send-keys -t " .. SESSION .. " C-c")
    expect("interrupted: worker%-2 is still busy")
    type_line(":main")
    type_line("'still here'")
    expect('"still here"\nnetrun>$')
  end)

  it("completes globals and fields with Tab", function()
    tmux("send-keys -t " .. SESSION .. " -l " .. string.format("%q", "string.rev"))
    tmux("send-keys -t " .. SESSION .. " Tab")
    expect("netrun> string%.reverse$")
    tmux("send-keys -t " .. SESSION .. " -l " .. string.format("%q", "('abc')"))
    tmux("send-keys -t " .. SESSION .. " Enter")
    expect('\n"cba"\nnetrun>$')
  end)

  it("prints what a loop's evaluation prints before its result", function()
    type_line(":loop worker-1")
    type_line("for i = 1, 3 do print('line ' .. i) end return 'result'")
    expect('\nline 1\nline 2\nline 3\n"result"\nnetrun%(worker%-1%)>$')
    type_line(":main")
    expect("evaluating in the main state\nnetrun>$")
  end)

  it("completes a loop's own globals with Tab after :loop N", function()
    type_line(":loop worker-1")
    type_line("only_in_worker_1 = 7")
    expect("only_in_worker_1 = 7\nnetrun%(worker%-1%)>$")
    type_text("only_in_wo")
    key("Tab")
    expect("netrun%(worker%-1%)> only_in_worker_1$")
    key("Enter")
    expect("\n7\nnetrun%(worker%-1%)>$")
    type_line(":main")
    expect("evaluating in the main state\nnetrun>$")
  end)

  it("discards a half-typed line on Ctrl-C and shows a fresh prompt", function()
    type_text("half typed")
    ctrl_c_after("netrun> half typed$")
    expect("netrun> half typed%^C\nnetrun>$")
    type_line("1 + 2")
    expect("netrun> 1 %+ 2\n3\nnetrun>$")
  end)

  it("cancels an incomplete chunk on Ctrl-C", function()
    type_line("function unfinished()")
    ctrl_c_after(">>$")
    expect(">> %^C\nnetrun>$")
    type_line("'fresh'")
    expect('netrun> \'fresh\'\n"fresh"\nnetrun>$')
  end)

  it("keeps a history across lines (up arrow)", function()
    type_line("'history ' .. 1")
    -- the next prompt first: an Up typed while the terminal is still in
    -- cooked mode (the line being evaluated) is echoed as ^[[A, not read
    expect('"history 1"\nnetrun>$')
    tmux("send-keys -t " .. SESSION .. " Up")
    expect("netrun> 'history ' .. 1$")
    tmux("send-keys -t " .. SESSION .. " Enter")
  end)
end)

describe("REPL :quit", function()
  if not have_tmux then
    it("needs tmux", function() pending("tmux is not installed") end)
    return
  end
  local name = SESSION .. "-quit"
  teardown(function() tmux("kill-session -t " .. name) end)

  it("leaves within seconds when a loop is stuck in Lua, naming it", function()
    terminal(name, BIN)
    expect("netrun>$", 10, name)
    type_line("g = require('netrun').group { threads = 2, name = 'stuck', stall_threshold = 0 }", name)
    type_line(":loop stuck-2", name)
    type_line("while true do end", name)
    socket.sleep(0.2)
    key("C-c", name)
    expect("interrupted: stuck%-2 is still busy.-netrun%(stuck%-2%)>$", 10, name)
    type_line(":quit", name)
    local t0 = socket.gettime()
    expect("leaving without waiting for stuck%-2 %(still running Lua code: stuck%?%)", 10, name)
    assert.is_true(socket.gettime() - t0 < 8)
    -- a sanitizer reports the threads left behind, and exits non-zero
    local status = tonumber(expect("status=(%d+)$", 10, name):match("status=(%d+)$"))
    if not H.sanitized then assert.equal(0, status) end
  end)
end)

describe("attach on a terminal", function()
  if not have_tmux then
    it("needs tmux", function() pending("tmux is not installed") end)
    return
  end
  local name = SESSION .. "-attach"
  local dir, path, pid

  setup(function()
    dir = H.tmpdir()
    path = dir .. "/console.sock"
    local log = dir .. "/server.log"
    local f = assert(io.popen(string.format("%s --console %s spec/fixtures/bulk_server.lua > %s 2>&1 & echo $!",
      BIN, path, log)))
    pid = tonumber(f:read("l"))
    f:close()
    assert(H.eventually(function()
      local lf = io.open(log)
      local text = lf and lf:read("a") or ""
      if lf then lf:close() end
      return text:match("ready %d+") ~= nil
    end, 10), "the server never got ready")
    terminal(name, BIN .. " attach " .. path)
    expect("netrun>$", 10, name)
  end)
  teardown(function()
    tmux("kill-session -t " .. name)
    os.execute("kill -KILL " .. pid .. " 2>/dev/null")
    os.execute("rm -rf " .. dir)
  end)

  it("shows what an evaluation prints, before its result, in main and in a loop", function()
    type_line("print('from', 'main') return 1", name)
    expect("\nfrom%s+main\n1\nnetrun>$", 10, name)
    type_line(":loop bulk-1", name)
    type_line("for i = 1, 2 do print('bulk ' .. i) end io.write('no newline') return 'r'", name)
    expect('\nbulk 1\nbulk 2\nno newline\n"r"\nnetrun%(bulk%-1%)>$', 10, name)
    type_line(":main", name)
    expect("evaluating in the main state\nnetrun>$", 10, name)
  end)

  it("completes the server's globals with Tab", function()
    type_line("server_side_global = 42", name)
    expect("server_side_global = 42\nnetrun>$", 10, name)
    type_text("server_side_gl", name)
    key("Tab", name)
    expect("netrun> server_side_global$", 10, name)
    key("Enter", name)
    expect("\n42\nnetrun>$", 10, name)
  end)

  it("has netrun as a global in the server's main state and in its loops", function()
    type_line("netrun.version", name)
    expect('\n"%d+%.%d+%.%d+"\nnetrun>$', 10, name)
    type_line(":loop bulk-1", name)
    type_line("netrun.current():name()", name)
    expect('\n"bulk%-1"\nnetrun%(bulk%-1%)>$', 10, name)
    type_line(":main", name)
    type_line("type(netrun.group)", name)
    expect('\n"function"\nnetrun>$', 10, name)
  end)

  it("discards a half-typed line and the server's incomplete chunk on Ctrl-C", function()
    type_text("half typed", name)
    ctrl_c_after("netrun> half typed$", name)
    expect("netrun> half typed%^C\nnetrun>$", 10, name)
    type_line("function unfinished()", name)
    ctrl_c_after(">>$", name)
    expect(">> %^C\nnetrun>$", 10, name)
    type_line("1 + 2", name)
    expect("netrun> 1 %+ 2\n3\nnetrun>$", 10, name)
  end)

  it("abandons the wait on a busy loop with Ctrl-C and stays attached", function()
    type_line(":loop bulk-1", name)
    type_line("while true do end", name)
    socket.sleep(0.3)
    key("C-c", name)
    expect("interrupted: bulk%-1 is still busy; its result will be dropped\nnetrun%(bulk%-1%)>$", 10, name)
    type_line(":main", name)
    type_line("'still attached'", name)
    expect('"still attached"\nnetrun>$', 10, name)
  end)

  it("says so and exits as soon as the server goes, while waiting for input", function()
    type_text("not sent", name)
    expect("netrun> not sent$", 10, name)
    os.execute("kill -KILL " .. pid)
    expect("connection closed by the server\nstatus=1$", 5, name)
  end)
end)

describe("REPL without a terminal", function()
  it("reads stdin with no prompts and prints results", function()
    local f = assert(io.popen("printf '1+1\\nlocal x =\\n 5\\n:help\\n' | " .. BIN .. " 2>&1"))
    local out = f:read("a")
    f:close()
    assert.matches("^2\n", out)
    assert.matches(":loops", out)
    assert.not_matches("netrun>", out)
  end)

  it("has netrun as a global in the main state and in every loop's, as luvit's REPL", function()
    local lines = { "netrun.version", "g = netrun.group { threads = 2, name = 'glob' }",
                    ":loop glob-2", "netrun.current():name()", "netrun.version", ":main",
                    "netrun.current()", "type(netrun.server)", ":quit" }
    local input = H.tmpdir() .. "/lines"
    local lf = assert(io.open(input, "w"))
    lf:write(table.concat(lines, "\n"), "\n")
    lf:close()
    local f = assert(io.popen(BIN .. " < " .. input .. " 2>&1"))
    local out = f:read("a")
    f:close()
    local version = '"%d+%.%d+%.%d+"'
    assert.matches("^" .. version .. "\nevaluating in glob%-2\n\"glob%-2\"\n" .. version
      .. "\nevaluating in the main state\nnil\n\"function\"\n", out)
    assert.not_matches("attempt to index", out)
  end)
end)
