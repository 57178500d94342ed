-- netrun.repl -- the REPL: a session turns one line into (output, next
-- prompt), evaluating in the main state or inside any loop's own state.
-- The same session serves the terminal (netrun, netrun -i), and the
-- console socket (netrun --console PATH, netrun attach PATH).
local netrun = require "netrun"
local core = require "netrun.core"
local pretty = require "netrun.pretty"

local M = {}

-- The console protocol: lines in, responses out, each ending "\1<prompt>\n".
-- A line starting with CONTROL is a request of the client itself
-- ("\2complete WORD": the completions, one a line; "\2cancel": drop a
-- pending incomplete chunk); the line INTERRUPT abandons the wait of the
-- line being evaluated (Ctrl-C) and is never answered itself.
M.PROMPT_MARK = "\1"
M.CONTROL = "\2"
M.INTERRUPT = "\3"

local CAPTURE_MAX = 1 << 20     -- bytes of print output kept per evaluation

local HELP = [[
  expressions print their values; statements run; globals persist per state
  :loops           every loop of the process, with its stats
  :loop N | NAME   evaluate what follows inside that loop's own Lua state
  :main            evaluate in the main state again
  :reload          re-require the changed Lua modules in every state
  :stats           every loop's figures, tab-separated (what netrun top reads)
  :help            this text
  :quit            leave (Ctrl-D too); Ctrl-C abandons a wait on a busy loop]]

