-- netrun.repl -- the REPL: a session turns one line into (output, next
-- prompt), evaluating in the main state or inside any loop's own state.
-- The same session serves the terminal (netrun, netrun -i), and the
-- console socket (netrun --console PATH, netrun attach PATH).
local netrun = require "netrun"
local core = require "netrun.core"
local pretty = require "netrun.pretty"

local M = {}

M.PROMPT_MARK = "\1"    -- console protocol: "\1<prompt>\n" ends a response

local HELP = [[
  expressions print their values; statements run; globals persist per state
  :loops           every loop of the process, with its stats
  :loop N | NAME   evaluate what follows inside that loop's own Lua state
  :main            evaluate in the main state again
  :help            this text
  :quit            leave (Ctrl-D too); Ctrl-C abandons a wait on a busy loop]]

-- Run compiled source here; returns the text to show.
function M.run_chunk(code, interruptible)
  local f, err = load(code, "=stdin")
  if not f then return err end
  if interruptible then
    debug.sethook(function()
      if core.interrupted() then error("interrupted", 2) end
    end, "", 10000)
  end
  local r = table.pack(xpcall(f, debug.traceback))
  if interruptible then debug.sethook() end
  if not r[1] then     -- the traceback ends where the REPL's own frames begin
    return (tostring(r[2]):gsub("\n%s*%[C%]: in function 'xpcall'.*$", ""))
  end
  return pretty.values(r, 2)
end

-- Every loop of the process, in group order.
function M.all_loops()
  local loops = {}
  for _, g in ipairs(netrun.groups()) do
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

local Session = {}
Session.__index = Session

-- opts.wait(future) -> true when done, false when abandoned (Ctrl-C).
-- opts.remote_main: evaluate "main" through the main loop (the console).
function M.session(opts)
  return setmetatable({ wait = opts.wait, remote_main = opts.remote_main }, Session)
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

local function remote(code)
  return require("netrun.repl").run_chunk(code)
end

function Session:evaluate(code)
  local target = self.target
  if not target and self.remote_main then target = core.main_loop() end
  if not target then return M.run_chunk(code, true) end
  local ok, f = pcall(target.submit, target, remote, code)
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

local COMMANDS = { ":help", ":loop", ":loops", ":main", ":quit" }

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

-- The terminal REPL (`netrun`, `netrun -i`). Prompts only on a terminal.
function M.run()
  local tty = core.isatty(0)
  core.repl_mode(true)
  local s = M.session { wait = function(f) return core.repl_wait(f) end }
  if tty then io.write("netrun ", netrun.version, " (", _VERSION, ") -- :help for commands\n") end
  local function completer(word) return M.complete(word, _G) end
  while true do
    local line = core.readline(tty and s:prompt() or "", completer)
    if not line then break end
    local out, quit = s:feed(line)
    if out ~= "" then io.write(out, "\n") end
    io.flush()
    if quit then break end
  end
  if tty then io.write("\n") end
  core.repl_mode(false)
  core.shutdown_all(0, 5)      -- leaving the REPL ends the process's groups
end

-- ---- `netrun attach PATH`: the same REPL against a live process --------

local inbox = { data = "" }

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

-- Wait for one response: returns its text and the next prompt (nil: closed).
local function next_response()
  if not (inbox.data:find(M.PROMPT_MARK, 1, true) or inbox.closed) then
    inbox.waiting = netrun.promise()
    core.repl_wait(inbox.waiting)
  end
  local text, prompt, rest = inbox.data:match("^(.-)" .. M.PROMPT_MARK .. "([^\n]*)\n(.*)$")
  if not text then
    local all = inbox.data
    inbox.data = ""
    return all, nil
  end
  inbox.data = rest
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

function M.attach(path)
  local group = netrun.group { threads = 1, name = "attach" }
  local main = core.main_loop()
  local Client = {
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
    end,
  }
  local ok, ch = pcall(function()
    return netrun.connect { group = group, unix = path, timeout = 5,
      init = function(c) c:pipeline():add_last("client", Client) end }:sync()
  end)
  if not ok then
    group:shutdown_gracefully(0, 1):sync()
    error("netrun attach: " .. tostring(ch), 0)
  end

  core.repl_mode(true)
  local tty = core.isatty(0)
  while true do
    local text, prompt = next_response()
    if inbox.refused then
      group:shutdown_gracefully(0, 1):sync()
      error(string.format("netrun attach: %s: the process listening there runs as uid %s, "
        .. "not as you (uid %d); not attaching", path, tostring(inbox.refused), core.getuid()), 0)
    end
    if text ~= "" then io.write(M.printable(text)) end
    io.flush()
    if not prompt then break end
    local line = core.readline(tty and M.printable(prompt) or "",
      function(word) return M.complete(word, _G) end)
    if not line then break end
    ch:write_and_flush(line .. "\n")
  end
  core.repl_mode(false)
  ch:close():sync()
  group:shutdown_gracefully(0, 1):sync()
end

return M
