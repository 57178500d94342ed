-- rockspec_spec.lua -- the LuaRocks package (netrun-*.rockspec): `luarocks
-- make` builds a copy of the source tree into a temporary rocks tree, stock
-- lua5.4 requires the module from there with the paths `luarocks path`
-- gives, the tree's executable finds its modules beside it, and `luarocks
-- remove` takes it all away. Nothing is installed outside the temporary
-- directory (HOME too is pointed there, for LuaRocks' cache).
--
-- The build is the project's own CMake build without tests and benchmarks
-- (about 25 s of CPU, two jobs; ctest runs it alone, RUN_SERIAL). Sanitizer builds skip it: the rock is a
-- plain build whatever the suite's, so running it again there checks
-- nothing more.
local H = require "spec.helper"

local root = H.run("cd " .. H.root .. " && pwd"):match("[^\n]+")   -- absolute

local function sh(cmd)
  local out, status = H.run(cmd)
  assert(status == 0, cmd .. "\n" .. out)
  return out
end

local function rockspec()
  local out = sh("cd " .. root .. " && ls netrun-*.rockspec")
  local names = {}
  for name in out:gmatch("[^\n]+") do names[#names + 1] = name end
  assert(#names == 1, "want one netrun-*.rockspec at the top of the tree, got: " .. out)
  return names[1]
end

local function exists(path)
  local f = io.open(path)
  if f then f:close() end
  return f ~= nil
end

local have_luarocks = select(2, H.run("command -v luarocks")) == 0

if H.sanitized or not have_luarocks then
  describe("luarocks make", function()
    it("builds and installs netrun", function()
      pending(H.sanitized and "a plain build: checked by the plain suite"
              or "needs luarocks (scripts/deps.sh installs it)")
    end)
  end)
  return
end

describe("luarocks make", function()
  local tmp, tree, luarocks, version

  setup(function()
    tmp = H.tmpdir()
    tree = tmp .. "/tree"
    local spec = rockspec()
    version = spec:match("^netrun%-(.+)%.rockspec$")
    -- What git would check out, with the edits not yet committed: no
    -- build directory comes along.
    sh(string.format("mkdir %s/src && cd %s && git ls-files -z --cached --others --exclude-standard" ..
      " | tar --null -T - -cf - | tar -C %s/src -xf -", tmp, root, tmp))
    luarocks = string.format("HOME=%s luarocks --lua-version 5.4 --tree %s", tmp, tree)
    local out, status = H.run(string.format(
      "cd %s/src && CMAKE_BUILD_PARALLEL_LEVEL=2 %s make --deps-mode none %s", tmp, luarocks, spec))
    assert(status == 0, "luarocks make failed:\n" .. out:sub(-4000))
  end)

  teardown(function()
    if tmp then os.execute("rm -rf " .. tmp) end
  end)

  it("installs the modules, core.so and the executable into the tree", function()
    for _, f in ipairs { "share/lua/5.4/netrun/init.lua", "share/lua/5.4/netrun/redis/cluster.lua",
                         "lib/lua/5.4/netrun/core.so", "bin/netrun" } do
      assert.is_true(exists(tree .. "/" .. f), f .. " not installed")
    end
    local list = sh(luarocks .. " list --porcelain")
    assert.is_truthy(list:find("netrun\t" .. version:gsub("%-", "%%-") .. "\tinstalled", 1),
      "luarocks list: " .. list)
  end)

  it("stock lua5.4 requires netrun from the tree, and runs a task on a loop", function()
    local script = [[
      local netrun = require "netrun"
      print(package.searchpath("netrun", package.path))
      print(package.searchpath("netrun.core", package.cpath))
      local g = netrun.group { threads = 1 }
      print(g:next():submit(function(a) return a * 2 end, 21):sync())
      print(netrun.json.encode { ok = true })
      g:shutdown_gracefully():sync()
    ]]
    local f = assert(io.open(tmp .. "/use.lua", "w"))
    f:write(script)
    f:close()
    -- From another directory, with only what `luarocks path` sets.
    local out = sh(string.format("cd /tmp && eval \"$(%s path)\" && lua5.4 %s/use.lua", luarocks, tmp))
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.same({ tree .. "/share/lua/5.4/netrun/init.lua", tree .. "/lib/lua/5.4/netrun/core.so",
                  "42", '{"ok":true}' }, lines)
  end)

  it("the tree's netrun executable finds the tree's modules", function()
    local out = sh(string.format(
      "cd /tmp && env -u LUA_PATH -u LUA_PATH_5_4 %s/bin/netrun -e " ..
      "'print(package.searchpath(\"netrun.redis\", package.path))'", tree))
    assert.equal(tree .. "/share/lua/5.4/netrun/redis.lua", out:match("[^\n]+"))
  end)

  it("luarocks remove takes it all away", function()
    sh(luarocks .. " remove netrun")
    for _, f in ipairs { "share/lua/5.4/netrun/init.lua", "lib/lua/5.4/netrun/core.so", "bin/netrun" } do
      assert.is_false(exists(tree .. "/" .. f), f .. " left behind")
    end
  end)
end)
