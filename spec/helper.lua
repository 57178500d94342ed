-- spec/helper.lua -- shared by the busted specs: finds the module (source
-- tree and build directory), and offers small helpers built on futures and
-- LuaSocket, the independent client.
local build = os.getenv("NETRUN_BUILD") or "build"
local root = debug.getinfo(1, "S").source:match("^@(.*)/spec/helper%.lua$") or "."
package.path = root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;" .. root
  .. "/spec/fixtures/?.lua;" .. package.path
package.cpath = build .. "/lib/?.so;" .. package.cpath

local netrun = require "netrun"
local socket = require "socket"

local H = { netrun = netrun, socket = socket, root = root, build = build }

-- Whether the specs run under the fault shim (spec/fault, the lua-fault/
-- ctest tests). A spec whose client pipelines requests behind one whose
-- answer closes the connection cannot pass there: the shim delays the
-- client's later bytes past the server's close, which the kernel answers
-- with a reset that may destroy the answers (a close with unread input).
-- Such a spec is declared with `(H.faults and pending or it)`.
H.faults = (os.getenv("NETRUN_FAULT") or "") ~= ""

-- A LuaSocket client with a timeout, so a broken server fails the test
-- instead of hanging it.
function H.client(port, host)
  local c = assert(socket.tcp())
  c:settimeout(5)
  assert(c:connect(host or "127.0.0.1", port))
  return c
end

