-- netrun.top -- `netrun top [-d SECONDS] [-n COUNT] CONSOLE_PATH`: a live
-- view of a running process's loops, refreshed every SECONDS (default 1)
-- like top(1), over the console socket `netrun attach` uses. Each refresh
-- asks the console for :stats (one tab-separated line per loop) and shows
-- per loop: state, channels, pending tasks, tasks/s and busy % since the
-- last refresh, stalls and Lua memory. q (or Ctrl-C) quits.
local core = require "netrun.core"
local repl = require "netrun.repl"

local M = {}

local function parse(text)
  local lines = {}
  for line in text:gmatch("[^\n]+") do lines[#lines + 1] = line end
  local pid, clock = (lines[1] or ""):match("^(%d+)\t([%d.]+)$")
  if not pid then return nil end
  local s = { pid = pid, clock = tonumber(clock), loops = {} }
  for i = 2, #lines do
    local f = {}
    for v in lines[i]:gmatch("[^\t]+") do f[#f + 1] = v end
    s.loops[#s.loops + 1] = { name = f[1], state = f[2], channels = tonumber(f[3]),
      pending = tonumber(f[4]), tasks = tonumber(f[5]), busy = tonumber(f[6]),
      stalls = tonumber(f[7]), memory = tonumber(f[8]) }
  end
  return s
end

local function size(bytes)
  if bytes >= 1 << 30 then return string.format("%.1fG", bytes / (1 << 30)) end
  if bytes >= 1 << 20 then return string.format("%.1fM", bytes / (1 << 20)) end
  return string.format("%.1fK", bytes / 1024)
end

-- The screen for sample s (prev: the one before, for the rates).
function M.render(s, prev, path, interval)
  local out = { string.format("netrun top - pid %s - %s - every %gs - q quits", s.pid, path, interval),
    string.format("%-18s %-13s %8s %8s %10s %6s %7s %9s", "LOOP", "STATE", "CHANNELS",
      "PENDING", "TASKS/s", "BUSY%", "STALLS", "LUA_MEM") }
  local before = {}
  for _, l in ipairs(prev and prev.loops or {}) do before[l.name] = l end
  local dt = prev and s.clock - prev.clock or 0
  for _, l in ipairs(s.loops) do
    local b = before[l.name]
    local rate, busy = "-", "-"
    if b and dt > 0 then
      rate = string.format("%.0f", math.max(0, l.tasks - b.tasks) / dt)
      busy = string.format("%.1f", math.min(100, math.max(0, l.busy - b.busy) / dt * 100))
    end
    out[#out + 1] = string.format("%-18s %-13s %8d %8d %10s %6s %7d %9s", l.name:sub(1, 18), l.state,
      l.channels, l.pending, rate, busy, l.stalls, size(l.memory))
  end
  if #s.loops == 0 then out[#out + 1] = "(no loops)" end
  return table.concat(out, "\n")
end

local function usage()
  io.stderr:write("usage: netrun top [-d SECONDS] [-n COUNT] CONSOLE_PATH\n")
  return 2
end

-- Wait up to secs for a key; true when it asks to quit.
local function quit_key(secs, state)
  local deadline = core.now() + secs
  while true do
    local left = deadline - core.now()
    if left <= 0 then return false end
    if state.eof then                     -- no keyboard: just wait
      core.repl_wait(require("netrun").promise(), left)
      return false
    end
    local key = core.term_key(left)
    if key == false then
      state.eof = true
    elseif key == "q" or key == "Q" or key == "\3" then
      return true
    elseif key == nil then
      return false
    end
  end
end

local function show(r, path, interval, count)
  local prev, state, shown = nil, {}, 0
  local tty = core.isatty(1)
  while true do
    r.send(":stats")
    local text, prompt = r.response(10)
    if not text or not prompt then
      io.write("\n")
      io.stderr:write("netrun top: ", path, ": ",
        text and "connection closed by the server" or ("no answer: " .. tostring(prompt)), "\n")
      return 1
    end
    local s = parse(text)
    if not s then
      io.stderr:write("netrun top: ", path, ": unexpected answer: ", repl.printable(text), "\n")
      return 1
    end
    io.write(tty and "\27[H\27[2J" or "", M.render(s, prev, path, interval), "\n")
    io.flush()
    prev, shown = s, shown + 1
    if count and shown >= count then return 0 end
    if quit_key(interval, state) then return 0 end
  end
end

-- `netrun top ...` with its arguments: returns the exit status.
function M.main(args)
  local interval, count, path = 1, nil, nil
  local i = 1
  while i <= #args do
    local a = args[i]
    if a == "-d" or a == "-n" then
      local v = tonumber(args[i + 1])
      if not v or v <= 0 then
        io.stderr:write("netrun top: ", a, " needs a positive number\n")
        return usage()
      end
      if a == "-d" then interval = v else count = math.floor(v) end
      i = i + 2
    elseif a:sub(1, 1) == "-" or path then
      return usage()
    else
      path = a
      i = i + 1
    end
  end
  if not path then return usage() end
  local r, err = repl.open_console(path, "netrun top")
  if not r then
    io.stderr:write(err, "\n")
    return 1
  end
  local raw = core.term_raw(true)
  local ok, status = pcall(show, r, path, interval, count)
  core.term_raw(false)
  r.close()
  if raw and io.stdout then io.write("\n") end
  if not ok then error(status, 0) end
  return status
end

return M
