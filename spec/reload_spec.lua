-- reload_spec.lua -- hot reload (DESIGN.md §8.5): changed modules are
-- re-required in every state, all or nothing; new connections get the new
-- code, live ones keep theirs; server:set_init; SIGHUP and `netrun reload`.
local H = require "spec.helper"
local netrun = H.netrun
local socket = H.socket

local dir = H.tmpdir()
package.path = dir .. "/?.lua;" .. package.path

-- Write a module file by rename (a new inode: a stamp differs even within
-- one mtime tick).
local function write_module(name, text)
  local tmp = dir .. "/." .. name .. ".tmp"
  local f = assert(io.open(tmp, "w"))
  f:write(text)
  f:close()
  assert(os.rename(tmp, dir .. "/" .. name .. ".lua"))
end

-- A module whose handler answers "<version>:<line>".
local function version_module(name, version, extra)
  write_module(name, string.format([[
local M = { version = %q }
%s
M.Handler = {}
function M.Handler:channel_read(ctx, msg) ctx:write_and_flush(M.version .. ":" .. msg .. "\n") end
return M
]], version, extra or ""))
end

local function ask(c, line)
  assert(c:send(line .. "\n"))
  return assert(c:receive("*l"))
end

local function line_server(group, init)
  local s = netrun.server { group = group, host = "127.0.0.1", port = 0, init = init }:sync()
  local _, port = s:local_address()
  return s, port
end

describe("netrun.reload", function()
  local group
  before_each(function() group = netrun.group { threads = 2, name = "reload" } end)
  after_each(function() H.shutdown(group) end)

  it("gives new connections the new code while a connection held open keeps the old", function()
    version_module("rl_app", "v1")
    local app = require "rl_app"
    local s, port = line_server(group, function(ch)
      ch:pipeline():add_last("line", netrun.codec.line {})
      ch:pipeline():add_last("app", app.Handler)
    end)
    -- one connection per loop, so both loops cached the unpacked init
    local old1, old2 = H.client(port), H.client(port)
    assert.equal("v1:a", ask(old1, "a"))
    assert.equal("v1:b", ask(old2, "b"))
    version_module("rl_app", "v2")
    local r = netrun.reload():sync()
    assert.same({ "rl_app" }, r.modules)
    assert.equal("v2", require("rl_app").version)
    for i = 1, 4 do
      local c = H.client(port)
      assert.equal("v2:new" .. i, ask(c, "new" .. i))
      c:close()
    end
    assert.equal("v1:still", ask(old1, "still"))
    assert.equal("v1:here", ask(old2, "here"))
    old1:close()
    old2:close()
    s:close():sync()
  end)

  it("finds a module that only the loops required", function()
    version_module("rl_loop_only", "v1")
    local s, port = line_server(group, function(ch)
      ch:pipeline():add_last("line", netrun.codec.line {})
      ch:pipeline():add_last("app", require("rl_loop_only").Handler)
    end)
    local c = H.client(port)
    assert.equal("v1:x", ask(c, "x"))
    assert.is_nil(package.loaded.rl_loop_only)
    version_module("rl_loop_only", "v2")
    assert.same({ "rl_loop_only" }, netrun.reload():sync().modules)
    local c2 = H.client(port)
    assert.equal("v2:y", ask(c2, "y"))
    assert.equal("v1:z", ask(c, "z"))
    c:close()
    c2:close()
    s:close():sync()
  end)

  it("keeps the old code everywhere when a module has a syntax error, and says why", function()
    version_module("rl_bad", "v1")
    local bad = require "rl_bad"
    local s, port = line_server(group, function(ch)
      ch:pipeline():add_last("line", netrun.codec.line {})
      ch:pipeline():add_last("app", bad.Handler)
    end)
    local held = { H.client(port), H.client(port) }     -- both loops load it
    for _, c in ipairs(held) do assert.equal("v1:x", ask(c, "x")) end
    write_module("rl_bad", "local M = {\nreturn M\n")
    local f = netrun.reload()
    assert.is_false(pcall(f.sync, f))
    local why = tostring(f:cause())
    assert.matches("rl_bad%.lua:2: unexpected symbol", why)
    assert.matches("%(in main, reload%-%d, reload%-%d%)$", why)
    for _, c in ipairs(held) do
      assert.equal("v1:y", ask(c, "y"))
      c:close()
    end
    assert.equal("v1", require("rl_bad").version)
    local c = H.client(port)
    assert.equal("v1:x", ask(c, "x"))
    c:close()
    -- fixed, it loads
    version_module("rl_bad", "v3")
    assert.same({ "rl_bad" }, netrun.reload():sync().modules)
    c = H.client(port)
    assert.equal("v3:x", ask(c, "x"))
    c:close()
    s:close():sync()
  end)

  it("keeps the old code in every state when loading fails in only some of them", function()
    version_module("rl_half", "v1")
    local half = require "rl_half"
    local s, port = line_server(group, function(ch)
      ch:pipeline():add_last("line", netrun.codec.line {})
      ch:pipeline():add_last("app", half.Handler)
    end)
    local held = { H.client(port), H.client(port) }     -- both loops load it
    for _, c in ipairs(held) do assert.equal("v1:x", ask(c, "x")) end
    -- loads in the main state, raises in the loops' states
    version_module("rl_half", "v2", 'if require("netrun").current() then error("no database on this loop") end')
    local f = netrun.reload()
    assert.is_false(pcall(f.sync, f))
    assert.matches("module 'rl_half': .*no database on this loop", tostring(f:cause()))
    assert.equal("v1", require("rl_half").version)     -- the main state kept it too
    for i = 1, 4 do
      local c = H.client(port)
      assert.equal("v1:" .. i, ask(c, tostring(i)))
      c:close()
    end
    for _, c in ipairs(held) do c:close() end
    s:close():sync()
  end)

  it("says when no module changed", function()
    pcall(function() netrun.reload():sync() end)   -- whatever earlier tests left
    local r = netrun.reload():sync()
    assert.same({}, r.modules)
  end)
end)

