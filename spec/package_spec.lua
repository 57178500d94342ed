-- package_spec.lua -- DESIGN.md §8.5 "Install": `cpack -G DEB` builds the
-- netrun package. Its contents and dependencies are checked with dpkg-deb,
-- its documentation against Debian's policy (copyright, changelog.Debian.gz
-- and a README, with the guide of docs/guide/, under /usr/share/doc/netrun)
-- and by lintian, which must report no error (skipped, saying so, only
-- where lintian is not installed: scripts/deps.sh installs it), and the
-- extracted tree serves examples/echo.lua. Nothing is installed on the machine (dpkg -i would
-- be): the package is unpacked in a temporary directory.
local H = require "spec.helper"

local root = H.run("cd " .. H.root .. " && pwd"):match("[^\n]+")   -- absolute
local build = H.build
if not build:match("^/") then build = root .. "/" .. build end

local function sh(cmd)
  local out, status = H.run(cmd)
  assert(status == 0, cmd .. "\n" .. out)
  return out
end

describe("cpack -G DEB", function()
  local dir, deb

  setup(function()
    dir = H.tmpdir()
    sh(string.format("cd %s && cpack -G DEB --config %s/CPackConfig.cmake -B %s", dir, build, dir))
    deb = H.run("ls " .. dir .. "/netrun_*.deb"):match("[^\n]+")
  end)

  teardown(function()
    if dir then os.execute("rm -rf " .. dir) end
  end)

  it("builds a package named netrun", function()
    assert.is_truthy(deb and io.open(deb), "no netrun_*.deb in " .. dir)
    assert.equal("netrun", sh("dpkg-deb -f " .. deb .. " Package"):match("%S+"))
  end)

  it("holds the executable, the modules, core.so and the examples under /usr", function()
    local list = sh("dpkg-deb -c " .. deb)
    for _, f in ipairs { "./usr/bin/netrun", "./usr/share/lua/5.4/netrun/init.lua",
                         "./usr/lib/lua/5.4/netrun/core.so",
                         "./usr/share/netrun/examples/echo.lua" } do
      assert.is_truthy(list:find(f, 1, true), f .. " not in the package:\n" .. list)
    end
  end)

  it("depends on the runtime libraries", function()
    local depends = sh("dpkg-deb -f " .. deb .. " Depends")
    for _, p in ipairs { "libssl3", "libedit2", "libc6", "libc-ares2" } do
      assert.is_truthy(depends:find(p, 1, true), p .. " missing from Depends: " .. depends)
    end
  end)

  it("ships copyright, changelog.Debian.gz, a README and the guide under /usr/share/doc/netrun", function()
    local list = sh("dpkg-deb -c " .. deb)
    for _, f in ipairs { "copyright", "changelog.Debian.gz", "README.md" } do
      local line = list:match("[^\n]*%./usr/share/doc/netrun/" .. f:gsub("%.", "%%.") .. "\n")
      assert.is_truthy(line, f .. " not in /usr/share/doc/netrun:\n" .. list)
      assert.matches("^%-rw%-r%-%-r%-%- root/root", line)
    end
    local docs = dir .. "/docs"
    sh(string.format("dpkg-deb -x %s %s", deb, docs))
    local doc = docs .. "/usr/share/doc/netrun/"
    -- the changelog's latest entry is this package's version
    local version = sh("dpkg-deb -f " .. deb .. " Version"):match("%S+")
    local changelog = sh("gzip -dc " .. doc .. "changelog.Debian.gz")
    assert.equal("netrun (" .. version .. ")", changelog:match("^(netrun %b())"))
    assert.matches("\n %-%- [^\n]+<[^@>]+@[^>]+>  %a%a%a, %d%d %a%a%a %d%d%d%d %d%d:%d%d:%d%d [+-]%d%d%d%d\n",
      changelog)
    local copyright = H.read_file(doc .. "copyright")
    assert.matches("^Format: https://www%.debian%.org/doc/packaging%-manuals/copyright%-format/1%.0/", copyright)
    assert.matches("\nFiles: %*\nCopyright: [^\n]+\nLicense: ", copyright)
    assert.matches("^# netrun", H.read_file(doc .. "README.md"))
    -- the guide the README links to, every page of docs/guide/
    local pages = H.run("cd " .. root .. "/docs/guide && ls *.md")
    local n = 0
    for page in pages:gmatch("[^\n]+") do
      local line = list:match("[^\n]*%./usr/share/doc/netrun/guide/" .. page:gsub("[%.%-]", "%%%0") .. "\n")
      assert.is_truthy(line, "guide/" .. page .. " not in /usr/share/doc/netrun:\n" .. list)
      assert.matches("^%-rw%-r%-%-r%-%- root/root", line)
      n = n + 1
    end
    assert.is_true(n >= 10, n .. " guide pages")
  end)

  local have_lintian = H.run("command -v lintian"):match("lintian") ~= nil
  ;(have_lintian and it or pending)("passes lintian with no error" ..
      (have_lintian and "" or " (lintian is not installed: run scripts/deps.sh)"), function()
    local out = H.run("lintian --fail-on error " .. deb)
    local errors = {}
    for line in out:gmatch("[^\n]+") do
      if line:match("^E: ") then errors[#errors + 1] = line end
    end
    assert.same({}, errors)
  end)

  it("its netrun serves examples/echo.lua from the unpacked tree", function()
    local root = dir .. "/root"
    sh(string.format("dpkg-deb -x %s %s", deb, root))
    local port = H.free_port()
    local log = os.tmpname()
    local f = assert(io.popen(string.format(
      "cd /tmp && %s/usr/bin/netrun %s/usr/share/netrun/examples/echo.lua --port %d > %s 2>&1 & echo $!",
      root, root, port, log)))
    local pid = tonumber(f:read("l"))
    f:close()
    local up = H.eventually(function() return H.read_file(log):find(":" .. port, 1, true) end, 10)
    if not up then os.execute("kill -KILL " .. pid) end
    assert(up, "the packaged netrun never listened:\n" .. H.read_file(log))
    local c = H.client(port)
    assert(c:send("hello deb\n"))
    local line = c:receive("*l")
    c:close()
    assert.is_true(H.stop(pid))
    os.remove(log)
    assert.equal("hello deb", line)
  end)
end)
