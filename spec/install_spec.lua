-- install_spec.lua -- DESIGN.md §8.5 "Install": `cmake --install` into a
-- temporary prefix, then the installed `netrun` and stock `lua5.4 -l
-- netrun` run from another directory, with nothing of the source tree
-- on their paths. Nothing is installed outside the temporary prefix.
local H = require "spec.helper"

local root = H.run("cd " .. H.root .. " && pwd"):match("[^\n]+")   -- absolute
local build = H.build
if not build:match("^/") then build = root .. "/" .. build end

local function sh(cmd)
  local out, status = H.run(cmd)
  assert(status == 0, cmd .. "\n" .. out)
  return out
end

-- `netrun SCRIPT --port N` started from /tmp; waits (bounded) for its
-- "listening" log line. Returns pid and log file.
local function start(bin, script, port)
  local log = os.tmpname()
  local f = assert(io.popen(string.format("cd /tmp && %s %s --port %d > %s 2>&1 & echo $!",
    bin, script, port, log)))
  local pid = tonumber(f:read("l"))
  f:close()
  local ok = H.eventually(function() return H.read_file(log):find(":" .. port, 1, true) end, 10)
  if not ok then
    os.execute("kill -KILL " .. pid)
    error(script .. " never listened on " .. port .. ":\n" .. H.read_file(log))
  end
  return pid, log
end

local function echo_round_trip(bin, script)
  local port = H.free_port()
  local pid, log = start(bin, script, port)
  local c = H.client(port)
  assert(c:send("hello install\n"))
  local line = c:receive("*l")
  c:close()
  assert.is_true(H.stop(pid))
  os.remove(log)
  assert.equal("hello install", line)
end

describe("cmake --install", function()
  local prefix

  setup(function()
    prefix = H.tmpdir() .. "/prefix"
    sh(string.format("cmake --install %s --prefix %s", build, prefix))
  end)

  teardown(function()
    if prefix then os.execute("rm -rf " .. prefix:gsub("/prefix$", "")) end
  end)

  it("puts the executable, the modules, core.so and the examples under the prefix", function()
    for _, f in ipairs { "bin/netrun", "share/lua/5.4/netrun/init.lua",
                         "share/lua/5.4/netrun/stream.lua", "lib/lua/5.4/netrun/core.so",
                         "share/netrun/examples/echo.lua" } do
      assert.is_truthy(io.open(prefix .. "/" .. f), f .. " not installed")
    end
  end)

  it("the installed netrun finds its modules from any directory", function()
    local out = sh(string.format(
      "cd /tmp && LUA_PATH= %s/bin/netrun -e 'print(package.searchpath(\"netrun\", package.path))'",
      prefix))
    assert.equal(prefix .. "/share/lua/5.4/netrun/init.lua", out:match("[^\n]+"))
  end)

  it("the installed netrun serves the installed echo example", function()
    echo_round_trip(prefix .. "/bin/netrun", prefix .. "/share/netrun/examples/echo.lua")
  end)

  it("has no source path in its text, and works once the prefix is moved", function()
    -- (A sanitizer build keeps its source file names for its reports.)
    if not H.sanitized then
      local stripped = os.tmpname()
      sh(string.format("objcopy --strip-debug %s/bin/netrun %s", prefix, stripped))
      local out = H.run(string.format("strings %s | grep -c -F %q", stripped, root))
      os.remove(stripped)
      assert.equal("0", out:match("%d+"))
    end
    local moved = prefix .. "-moved"
    sh(string.format("mv %s %s", prefix, moved))
    local ok, err = pcall(echo_round_trip, moved .. "/bin/netrun",
                          moved .. "/share/netrun/examples/echo.lua")
    sh(string.format("mv %s %s", moved, prefix))
    assert(ok, err)
  end)

  -- Stock Lua cannot load an ASan-built core.so (the sanitizer runtime
  -- must come first), so this one runs in plain builds only.
  ;(H.sanitized and pending or it)("stock lua5.4 -l netrun runs against the installed tree", function()
    local code = [[
      assert(package.searchpath("netrun", package.path):find(os.getenv("P"), 1, true) == 1)
      assert(package.searchpath("netrun.core", package.cpath):find(os.getenv("P"), 1, true) == 1)
      local g = netrun.group { threads = 1 }
      print(g:submit(function(a, b) return a + b end, 40, 2):sync())
      g:shutdown_gracefully(0, 5):sync()
    ]]
    local out = sh(string.format(
      "cd /tmp && P=%s LUA_PATH='%s/share/lua/5.4/?.lua;%s/share/lua/5.4/?/init.lua;;' " ..
      "LUA_CPATH='%s/lib/lua/5.4/?.so;;' lua5.4 -l netrun -e %q",
      prefix, prefix, prefix, prefix, code))
    assert.equal("42", out:match("[^\n]+"))
  end)
end)
