-- The LuaRocks package of netrun, built from this checkout:
--
--   luarocks --lua-version 5.4 make                  (into the default tree)
--   luarocks --lua-version 5.4 --tree DIR make       (anywhere else)
--
-- It builds with CMake (the project's own build, without its tests and
-- benchmarks) and installs the `netrun` module (lua/netrun/*.lua and the
-- C module netrun/core.so) and the `netrun` executable into the tree;
-- `eval "$(luarocks --lua-version 5.4 --tree DIR path)"` then lets stock
-- lua5.4 require it. On Debian 12 the build needs the packages
-- scripts/deps.sh installs (cmake, lua5.4 and liblua5.4-dev, libssl-dev,
-- zlib1g-dev, libc-ares-dev, libedit-dev). spec/rockspec_spec.lua checks
-- it in a temporary tree. The version follows the Debian package's
-- (CMakeLists.txt, packaging/changelog.Debian): rename this file with it.
rockspec_format = "3.0"
package = "netrun"
version = "0.1.0-1"

source = {
  -- netrun has no public repository yet: `luarocks make` builds the
  -- checkout it runs in and never fetches this.
  url = "git+https://example.invalid/netrun.git",
}

description = {
  summary = "Lua-scriptable network runtime (event loops in C, handlers in Lua)",
  detailed = [[
netrun runs network servers and clients written in Lua 5.4 on event loops
written in C, in the model of Netty: groups of single-threaded loops,
channels and handler pipelines, with native codecs (lines, HTTP/1.1, RESP,
WebSocket), TLS, streams, HTTP and Redis clients, JSON, hot reload and
metrics. Linux only (epoll).
]],
  license = "none granted yet (all rights reserved: packaging/copyright)",
  labels = { "networking", "server", "http", "redis" },
}

supported_platforms = { "linux" }

dependencies = {
  "lua >= 5.4, < 5.5",
}

-- Checked by LuaRocks before the build, for a clear message when one is
-- missing (CMake finds them again through pkg-config).
external_dependencies = {
  OPENSSL = { header = "openssl/ssl.h" },
  ZLIB = { header = "zlib.h" },
  CARES = { header = "ares.h" },
  EDIT = { header = "histedit.h" },
}

build = {
  type = "cmake",
  variables = {
    CMAKE_BUILD_TYPE = "RelWithDebInfo",
    CMAKE_INSTALL_PREFIX = "$(PREFIX)",
    NETRUN_INSTALL_LUADIR = "$(LUADIR)",
    NETRUN_INSTALL_LIBDIR = "$(LIBDIR)",
    NETRUN_TESTS = "OFF",
    NETRUN_BENCH = "OFF",
  },
}