describe("server:set_init", function()
  local group
  before_each(function() group = netrun.group { threads = 2, name = "setinit" } end)
  after_each(function() H.shutdown(group) end)

  it("gives channels accepted afterwards the new init, and keeps the live ones", function()
    local Old = { channel_read = function(_, ctx, msg) ctx:write_and_flush("old:" .. msg .. "\n") end }
    local New = { channel_read = function(_, ctx, msg) ctx:write_and_flush("new:" .. msg .. "\n") end }
    local s, port = line_server(group, function(ch)
      ch:pipeline():add_last("line", netrun.codec.line {})
      ch:pipeline():add_last("h", Old)
    end)
    local live = { H.client(port), H.client(port) }
    for i, c in ipairs(live) do assert.equal("old:" .. i, ask(c, tostring(i))) end
    s:set_init(function(ch)
      ch:pipeline():add_last("line", netrun.codec.line {})
      ch:pipeline():add_last("h", New)
    end)
    for i = 1, 4 do
      local c = H.client(port)
      assert.equal("new:" .. i, ask(c, tostring(i)))
      c:close()
    end
    for i, c in ipairs(live) do
      assert.equal("old:" .. i, ask(c, tostring(i)))
      c:close()
    end
    s:close():sync()
  end)

  it("refuses a channel that is not a server with an init", function()
    local s = netrun.server { group = group, host = "127.0.0.1", port = 0 }:sync()
    assert.has_error(function() s:set_init(function() end) end)
    s:close():sync()
  end)
end)