-- Call f() with print and io.write (to stdout) collected instead of
-- written: a console evaluation's output goes back to its client, before
-- the result. Returns the output and f's result. A chunk that sets print
-- or io.write itself keeps its own.
local function capturing(f)
  local out, size = {}, 0
  local function add(s)
    if size >= CAPTURE_MAX then return end
    out[#out + 1] = s
    size = size + #s
    if size >= CAPTURE_MAX then out[#out + 1] = "\n(output cut at 1 MiB)\n" end
  end
  local old_print, old_write = print, io.write
  local function cap_print(...)
    local t = table.pack(...)
    for i = 1, t.n do t[i] = tostring(t[i]) end
    add(table.concat(t, "\t", 1, t.n) .. "\n")
  end
  local function cap_write(...)
    if io.output() ~= io.stdout then return old_write(...) end
    for i = 1, select("#", ...) do
      local v = select(i, ...)
      if math.type(v) == "float" then
        v = string.format("%.14g", v)
      elseif type(v) ~= "string" and type(v) ~= "number" then
        error(string.format("bad argument #%d to 'write' (string expected, got %s)", i, type(v)), 2)
      end
      add(tostring(v))
    end
    return io.stdout
  end
  print, io.write = cap_print, cap_write
  local r = f()
  if print == cap_print then print = old_print end
  if io.write == cap_write then io.write = old_write end
  return table.concat(out), r
end

-- Every state the REPL evaluates in (the main state, a loop's after
-- :loop N, an attached console's) sees the runtime as the global
-- `netrun`, as luvit's and Node's REPLs expose theirs: typed lines need no
-- require. A global of that name the program set itself is kept.
function M.expose()
  if rawget(_G, "netrun") == nil then rawset(_G, "netrun", require "netrun") end
end

-- Run compiled source here; returns the text to show. interruptible: a
-- Ctrl-C raises in the chunk (the main state's own REPL); capture: what the
-- chunk prints comes back in the text (a console client's evaluation).
function M.run_chunk(code, interruptible, capture)
  M.expose()
  local f, err = load(code, "=stdin")
  if not f then return err end
  local function run()
    if interruptible then
      debug.sethook(function()
        if core.interrupted() then error("interrupted", 2) end
      end, "", 10000)
    end
    local r = table.pack(xpcall(f, debug.traceback))
    if interruptible then debug.sethook() end
    if not r[1] then   -- the traceback ends where the REPL's own frames begin
      return (tostring(r[2]):gsub("\n%s*%[C%]: in function 'xpcall'.*$", ""))
    end
    return pretty.values(r, 2)
  end
  if not capture then return run() end
  local out, text = capturing(run)
  if out ~= "" and text ~= "" and not out:match("\n$") then out = out .. "\n" end
  return out .. text
end

-- Every loop of the process, in group order.
function M.all_loops()
  local loops = {}
  for _, g in ipairs(core.groups()) do
    for _, l in ipairs(g:loops()) do loops[#loops + 1] = l end
  end
  return loops
end

local function loops_table()
  local rows = { string.format("  %-3s %-16s %-14s %8s %8s %10s %10s %7s", "#", "name", "state",
    "channels", "pending", "tasks", "lua_mem", "stalls") }
  for i, l in ipairs(M.all_loops()) do
    local s = l:stats()
    rows[#rows + 1] = string.format("  %-3d %-16s %-14s %8d %8d %10d %9.1fK %7d", i, s.name, s.state,
      s.channels, s.pending_tasks, s.tasks_run, s.lua_memory / 1024, s.stalls)
  end
  if #rows == 1 then rows[#rows + 1] = "  (no loops: create a group first)" end
  return table.concat(rows, "\n")
end

-- :stats -- a line "pid <tab> clock" then, per loop: name, state,
-- channels, pending tasks, tasks run, busy seconds (I/O + tasks), stalls,
-- Lua memory in bytes; tab-separated, for `netrun top`.
function M.stats_text()
  local rows = { string.format("%d\t%.6f", core.getpid(), core.now()) }
  for _, l in ipairs(M.all_loops()) do
    local s = l:stats()
    rows[#rows + 1] = string.format("%s\t%s\t%d\t%d\t%d\t%.6f\t%d\t%d", s.name, s.state,
      s.channels, s.pending_tasks, s.tasks_run, s.io_time + s.task_time, s.stalls, s.lua_memory)
  end
  return table.concat(rows, "\n")
end

local Session = {}
Session.__index = Session

-- opts.wait(future [, secs]) -> true when done, false when abandoned
-- (Ctrl-C), nil after secs. opts.remote_main: evaluate "main" through the
-- main loop, and opts.capture: send print's output back with the result
-- (the console).
function M.session(opts)
  return setmetatable({ wait = opts.wait, remote_main = opts.remote_main,
    capture = opts.capture }, Session)
end

-- Ctrl-C at the prompt: forget the incomplete chunk typed so far.
function Session:cancel()
  self.buffer = nil
end

function Session:prompt()
  if self.buffer then return ">> " end
  if self.target then return "netrun(" .. self.target_name .. ")> " end
  return "netrun> "
end

function Session:command(line)
  local cmd, rest = line:match("^%s*:(%S+)%s*(.-)%s*$")
  if cmd == "quit" or cmd == "q" then return "", true end
  if cmd == "help" then return HELP end
  if cmd == "loops" then return loops_table() end
  if cmd == "stats" then return M.stats_text() end
  if cmd == "reload" then
    local f = require("netrun.reload").reload()
    if not self.wait(f) then return "interrupted: the reload goes on; its outcome is logged" end
    return require("netrun.reload").describe(f)
  end
  if cmd == "main" then
    self.target, self.target_name = nil, nil
    return "evaluating in the main state"
  end
  if cmd == "loop" then
    local loops = M.all_loops()
    local pick = loops[tonumber(rest) or -1]
    for _, l in ipairs(loops) do
      if l:name() == rest then pick = l end
    end
    if not pick then return "no loop '" .. rest .. "' (see :loops)" end
    self.target, self.target_name = pick, pick:name()
    return "evaluating in " .. pick:name()
  end
  return "unknown command ':" .. tostring(cmd) .. "' (:help lists them)"
end

local function remote(code, capture)
  return require("netrun.repl").run_chunk(code, false, capture)
end

function Session:evaluate(code)
  local target = self.target
  if not target and self.remote_main then target = core.main_loop() end
  if not target then return M.run_chunk(code, true, self.capture) end
  local ok, f = pcall(target.submit, target, remote, code, self.capture or false)
  if not ok then
    self.target, self.target_name = nil, nil
    return tostring(f) .. "\n(back in the main state)"
  end
  if not self.wait(f) then
    return "interrupted: " .. target:name() .. " is still busy; its result will be dropped"
  end
  if f:is_success() then return f:result() end
  return "error: " .. tostring(f:cause())
end

-- Feed one line: returns the text to show ("" for none) and true to quit.
function Session:feed(line)
  if not self.buffer and line:match("^%s*:") then return self:command(line) end
  local src = self.buffer and (self.buffer .. "\n" .. line) or line
  local code = "return " .. src
  if not load(code, "=stdin") then
    code = src
    local f, err = load(src, "=stdin")
    if not f then
      if err:match("<eof>$") then
        self.buffer = src
        return ""
      end
      self.buffer = nil
      return err
    end
  end
  self.buffer = nil
  return self:evaluate(code)
end

local COMMANDS = { ":help", ":loop", ":loops", ":main", ":quit", ":reload", ":stats" }
local COMPLETE_WAIT = 1         -- seconds a completion waits for a busy state

local function remote_complete(word)
  local repl = require "netrun.repl"
  repl.expose()
  return repl.complete(word, _G)
end

-- Tab completion in the state being evaluated in (a loop's own globals
-- after :loop N); nothing when that state is too busy to answer.
function Session:complete(word)
  local target = self.target
  if not target and self.remote_main then target = core.main_loop() end
  if word:sub(1, 1) == ":" or not target then
    M.expose()
    return M.complete(word, _G)
  end
  local ok, f = pcall(target.submit, target, remote_complete, word)
  if not ok or not self.wait(f, COMPLETE_WAIT) or not f:is_success() then return {} end
  return f:result()
end

-- Tab completion: the words that complete `word` -- a REPL command, or a
-- path of names ("string.fo", "netrun.group", "t:ins") looked up in env
-- (the main state's globals). Keys are read with rawget: completing never
-- runs an __index metamethod.
function M.complete(word, env)
  local out = {}
  if word:sub(1, 1) == ":" then
    for _, c in ipairs(COMMANDS) do
      if c:sub(1, #word) == word then out[#out + 1] = c end
    end
    return out
  end
  local prefix, sep, partial = word:match("^(.*)([.:])([%w_]*)$")
  local t = env or _G
  if prefix then
    for name in prefix:gmatch("[^.:]+") do
      t = type(t) == "table" and rawget(t, name) or nil
      if t == nil then return out end
    end
    if type(t) ~= "table" then
      local mt = getmetatable(t)      -- strings and objects: their methods
      t = type(mt) == "table" and rawget(mt, "__index") or nil
      if type(t) ~= "table" then return out end
    end
  else
    prefix, sep, partial = "", "", word
  end
  for k, v in next, t do
    if type(k) == "string" and k:match("^[%a_][%w_]*$") and k:sub(1, #partial) == partial
        and (sep ~= ":" or type(v) == "function") then
      out[#out + 1] = prefix .. sep .. k
    end
  end
  table.sort(out)
  return out
end

-- Leaving the REPL ends the process's groups. A loop stuck in Lua never
-- terminates, and :quit must not hang on it. Each loop still running is
-- sent an empty task, again whenever it has run the last: a loop merely
-- waiting (a lingering close) runs it, a stuck one never does. Once no
-- loop still running has run its task for STUCK_AFTER seconds (or after
-- QUIT_WAIT in all), name them and leave the process at once. (A loop's
-- stats are not read: their Lua memory comes from a state that a loop
-- ending meanwhile frees.)
local SHUTDOWN_TIMEOUT, STUCK_AFTER, QUIT_WAIT = 5, 1, 6

local function ping() end

local function end_groups()
  core.shutdown_all(0, SHUTDOWN_TIMEOUT)
  local deadline, probes = core.now() + QUIT_WAIT, {}
  while true do
    local running, stuck, now = {}, {}, core.now()
    for i, l in ipairs(M.all_loops()) do
      if not l:is_terminated() then
        running[#running + 1] = l
        local probe = probes[i]
        if not probe or not probe.f or probe.f:is_done() then
          local ok, f = pcall(l.submit, l, ping)   -- refused: the loop is ending
          probes[i] = { f = ok and f or nil, since = now }
        elseif now - probe.since >= STUCK_AFTER then
          stuck[#stuck + 1] = l:name()
        end
      end
    end
    if #running == 0 then return end
    local gave_up = #stuck == #running or now >= deadline
    if gave_up or core.repl_wait(running[1]:termination_future(), 0.05) == false then
      if #stuck == 0 then
        for _, l in ipairs(running) do stuck[#stuck + 1] = l:name() end
      end
      io.stderr:write("netrun: leaving without waiting for ", table.concat(stuck, ", "),
        gave_up and " (still running Lua code: stuck?)\n" or "\n")
      core.exit_now(0)
    end
  end
end

-- The terminal REPL (`netrun`, `netrun -i`). Prompts only on a terminal.
-- Ctrl-C at the prompt discards the line (and an incomplete chunk).
function M.run()
  local tty = core.isatty(0)
  core.repl_mode(true)
  local s = M.session { wait = function(f, secs) return core.repl_wait(f, secs) end }
  if tty then io.write("netrun ", netrun.version, " (", _VERSION, ") -- :help for commands\n") end
  local function completer(word) return s:complete(word) end
  while true do
    local line = core.readline(tty and s:prompt() or "", completer)
    if line == false then
      s:cancel()
      if tty then io.write("^C\n") end
    elseif not line then
      if tty then io.write("\n") end
      break
    else
      local out, quit = s:feed(line)
      if out ~= "" then io.write(out, "\n") end
      io.flush()
      if quit then break end
    end
  end
  io.flush()
  end_groups()
  core.repl_mode(false)
end

-- ---- `netrun attach PATH`: the same REPL against a live process --------

local inbox = { data = "", skip = 0 }

-- Runs in the main state: bytes from the console connection.
function M._attach_feed(data, closed)
  inbox.data = inbox.data .. (data or "")
  inbox.closed = inbox.closed or closed
  if inbox.waiting and (inbox.data:find(M.PROMPT_MARK, 1, true) or inbox.closed) then
    local p = inbox.waiting
    inbox.waiting = nil
    p:try_success(true)
  end
end

function M._attach_refused(uid)
  inbox.refused = uid
  M._attach_feed(nil, true)
end

local function take_response()
  local text, prompt, rest = inbox.data:match("^(.-)" .. M.PROMPT_MARK .. "([^\n]*)\n(.*)$")
  if text then inbox.data = rest end
  return text, prompt
end

-- What a console sends is shown, not obeyed: control characters (escape
-- sequences that retitle, recolour or rewrite the terminal) are written
-- as \ddd, like %q; newlines and tabs pass.
function M.printable(s)
  return (s:gsub("[%c\127]", function(c)
    if c == "\n" or c == "\t" then return c end
    return string.format("\\%03d", c:byte())
  end))
end

-- Wait for the next response (those given up on are skipped): its text and
-- the next prompt; all that is left and no prompt once the connection has
-- closed; nil, "interrupted" on Ctrl-C or nil, "timeout" after secs.
local function next_response(secs)
  while true do
    local text, prompt = take_response()
    if text and inbox.skip > 0 then
      inbox.skip = inbox.skip - 1
    elseif text then
      return text, prompt
    elseif inbox.closed then
      local all = inbox.data
      inbox.data = ""
      return all, nil
    else
      inbox.waiting = netrun.promise()
      local done = core.repl_wait(inbox.waiting, secs)
      if not done then
        inbox.waiting = nil
        return nil, done == false and "interrupted" or "timeout"
      end
    end
  end
end

-- "netrun attach: /x.sock: No such file or directory (is the server ...?)"
local function connect_error(path, err, what)
  local code, desc = tostring(err):match("(E[%u%d]+): ([^\n]*)")
  local msg = desc and (desc:sub(1, 1):upper() .. desc:sub(2)) or tostring(err):match("[^\n]*")
  local hint = ""
  if code == "ENOENT" or code == "ECONNREFUSED" then
    hint = " (is the server running with --console " .. path .. "?)"
  end
  return (what or "netrun attach") .. ": " .. path .. ": " .. msg .. hint
end

-- The attach connection's handler, on the attach loop: everything goes
-- to the main state, where the REPL runs.
local function client_handler()
  local main = core.main_loop()
  return {
    channel_read = function(self, ctx, msg)
      main:execute(function(d) require("netrun.repl")._attach_feed(d) end, msg)
    end,
    -- Only a console of our own user: a socket somebody else listens on
    -- would see every line typed, and answer what it likes. Checked here,
    -- while the socket is surely open, before anything is read or sent.
    channel_active = function(self, ctx)
      local _, uid = core.peer_credentials(ctx.channel)
      if uid ~= core.getuid() then
        main:execute(function(u) require("netrun.repl")._attach_refused(u) end, uid)
        ctx:close()
      end
    end,
    channel_inactive = function(self, ctx)
      main:execute(function() require("netrun.repl")._attach_feed(nil, true) end)
      core.repl_hangup()               -- a line being read ends now
    end,
  }
end

-- What the terminal asks of the server: answer() waits for the response
-- to a line sent (Ctrl-C asks the server to abandon its wait on a busy
-- loop; a second one stops waiting here); complete(word) asks for the
-- names of the state being evaluated in.
local function server_link(ch)
  local r = { last_prompt = "netrun> " }
  function r.send(line) ch:write_and_flush(line .. "\n") end

  function r.answer()
    local text, why = next_response()
    if text then return text, why end
    r.send(M.INTERRUPT)
    text, why = next_response()
    if text then return text, why end
    inbox.skip = inbox.skip + 1
    return "interrupted: no answer from the server yet\n", r.last_prompt
  end

  function r.complete(word)
    if word:sub(1, 1) == ":" then return M.complete(word) end
    r.send(M.CONTROL .. "complete " .. word)
    local text = next_response(COMPLETE_WAIT + 1)
    if not text then
      r.send(M.INTERRUPT)
      inbox.skip = inbox.skip + 1
      return {}
    end
    local out = {}
    for w in text:gmatch("[^\n]+") do
      if not w:find("[%c\127]") then out[#out + 1] = w end
    end
    return out
  end
  return r
end

-- The session on the terminal; returns the exit status: 0 after :quit or
-- end of input, 1 when the server goes away.
local function attached(path, r)
  local tty = core.isatty(0)
  local quitting = false
  local text, prompt = r.answer()
  while true do
    if inbox.refused then
      error(string.format("netrun attach: %s: the process listening there runs as uid %s, "
        .. "not as you (uid %d); not attaching", path, tostring(inbox.refused), core.getuid()), 0)
    end
    if text ~= "" then io.write(M.printable(text)) end
    io.flush()
    if not prompt then
      if quitting then return 0 end
      io.write("connection closed by the server\n")
      return 1
    end
    r.last_prompt = prompt
    local line, why = core.readline(tty and M.printable(prompt) or "", r.complete)
    if line == false then              -- Ctrl-C: the server drops its chunk too
      if tty then io.write("^C\n") end
      r.send(M.CONTROL .. "cancel")
      text, prompt = r.answer()
    elseif line then
      quitting = line:match("^%s*:q%s*$") or line:match("^%s*:quit%s*$")
      r.send(line)
      text, prompt = r.answer()
    elseif why == "closed" then        -- what the server said last, if anything
      if tty then io.write("\n") end
      repeat text, prompt = next_response() until text
    else
      return 0
    end
  end
end

-- A console connection for a command other than attach (`netrun reload`,
-- `netrun top`): returns a link -- send(line), response(secs) (text and
-- next prompt; the text left and no prompt once closed; nil, "timeout"
-- or "interrupted"), close() -- with the greeting read, or nil and a
-- message for stderr.
function M.open_console(path, what)
  local group = netrun.group { threads = 1, name = "attach" }
  local ok, ch = pcall(function()
    return netrun.connect { group = group, unix = path, timeout = 5,
      init = function(c) c:pipeline():add_last("client", client_handler()) end }:sync()
  end)
  if not ok then
    group:shutdown_gracefully(0, 1):sync()
    return nil, connect_error(path, ch, what)
  end
  local r = server_link(ch)
  r.response = next_response
  function r.close()
    ch:close():sync()
    group:shutdown_gracefully(0, 1):sync()
  end
  local text, prompt = next_response(5)
  if inbox.refused or not prompt then
    r.close()
    return nil, string.format("%s: %s: %s", what, path, inbox.refused
      and ("the process listening there runs as uid " .. tostring(inbox.refused) .. ", not as you")
      or ("no console answered" .. (text and text ~= "" and (": " .. text) or "")))
  end
  return r
end

-- `netrun reload PATH`: 0 when the reload succeeded, 1 (the reason on
-- stderr) when a module failed to load or the console could not be used.
function M.reload_command(path)
  local r, err = M.open_console(path, "netrun reload")
  if not r then
    io.stderr:write(err, "\n")
    return 1
  end
  r.send(":reload")
  local text = r.response(60)
  r.close()
  text = M.printable((text or "no answer within 60 s"):gsub("\n$", ""))
  if text:match("^reload ok") then
    io.write(text, "\n")
    return 0
  end
  io.stderr:write("netrun reload: ", text, "\n")
  return 1
end

-- `netrun attach PATH`: returns the exit status (1 if it cannot connect).
function M.attach(path)
  local group = netrun.group { threads = 1, name = "attach" }
  local ok, ch = pcall(function()
    return netrun.connect { group = group, unix = path, timeout = 5,
      init = function(c) c:pipeline():add_last("client", client_handler()) end }:sync()
  end)
  if not ok then
    group:shutdown_gracefully(0, 1):sync()
    io.stderr:write(connect_error(path, ch), "\n")
    return 1
  end
  core.repl_mode(true)
  local done, status = pcall(attached, path, server_link(ch))
  core.repl_mode(false)
  ch:close():sync()
  group:shutdown_gracefully(0, 1):sync()
  if not done then error(status, 0) end
  return status
end

return M
