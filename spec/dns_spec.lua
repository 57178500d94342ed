-- dns_spec.lua -- DESIGN.md §8.3 "DNS": netrun.dns.resolve off the loop
-- threads (c-ares on the resolver's thread) with a TTL cache, host names
-- in netrun.connect (every address tried, RFC 8305) and in netrun.server
-- and netrun.udp called on a loop. No network and not the machine's
-- resolv.conf: the names are answered by spec/fixtures/dns_server.lua, a
-- DNS server on a loop of this process that can also answer late, never,
-- or as an attacker would.
local H = require "spec.helper"
local netrun = H.netrun
local socket = H.socket
local D = require "dns_server"

-- A name no test asked before (so no cache answers it), under `zone`.
local serial = 0
local function fresh(zone)
  serial = serial + 1
  return string.format("nr-%d-%d.%s", os.time(), serial, zone or "no-such-host.invalid")
end

local ZONE = {
  ["dual.test"] = { a = { "127.0.0.1" }, aaaa = { "::1" } },
  ["v4.test"] = { a = { "127.0.0.1" } },
  ["fast.test"] = { a = { "127.0.0.1" } },
  ["ttl.test"] = { a = { "127.0.0.1" }, ttl = 1 },
  ["bigttl.test"] = { a = { "127.0.0.1" }, ttl = 0x7fffffff },
  ["wrongid.test"] = { a = { "127.0.0.1" }, wrong_id = true },
  ["garbage.test"] = { a = { "127.0.0.1" }, garbage = true },
  ["flood.test"] = { a = { "127.0.0.1" }, flood = 2000 },
  ["spoof.test"] = { a = { "127.0.0.1" }, spoof = true },
  ["wrongname.test"] = { a = { "127.0.0.1" }, wrong_name = true },
  ["tc.test"] = { a = { "127.0.0.1" }, aaaa = { "::1" }, truncated = true },
  ["many.test"] = { many = 3000 },
}
for i = 1, 40 do ZONE["h" .. i .. ".hole.test"] = { hole = true } end
for i = 1, 10 do
  ZONE["held" .. i .. ".test"] = { held = true, a = { "127.0.0.1" }, aaaa = { "::1" } }
  ZONE["heldnx" .. i .. ".test"] = { held = true, nxdomain = true }
end

local holes = 0
local function hole()            -- a name whose server never answers
  holes = holes + 1
  assert(holes <= 40, "dns_spec: more black-holed names than the zone has")
  return "h" .. holes .. ".hole.test"
end

local helds = 0
local function held(nx)          -- a name answered when the test says so
  helds = helds + 1
  return (nx and "heldnx" or "held") .. helds .. ".test"
end

-- Run fn with netrun.dns.timeout = t in this state.
local function with_timeout(t, fn)
  local old = netrun.dns.timeout
  netrun.dns.timeout = t
  local ok, err = pcall(fn)
  netrun.dns.timeout = old
  assert(ok, err)
end

describe("netrun.dns", function()
  local group, dns_port
  setup(function()
    group = netrun.group { threads = 2, name = "dns-spec" }
    dns_port = D.start(group, ZONE)
    netrun.dns.configure { servers = { "127.0.0.1:" .. dns_port } }
  end)
  teardown(function()
    netrun.dns.configure { servers = false }
    H.shutdown(group)
  end)

  -- ---- names no server is asked about --------------------------------------------

  it("resolves localhost to ::1 then 127.0.0.1 at once, asking no server", function()
    local f = netrun.dns.resolve("localhost")
    assert.is_true(f:is_done())
    assert.same({ "::1", "127.0.0.1" }, f:result())
    assert.same({ "127.0.0.1" }, netrun.dns.resolve("LOCALHOST", { family = "inet" }):result())
    assert.same({ "::1" }, netrun.dns.resolve("localhost.", { family = "inet6" }):result())
    assert.same({ "::1", "127.0.0.1" }, netrun.dns.resolve("api.Localhost"):result())
    assert.equal(0, D.queries("localhost") + D.queries("api.localhost"))
    pcall(H.sync, netrun.dns.resolve("localhost.example"))   -- not under it:
    assert.is_true(D.queries("localhost.example") > 0)       -- asked
  end)

  it("resolves numeric addresses at once, without a thread hop", function()
    local f = netrun.dns.resolve("127.0.0.1")
    assert.is_true(f:is_done())
    assert.same({ "127.0.0.1" }, f:result())
    assert.same({ "::1" }, netrun.dns.resolve("::1"):result())
    local bad = netrun.dns.resolve("127.0.0.1", { family = "inet6" })
    assert.is_true(bad:is_done())
    assert.matches("127.0.0.1 is an inet address, not inet6", bad:cause(), 1, true)
  end)

  it("fails names under .invalid without asking a server, then from the cache", function()
    local name = fresh()
    local ok, err = pcall(H.sync, netrun.dns.resolve(name), 15)
    assert.is_false(ok)
    assert.matches("netrun.dns.resolve: " .. name .. ": Domain name not found", err, 1, true)
    assert.equal(0, D.queries(name))
    local again = netrun.dns.resolve(name)
    assert.is_true(again:is_done())                 -- the negative cache answers
    assert.matches(name, again:cause(), 1, true)
  end)

  it("raises for a bad name, family or setting", function()
    assert.has_error(function() netrun.dns.resolve(42) end,
      "netrun.dns.resolve: name must be a non-empty string, got 42")
    assert.has_error(function() netrun.dns.resolve("localhost", { family = "ipx" }) end,
      'netrun.dns.resolve: family must be "inet" or "inet6", got "ipx"')
    assert.has_error(function() netrun.dns.configure { servers = { "not an address" } } end)
    assert.has_error(function() netrun.dns.configure { max_inflight = 0 } end,
      "netrun.dns.configure: max_inflight must be an integer from 1 to 1000000, got 0")
    assert.has_error(function() netrun.dns.configure { serves = {} } end)
    local f = netrun.dns.resolve(string.rep("a", 300) .. ".test")
    assert.is_true(f:is_done())
    assert.matches("not a host name", f:cause(), 1, true)
  end)

  -- ---- names asked of the server ---------------------------------------------------

  it("answers a name from its server, IPv6 first (RFC 6724), each family alone too", function()
    assert.same({ "::1", "127.0.0.1" }, H.sync(netrun.dns.resolve("dual.test")))
    assert.same({ "127.0.0.1" }, H.sync(netrun.dns.resolve("dual.test", { family = "inet" })))
    assert.same({ "::1" }, H.sync(netrun.dns.resolve("dual.test", { family = "inet6" })))
    local ok, err = pcall(H.sync, netrun.dns.resolve("v4.test", { family = "inet6" }))
    assert.is_false(ok)
    assert.matches("netrun.dns.resolve: v4.test: ", err, 1, true)
  end)

  it("fails a name the server does not know, then from the cache", function()
    local name = fresh("test")
    local ok, err = pcall(H.sync, netrun.dns.resolve(name), 15)
    assert.is_false(ok)
    assert.matches("netrun.dns.resolve: " .. name .. ": Domain name not found", err, 1, true)
    local asked = D.queries(name)
    assert.is_true(asked >= 1)
    local again = netrun.dns.resolve(name)
    assert.is_true(again:is_done())
    assert.equal(asked, D.queries(name))
  end)

  -- A lookup made on the loop would be done when resolve returns. Here the
  -- server holds its answer until told: pending on return, every time.
  it("never looks a name up on a loop thread: the future is pending on return", function()
    local names = { held(), held() }
    local pending, all = table.unpack(H.sync(group:next():submit(function(ns)
      local n, all = 0, {}
      for i, name in ipairs(ns) do
        local f = netrun.dns.resolve(name)
        if not f:is_done() then n = n + 1 end
        local done = netrun.promise()
        f:add_listener(function(x) done:set_success(x:is_success() and x:result()) end)
        all[i] = done
      end
      return { n, all }
    end, names)))
    assert.equal(2, pending)
    assert.is_true(H.eventually(function() return D.queries(names[2]) == 2 end))
    for i, name in ipairs(names) do
      assert.equal(2, D.release(name))
      assert.same({ "::1", "127.0.0.1" }, H.sync(all[i]))
    end
  end)

  it("asks the server once for a name that many callers on many threads want meanwhile", function()
    local name = held()
    local futures = {}
    for i = 1, 10 do futures[#futures + 1] = netrun.dns.resolve(name) end
    for _, loop in ipairs(group:loops()) do
      futures[#futures + 1] = H.sync(loop:submit(function(n)
        local fs = {}
        for i = 1, 10 do fs[i] = require("netrun").dns.resolve(n) end
        return require("netrun").all(fs)
      end, name))
    end
    -- The resolver takes requests in order: once a later name's questions
    -- reach the server, every caller above has joined (else one asking
    -- after the answer came would start a lookup of its own).
    local barrier = held()
    local last = netrun.dns.resolve(barrier)
    assert.is_true(H.eventually(function() return D.queries(barrier) == 2 end))
    assert.equal(2, D.queries(name))
    assert.equal(2, D.release(name))
    for i = 1, 10 do assert.same({ "::1", "127.0.0.1" }, H.sync(futures[i])) end
    for i = 11, #futures do
      for _, r in ipairs(H.sync(futures[i])) do assert.same({ "::1", "127.0.0.1" }, r) end
    end
    assert.equal(1, D.queries(name, "A"))
    assert.equal(1, D.queries(name, "AAAA"))
    D.release(barrier)
    H.sync(last)
  end)

  it("caches answers for their TTL (the record's, at most dns.ttl)", function()
    local cache = netrun.shared.dict("netrun.dns")
    H.sync(netrun.dns.resolve("ttl.test", { family = "inet" }))
    assert.equal("127.0.0.1", cache:get("inet ttl.test"))
    assert.equal(1, D.queries("ttl.test", "A"))
    assert.is_true(H.eventually(function() return cache:get("inet ttl.test") == nil end, 5))
    H.sync(netrun.dns.resolve("ttl.test", { family = "inet" }))
    assert.equal(2, D.queries("ttl.test", "A"))    -- asked again once it expired
    local ttl = netrun.dns.ttl
    netrun.dns.ttl = 0.2                           -- a huge TTL is capped
    local ok, err = pcall(function()
      H.sync(netrun.dns.resolve("bigttl.test", { family = "inet" }))
      assert.equal("127.0.0.1", cache:get("inet bigttl.test"))
      assert.is_true(H.eventually(function() return cache:get("inet bigttl.test") == nil end, 5))
    end)
    netrun.dns.ttl = ttl
    assert(ok, err)
  end)

  -- ---- starvation, bounds, shutdown ---------------------------------------------------

  it("answers other names at once while lookups of black-holed names are pending", function()
    local slow = {}
    with_timeout(2, function()
      for i = 1, 8 do slow[i] = netrun.dns.resolve(hole()) end
    end)
    local t = socket.gettime()
    assert.same({ "127.0.0.1" }, H.sync(netrun.dns.resolve("fast.test"), 5))
    local fast = socket.gettime() - t
    t = socket.gettime()
    assert.same({ "::1", "127.0.0.1" }, H.sync(netrun.dns.resolve("localhost"), 5))
    local lh = socket.gettime() - t
    print(string.format("\n  fast.test in %.1f ms, localhost in %.3f ms, with 8 black-holed lookups pending",
      fast * 1000, lh * 1000))
    assert.is_true(fast < 1, "fast.test took " .. fast .. " s")
    for _, f in ipairs(slow) do assert.is_false(f:is_done()) end
    for _, f in ipairs(slow) do
      local ok, err = pcall(H.sync, f, 10)
      assert.is_false(ok)
      assert.matches("hole.test: timed out after 2 s", err, 1, true)
    end
  end)

  it("bounds the lookups in flight, then those waiting for a slot", function()
    netrun.dns.configure { max_inflight = 2, max_waiting = 1 }
    local ok, err = pcall(function()
      local a, b, c, d = hole(), hole(), hole(), hole()
      local fs = {}
      with_timeout(1, function()
        for i, n in ipairs { a, b, c, d } do fs[i] = netrun.dns.resolve(n) end
      end)
      local ok4, err4 = pcall(H.sync, fs[4], 5)         -- refused at once
      assert.is_false(ok4)
      assert.matches(d .. ": 2 lookups in flight and 1 waiting (max_inflight, max_waiting)",
        err4, 1, true)
      assert.is_nil(netrun.shared.dict("netrun.dns"):get("any " .. d))   -- not cached
      assert.is_true(H.eventually(function() return D.queries(a) > 0 and D.queries(b) > 0 end))
      assert.equal(0, D.queries(c))                      -- in line, not asked yet
      for i = 1, 2 do pcall(H.sync, fs[i], 5) end        -- they time out: c starts
      assert.is_true(H.eventually(function() return D.queries(c) > 0 end))
      pcall(H.sync, fs[3], 5)
    end)
    netrun.dns.configure { max_inflight = 256, max_waiting = 4096 }
    assert(ok, err)
  end)

  -- A process with a lookup to a black-holed server exits promptly on
  -- SIGTERM, and the lookup's future fails instead of waiting for it.
  it("does not hold a shutdown: SIGTERM fails the lookups in flight", function()
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write([[
      local netrun = require "netrun"
      local g = netrun.group { threads = 1 }
      g:next():submit(function(name)
        local netrun = require "netrun"
        netrun.spawn(function()
          local ok, err = pcall(function() return netrun.dns.resolve(name):await() end)
          io.stdout:write("lookup: ", tostring(err), "\n")
          io.stdout:flush()
        end)
      end, arg[1]):sync()
      io.stdout:write("ready\n")
      io.stdout:flush()
    ]])
    f:close()
    local out = os.tmpname()
    local p = assert(io.popen(string.format(
      "NETRUN_DNS_SERVERS=127.0.0.1:%d %s %s %s > %s 2>&1 & echo $!",
      dns_port, H.BIN, script, hole(), out)))
    local pid = tonumber(p:read("l"))
    p:close()
    local function output()
      local lf = io.open(out)
      local s = lf and lf:read("a") or ""
      if lf then lf:close() end
      return s
    end
    assert.truthy(H.eventually(function() return output():find("ready") end, 10), output())
    local t = socket.gettime()
    os.execute("kill -TERM " .. pid)
    assert.is_true(H.eventually(function() return not H.alive(pid) end, 10))
    local took = socket.gettime() - t
    print(string.format("\n  exited %.2f s after SIGTERM with a lookup pending", took))
    assert.is_true(took < 3, "took " .. took .. " s")
    assert.matches("lookup: .*cancelled: netrun is shutting down", output())
    os.remove(script)
    os.remove(out)
  end)

  -- ---- attackers and broken servers -------------------------------------------------

  for _, case in ipairs {
    { "wrongid.test", "an answer with another ID first" },
    { "garbage.test", "a datagram of garbage first" },
    { "flood.test", "2000 answers with wrong IDs first" },
    { "spoof.test", "a forged answer from another port first" },
    { "wrongname.test", "an answer (right ID) to another question first" },
  } do
    it("takes the right answer from " .. case[2], function()
      assert.same({ "127.0.0.1" }, H.sync(netrun.dns.resolve(case[1], { family = "inet" }), 10))
    end)
  end

  it("follows a truncated answer to TCP", function()
    assert.same({ "::1", "127.0.0.1" }, H.sync(netrun.dns.resolve("tc.test"), 10))
  end)

  it("keeps at most 32 addresses of a huge answer", function()
    local addrs = H.sync(netrun.dns.resolve("many.test", { family = "inet" }), 10)
    assert.equal(32, #addrs)
  end)

  -- ---- connects ------------------------------------------------------------------------

  it("netrun.connect takes a host name, resolved off the loop", function()
    local server, port = H.echo_server(group)
    for _, name in ipairs { "localhost", "dual.test" } do
      local got = H.sync(group:next():submit(function(p, n)
        return netrun.spawn(function()
          local ch = netrun.connect { group = netrun.current(), host = n, port = p }:await()
          local host = ch:remote_address()
          ch:close()
          return host
        end)
      end, port, name)):sync()
      assert.equal("127.0.0.1", got)               -- ::1 refused, then 127.0.0.1
    end
    server:close():sync()
  end)

  it("netrun.connect tries each address of an array in turn", function()
    local server, port = H.echo_server(group)
    local ch = H.sync(netrun.connect { group = group, host = { "::1", "127.0.0.1" }, port = port })
    assert.equal("127.0.0.1", (ch:remote_address()))
    H.sync(ch:close())
    server:close():sync()
    local free = H.free_port()
    local ok, err = pcall(H.sync, netrun.connect { group = group, host = "localhost", port = free })
    assert.is_false(ok)                            -- the connect error, each address's
    assert.matches("netrun.connect: localhost:" .. free .. ": ::1:" .. free ..
      ": ECONNREFUSED: connection refused; 127.0.0.1:" .. free ..
      ": ECONNREFUSED: connection refused", err, 1, true)
    -- RFC 8305 §4: the families alternate, each in its own order
    ok, err = pcall(H.sync, netrun.connect { group = group, port = free,
      host = { "127.0.0.1", "127.0.0.2", "127.0.0.3", "::1" } })
    assert.is_false(ok)
    local order = {}
    for a in err:gmatch("([%d%.:]+):" .. free .. ": ECONNREFUSED") do order[#order + 1] = a end
    assert.same({ "127.0.0.1", "::1", "127.0.0.2", "127.0.0.3" }, order)
    assert.has_error(function() netrun.connect { group = group, host = { "a.test" }, port = 1 } end,
      'netrun.connect: host[1] must be a numeric address, got "a.test"')
  end)

  -- ::1 drops the SYN (its listener's queue is full) while 127.0.0.1
  -- answers: the second address starts 250 ms after the first (RFC 8305)
  -- instead of after the first one's timeout.
  it("starts the next address while an unanswered one still waits", function()
    local l6 = assert(socket.tcp6())
    assert(l6:bind("::1", 0))
    assert(l6:listen(0))
    local _, port = l6:getsockname()
    port = tonumber(port)
    local fill = {}
    for i = 1, 3 do                                 -- fill the queue (no accept)
      fill[i] = socket.tcp6()
      fill[i]:settimeout(0)
      fill[i]:connect("::1", port)
    end
    local ok, server = pcall(function()
      return netrun.server { group = group, host = "127.0.0.1", port = port,
                             init = function() end }:sync()
    end)
    if not ok then                                   -- the IPv4 port is taken
      l6:close()
      return pending("127.0.0.1:" .. port .. " is taken")
    end
    local t = socket.gettime()
    local ch = H.sync(netrun.connect { group = group, host = "localhost", port = port,
                                       timeout = 5 }, 10)
    local took = socket.gettime() - t
    print(string.format("\n  connected to 127.0.0.1 after %.0f ms, ::1 black-holed", took * 1000))
    assert.equal("127.0.0.1", (ch:remote_address()))
    assert.is_true(took < 2, "took " .. took .. " s")
    H.sync(ch:close())
    server:close():sync()
    for _, c in ipairs(fill) do c:close() end
    l6:close()
  end)

  it("netrun.connect to a name that does not resolve fails its future, never on the loop", function()
    local name = held(true)
    local was_done, f = table.unpack(H.sync(group:next():submit(function(n)
      local f = netrun.connect { group = netrun.current(), host = n, port = 9 }
      return { f:is_done(), f }
    end, name)))
    assert.is_false(was_done)
    assert.is_true(H.eventually(function() return D.queries(name) == 2 end))
    D.release(name)
    local ok, err = pcall(H.sync, f, 15)
    assert.is_false(ok)
    assert.matches("netrun.connect: netrun.dns.resolve: " .. name .. ": Domain name not found",
      err, 1, true)
  end)

  -- netrun.server and netrun.udp called on a loop: the name is looked up
  -- off the loop, as connect's (before, getaddrinfo ran on the loop and
  -- a bad name failed the future before the call returned).
  for _, kind in ipairs { "server", "udp" } do
    it("netrun." .. kind .. " on a loop resolves a host name off the loop", function()
      local name = held(true)
      local was_done, f = table.unpack(H.sync(group:next():submit(function(k, n)
        local nr = require "netrun"
        local f = nr[k] { group = nr.current(), host = n, port = 0, init = function() end }
        return { f:is_done(), f }
      end, kind, name)))
      assert.is_false(was_done)
      assert.is_true(H.eventually(function() return D.queries(name) == 2 end))
      D.release(name)
      local ok, err = pcall(H.sync, f, 15)
      assert.is_false(ok)
      assert.matches("netrun." .. kind .. ": netrun.dns.resolve: " .. name, err, 1, true)
    end)

    it("netrun." .. kind .. " on a loop binds localhost to 127.0.0.1", function()
      local ch = H.sync(group:next():submit(function(k)
        local nr = require "netrun"
        return nr[k] { group = nr.current(), host = "localhost", port = 0,
                       init = function() end }
      end, kind))
      local ch2 = H.sync(ch)
      local host, port = ch2:local_address()
      assert.equal("127.0.0.1", host)
      assert.is_true(port > 0)
      H.sync(ch2:close())
    end)
  end

  -- RFC 6761: localhost is loopback even where /etc/hosts is empty (a
  -- minimal container or chroot). A netrun process in a mount namespace
  -- whose /etc/hosts is an empty file serves and connects by "localhost".
  it("serves and connects by localhost with an empty /etc/hosts", function()
    local _, rc = H.run("unshare -m true")
    if rc ~= 0 then return pending("needs root and unshare -m") end
    local empty, script = os.tmpname(), os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write([[
      local netrun = require "netrun"
      local g = netrun.group { threads = 1 }
      local srv = netrun.server { group = g, host = "localhost", port = 0,
        init = function(ch) ch:pipeline():add_last("echo", {
          channel_read = function(_, ctx, m) ctx:write_and_flush(m) end }) end }:sync()
      local host, port = srv:local_address()
      local addrs = table.concat(netrun.dns.resolve("localhost"):sync(), " ")
      local ch = netrun.connect { group = g, host = "localhost", port = port }:sync()
      local echoed = g:next():submit(function(p)
        return require("netrun").spawn(function()
          local s = require("netrun").tcp.connect("localhost", p):await()
          s:send("ping\n")
          local line = s:receive("*l")
          s:close()
          return line
        end)
      end, port):sync():sync()
      print(string.format("bound %s; localhost is %s; connected to %s; echoed %s",
        host, addrs, (ch:remote_address()), echoed))
      ch:close():sync()
      g:shutdown_gracefully(0, 2):sync()
    ]])
    f:close()
    local out, status = H.run(string.format(
      "unshare -m sh -c 'mount --bind %s /etc/hosts && timeout 20 %s %s'",
      empty, H.BIN, script))
    os.remove(empty)
    os.remove(script)
    assert.equal(0, status, out)
    assert.matches("bound 127.0.0.1; localhost is ::1 127.0.0.1; connected to 127.0.0.1; echoed ping",
      out, 1, true)
  end)
end)