describe("a live process", function()
  local BIN = H.BIN
  local pdir, path, pid, log, port

  local function module_file(text)
    local tmp = pdir .. "/.rl_proc.tmp"
    local f = assert(io.open(tmp, "w"))
    f:write(text)
    f:close()
    assert(os.rename(tmp, pdir .. "/rl_proc.lua"))
  end

  local function version(v)
    module_file(string.format([[
local M = { Handler = {} }
function M.Handler:channel_read(ctx, msg) ctx:write_and_flush(%q .. ":" .. msg .. "\n") end
return M
]], v))
  end

  setup(function()
    pdir = H.tmpdir()
    path = pdir .. "/console.sock"
    version("v1")
    local f = assert(io.open(pdir .. "/server.lua", "w"))
    f:write([[
local netrun = require "netrun"
local app = require "rl_proc"
local port = netrun.option("port", 0)
netrun.server { group = netrun.group { threads = 2, name = "w" }, host = "127.0.0.1", port = port,
  init = function(ch)
    ch:pipeline():add_last("line", netrun.codec.line {})
    ch:pipeline():add_last("app", app.Handler)
  end }:sync()
netrun.log.info("listening on :%d", port)
]])
    f:close()
    port = H.free_port()
    -- setsid: no controlling terminal, as a service (in a terminal a
    -- hangup stops netrun instead: signals_spec)
    pid, log = H.start("--console " .. path .. " " .. pdir .. "/server.lua", port, nil, "setsid")
  end)
  teardown(function()
    if pid then H.stop(pid) end
    os.execute("rm -rf " .. pdir)
  end)

  local function reload_cmd()
    return H.run(BIN .. " reload " .. path)
  end

  it("netrun reload exits 0 and new clients get the new code, a held one the old", function()
    local held = H.client(port)
    assert.equal("v1:a", ask(held, "a"))
    version("v2")
    local out, st = reload_cmd()
    assert.equal(0, st, out)
    assert.equal("reload ok: rl_proc\n", out)
    local c = H.client(port)
    assert.equal("v2:b", ask(c, "b"))
    c:close()
    assert.equal("v1:c", ask(held, "c"))
    held:close()
  end)

  it("netrun reload exits non-zero with the message on a syntax error, the old code serving", function()
    module_file("local M = {\n")
    local out, st = reload_cmd()
    assert.equal(1, st)
    assert.matches("^netrun reload: reload failed: .*rl_proc%.lua:2: unexpected symbol near <eof> %(in main", out)
    local c = H.client(port)
    assert.equal("v2:x", ask(c, "x"))
    c:close()
  end)

  it("netrun reload exits non-zero with the message on an error at load, the old code serving", function()
    module_file('error("cannot reach the database")\n')
    local out, st = reload_cmd()
    assert.equal(1, st)
    assert.matches("reload failed: .*module 'rl_proc': .*cannot reach the database", out)
    assert.matches("failed, the old code keeps serving: .*cannot reach the database", H.read_file(log))
    local c = H.client(port)
    assert.equal("v2:x", ask(c, "x"))
    c:close()
  end)

  it("reloads on SIGHUP", function()
    version("v-hup")
    os.execute("kill -HUP " .. pid)
    assert(H.eventually(function()
      local c = H.client(port)
      local got = ask(c, "h")
      c:close()
      return got == "v-hup:h"
    end, 10), "new clients never got the code reloaded on SIGHUP")
    assert.matches("SIGHUP: reloading", H.read_file(log))
    assert.matches("reload: reloaded rl_proc", H.read_file(log))
    assert.is_true(H.alive(pid))
  end)

  it("reloads under load: no error, no dropped connection", function()
    local held = H.client(port)
    assert.equal("v-hup:0", ask(held, "0"))
    local requests, connections = 0, 1
    for round = 1, 5 do
      local v = "v-load" .. round
      version(v)
      local rc = pdir .. "/rc" .. round
      os.execute(string.format("(%s reload %s > /dev/null 2>&1; echo $? > %s.tmp; mv %s.tmp %s) &",
        BIN, path, rc, rc, rc))
      local deadline = socket.gettime() + 20
      local newest = nil
      while H.read_file(rc) == "" do
        assert(socket.gettime() < deadline, "netrun reload never finished")
        if requests < 2000 * round then   -- bounded; then just wait for it
          assert.equal("v-hup:" .. requests, ask(held, tostring(requests)))
          local c = H.client(port)
          connections = connections + 1
          local got = ask(c, "n")
          c:close()
          local gv = got:match("^(.-):n$")
          assert.truthy(gv, got)
          newest = gv
          requests = requests + 1
        else
          socket.sleep(0.02)
        end
      end
      assert.equal("0\n", H.read_file(rc))
      local c = H.client(port)
      assert.equal(v .. ":after", ask(c, "after"))
      c:close()
      assert.truthy(newest)
    end
    assert.equal("v-hup:last", ask(held, "last"))
    held:close()
    assert.truthy(connections > 5)
  end)
end)
