-- netrun.console -- the console socket of `netrun --console PATH`: a unix
-- socket (created with mode 0600, peers of another uid refused by
-- SO_PEERCRED; only a stale socket at the path is replaced) on which
-- each connection gets a REPL session. The sessions run on a daemon loop of
-- their own, which never keeps the process alive.
local netrun = require "netrun"
local core = require "netrun.core"

local M = {}

function M.listen(path)
  local group = netrun.group { threads = 1, name = "console", daemon = true }
  local ok, server = pcall(function()
    return netrun.server {
      group = group, unix = path, mode = tonumber("600", 8),   -- born 0600
      metrics = false,                   -- not one of the program's servers
      init = function(ch) require("netrun.console").accept(ch) end,
    }:sync()
  end)
  if not ok then
    group:shutdown_gracefully(0, 1)
    error(server, 0)
  end
  netrun.log.info("console listening on %s", path)
  return server
end

local Console = {}

local function respond(ctx, text, prompt)
  local repl = require "netrun.repl"
  if text ~= "" and not text:match("\n$") then text = text .. "\n" end
  ctx:write_and_flush(text .. repl.PROMPT_MARK .. prompt .. "\n")
end

-- A session's waits end when the work is done or when the client's
-- INTERRUPT line abandons them by cancelling the future (st.interrupted:
-- for the line in progress); the work goes on, its result is dropped.
local function waiter(st)
  return function(f)
    if st.interrupted then f:cancel() end
    st.waiting = f
    pcall(f.await, f)
    st.waiting = nil
    return not f:is_cancelled()
  end
end

function Console:channel_active(ctx)
  local repl = require "netrun.repl"
  local st = { buffer = "", lines = {} }
  st.session = repl.session { remote_main = true, capture = true, wait = waiter(st) }
  ctx.channel:attr("console", st)
  respond(ctx, "netrun " .. netrun.version .. " console of pid " .. tostring(core.getpid and core.getpid() or "?")
    .. " -- :help for commands", st.session:prompt())
end

-- A client's own request (repl.CONTROL): completions or a cancel.
local function control(session, line)
  local word = line:match("^.complete (.*)$")
  if word then return table.concat(session:complete(word), "\n") end
  if line == require("netrun.repl").CONTROL .. "cancel" then session:cancel() end
  return ""
end

-- Lines are handled one at a time, in a coroutine, so an evaluation that
-- waits on another loop parks here instead of blocking the console loop.
local function drain(ctx, st)
  st.busy = true
  local CONTROL = require("netrun.repl").CONTROL
  netrun.spawn(function()
    while #st.lines > 0 do
      local line = table.remove(st.lines, 1)
      local handle = line:sub(1, 1) == CONTROL and control or st.session.feed
      local ok, out, quit = pcall(handle, st.session, line)
      st.interrupted = false
      if not ok then out = "console error: " .. tostring(out) end
      if not ctx.channel:is_open() then break end
      if quit then
        ctx:write_and_flush("bye\n")
        ctx:close()
        break
      end
      respond(ctx, out, st.session:prompt())
    end
    st.busy = false
  end)
end

function Console:channel_read(ctx, msg)
  local st = ctx.channel:attr("console")
  st.buffer = st.buffer .. msg
  if #st.buffer > 1 << 20 then
    netrun.log.warn("console: a line longer than 1 MiB; closing the session")
    ctx:close()
    return
  end
  local INTERRUPT = require("netrun.repl").INTERRUPT
  for line in st.buffer:gmatch("([^\n]*)\n") do
    line = line:gsub("\r$", "")
    if line ~= INTERRUPT then
      st.lines[#st.lines + 1] = line
    elseif st.busy or #st.lines > 0 then   -- Ctrl-C: stop waiting for a line
      st.interrupted = true
      if st.waiting then st.waiting:cancel() end
    end
  end
  st.buffer = st.buffer:match("[^\n]*$")
  if not st.busy and #st.lines > 0 then drain(ctx, st) end
end

function Console:exception_caught(ctx, err)
  netrun.log.warn("console: %s", err)
  ctx:close()
end

-- On the console loop, for each connection: only the same uid may talk.
function M.accept(ch)
  local _, uid = core.peer_credentials(ch)
  if uid ~= core.getuid() then
    netrun.log.warn("console: refused a peer of uid %s", tostring(uid))
    ch:write_and_flush("refused: this console belongs to another user\n")
    ch:close()
    return
  end
  ch:pipeline():add_last("console", Console)
end

return M