-- Read exactly n bytes.
function H.recv(c, n)
  local data, err, partial = c:receive(n)
  assert(data, "receive failed: " .. tostring(err) .. " after " .. #(partial or "") .. " bytes")
  return data
end

-- Read one response from a raw connection: status, headers, body (none
-- for the answer to HEAD).
function H.read_response(c, head)
  local line = assert(c:receive("*l"))
  local status = tonumber(line:match("^HTTP/1%.1 (%d%d%d) "))
  assert(status, "bad status line: " .. line)
  local headers = {}
  while true do
    local l = assert(c:receive("*l"))
    if l == "" then break end
    local k, v = l:match("^([^:]+):%s*(.*)$")
    headers[k:lower()] = v
  end
  local body = ""
  if head then
    body = ""
  elseif headers["content-length"] then
    body = H.recv(c, tonumber(headers["content-length"]))
  elseif headers["transfer-encoding"] == "chunked" then
    local parts = {}
    while true do
      local size = tonumber(assert(c:receive("*l")), 16)
      if size == 0 then assert(c:receive("*l")) break end
      parts[#parts + 1] = H.recv(c, size)
      assert(c:receive("*l") == "")
    end
    body = table.concat(parts)
  end
  return status, headers, body, line
end

-- Shut a group down and wait for it (every spec ends this way).
function H.shutdown(group)
  group:shutdown_gracefully(0, 5):sync()
  assert(group:is_terminated())
end

-- An echo server on an ephemeral port; returns the server channel and port.
function H.echo_server(group, handler)
  local Echo = handler or {
    channel_read = function(self, ctx, msg) ctx:write(msg) end,
    channel_read_complete = function(self, ctx) ctx:flush() end,
  }
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0,
    init = function(ch) ch:pipeline():add_last("echo", Echo) end,
  }:sync()
  local _, port = server:local_address()
  return server, port
end

-- A daemon group for the helpers' own timers: it does not keep the
-- process alive and is shut down with everything else at exit.
local timers
local function timer_group()
  timers = timers or netrun.group { threads = 1, name = "spec-timer", daemon = true }
  return timers
end

-- f:sync() bounded in time: past `timeout` seconds (default 10) the future
-- is failed, so a missing completion fails the test instead of hanging it.
function H.sync(f, timeout)
  local t = timer_group():schedule(timeout or 10, function(ff, s)
    ff:try_failure(string.format("timed out after %g s", s))
  end, f, timeout or 10)
  local ok, v = pcall(f.sync, f)
  t:cancel()
  if not ok then error(v, 2) end
  return v
end

-- Run fn(...) in a coroutine (netrun.spawn) on loop; returns its result,
-- bounded (`timeout` seconds, default 30).
function H.on_loop(loop, fn, ...)
  local spawned = H.sync(loop:submit(function(f, ...)
    return netrun.spawn(f, ...)
  end, fn, ...))
  return H.sync(spawned, 30)
end

-- Poll pred() until it holds or `timeout` seconds pass, waiting on a
-- scheduled task between tries (never a bare sleep); returns pred's value.
function H.eventually(pred, timeout, step)
  local deadline = socket.gettime() + (timeout or 5)
  repeat
    local v = pred()
    if v then return v end
    timer_group():schedule(step or 0.01, function() end):sync()
  until socket.gettime() > deadline
  return pred()
end

-- A server that stopped serving a peer which reads nothing: poll (bounded)
-- until `probe`, run on `loop`, returns the same value twice in a row (it
-- returns nil while the server is still going); returns that value.
function H.stalled(loop, probe, timeout)
  local function once() return loop:submit(probe):sync() end
  return H.eventually(function()
    local a = once()
    return a ~= nil and a == once() and a
  end, timeout or 10)
end

-- ---- processes: the netrun binary, examples run as users run them ------

H.BIN = os.getenv("NETRUN_BIN") or (build .. "/bin/netrun")

-- Run a shell command; returns its output (stderr included) and status.
function H.run(cmd)
  local f = assert(io.popen(cmd .. " 2>&1; echo \"::status=$?\""))
  local out = f:read("a")
  f:close()
  return (out:gsub("::status=%d+%s*$", "")), tonumber(out:match("::status=(%d+)%s*$"))
end

-- A port nobody listens on (bound and released).
function H.free_port()
  local s = assert(socket.bind("127.0.0.1", 0))
  local _, port = s:getsockname()
  s:close()
  return tonumber(port)
end

-- Start `netrun script --port N [args]` in the background and wait
-- (bounded) until it logs that it listens on N: probing with a connection
-- would disturb some servers (the chat room). Returns its pid and log file.
-- `prefix` runs it through a command that execs it (`setsid`: no
-- controlling terminal, as a service).
function H.start(script, port, args, prefix)
  local log = os.tmpname()
  local f = assert(io.popen(string.format("%s %s %s --port %d %s > %s 2>&1 & echo $!",
    prefix or "", H.BIN, script, port, args or "", log)))
  local pid = tonumber(f:read("l"))
  f:close()
  local deadline = socket.gettime() + 10
  repeat
    local lf = io.open(log)
    local text = lf and lf:read("a") or ""
    if lf then lf:close() end
    if text:find(":" .. port, 1, true) then return pid, log end
    socket.select(nil, nil, 0.02)
  until socket.gettime() > deadline
  os.execute("kill -KILL " .. pid)
  error(script .. " never listened on " .. port)
end

-- Whether process pid still runs. A started process is nobody's child
-- here (its shell exited), so once it exits it may stay a zombie until
-- init reaps it: a zombie counts as gone.
function H.alive(pid)
  local f = io.open("/proc/" .. pid .. "/stat")
  if not f then return false end
  local stat = f:read("a") or ""
  f:close()
  local state = stat:match("^%d+ %b() (%a)")
  return state ~= nil and state ~= "Z"
end

-- SIGTERM a started process and wait (bounded) until it is gone; true if
-- it exited in time.
function H.stop(pid)
  os.execute("kill -TERM " .. pid)
  local deadline = socket.gettime() + 10
  while H.alive(pid) do
    if socket.gettime() > deadline then return false end
    socket.select(nil, nil, 0.02)
  end
  return true
end

-- Under a sanitizer (ASan keeps freed memory in quarantine) RSS says
-- nothing of what a program holds: specs skip their RSS bounds there.
H.sanitized = os.getenv("NETRUN_SANITIZED") ~= nil

-- Resident memory of a process in KiB, from /proc/PID/status (this
-- process when pid is nil).
function H.rss(pid)
  local f = assert(io.open("/proc/" .. (pid or "self") .. "/status"))
  local kb = tonumber(f:read("a"):match("VmRSS:%s*(%d+)"))
  f:close()
  return kb
end

-- Send `chunk` over c until the peer stops taking it (a send times out
-- after c's timeout) or `limit` bytes went; returns the bytes sent.
function H.flood(c, chunk, limit)
  local sent = 0
  while sent < limit do
    local n, err, partial = c:send(chunk)
    if not n then
      sent = sent + (partial or 0)
      assert(err == "timeout", "send failed: " .. tostring(err))
      break
    end
    sent = sent + n
  end
  return sent
end

-- A file's text ("" if it cannot be read: a log not written yet).
function H.read_file(path)
  local f = io.open(path)
  if not f then return "" end
  local s = f:read("a")
  f:close()
  return s
end

function H.tmpdir()
  local p = os.tmpname()
  os.remove(p)
  assert(os.execute("mkdir -p " .. p))
  return p
end

return H
