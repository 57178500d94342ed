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
local function screen()
  return (tmux("capture-pane -p -J -t " .. SESSION):gsub("[ \n]+$", ""))
end

-- Wait (bounded) until the screen matches a pattern; a terminal offers no
-- event to wait on, so this polls.
local function expect(pattern, secs)
  local deadline = socket.gettime() + (secs or 10)
  repeat
    local s = screen()
    if s:match(pattern) then return s end
    socket.sleep(0.05)
  until socket.gettime() > deadline
  error("the screen never showed " .. pattern .. ":\n" .. screen())
end

local function type_line(line)
  tmux("send-keys -t " .. SESSION .. " -l " .. string.format("%q", line))
  tmux("send-keys -t " .. SESSION .. " Enter")
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
    type_line("g = require('netrun').group { threads = 2, name = 'worker' }")
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

  it("keeps a history across lines (up arrow)", function()
    type_line("'history ' .. 1")
    expect('"history 1"')
    tmux("send-keys -t " .. SESSION .. " Up")
    expect("netrun> 'history ' .. 1$")
    tmux("send-keys -t " .. SESSION .. " Enter")
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
end)
