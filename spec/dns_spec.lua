-- dns_spec.lua -- DESIGN.md §8.3 "DNS": netrun.dns.resolve off the loop
-- thread with a TTL cache, and host names in netrun.connect (and in
-- netrun.server and netrun.udp called on a loop). Only
-- localhost, numeric addresses and names under .invalid (RFC 6761: never
-- resolve) are looked up: no network.
local H = require "spec.helper"
local netrun = H.netrun

-- A name no test asked before (so no cache answers it).
local serial = 0
local function fresh_invalid()
  serial = serial + 1
  return string.format("nr-%d-%d.no-such-host.invalid", os.time(), serial)
end

describe("netrun.dns", function()
  local group
  setup(function() group = netrun.group { threads = 1, name = "dns-spec" } end)
  teardown(function() H.shutdown(group) end)

  it("resolves localhost to loopback addresses", function()
    local addrs = H.sync(netrun.dns.resolve("localhost"), 15)
    assert.is_true(#addrs >= 1)
    for _, a in ipairs(addrs) do
      assert.is_true(a == "127.0.0.1" or a == "::1", a)
    end
    local v4 = H.sync(netrun.dns.resolve("LOCALHOST", { family = "inet" }), 15)
    assert.same({ "127.0.0.1" }, v4)
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

  it("fails a name that does not resolve with a clear message, then from the cache", function()
    local name = fresh_invalid()
    local ok, err = pcall(H.sync, netrun.dns.resolve(name), 15)
    assert.is_false(ok)
    assert.matches("netrun.dns.resolve: " .. name .. ": ", err, 1, true)
    local again = netrun.dns.resolve(name)
    assert.is_true(again:is_done())                 -- the negative cache answers
    assert.matches(name, again:cause(), 1, true)
  end)

  it("raises for a bad name or family", function()
    assert.has_error(function() netrun.dns.resolve(42) end,
      "netrun.dns.resolve: name must be a non-empty string, got number")
    assert.has_error(function() netrun.dns.resolve("localhost", { family = "ipx" }) end,
      'netrun.dns.resolve: family must be "inet", "inet6" or nil, got ipx')
  end)

  -- A lookup made on the loop would be done when resolve returns, every
  -- time. Made elsewhere, it may finish first now and then (the resolver
  -- thread completes the future at once), but not 20 times in a row.
  it("never looks a name up on a loop thread: the future is pending on return", function()
    local names = {}
    for i = 1, 20 do names[i] = fresh_invalid() end
    local pending, errs = table.unpack(H.sync(group:next():submit(function(ns)
      local n, all = 0, {}
      for i, name in ipairs(ns) do
        local f = netrun.dns.resolve(name)
        if not f:is_done() then n = n + 1 end
        local done = netrun.promise()
        f:add_listener(function(x) done:set_success(x:cause()) end)
        all[i] = done
      end
      return { n, all }
    end, names)))
    assert.is_true(pending > 0, "every lookup was done on return")
    for i, err in ipairs(errs) do
      assert.matches(names[i], H.sync(err, 15), 1, true)
    end
  end)

  it("caches answers for their TTL only", function()
    local dns = netrun.dns
    local ttl = dns.ttl
    dns.ttl = 0.2
    local cache = netrun.shared.dict("netrun.dns")
    cache:delete("inet localhost")                  -- cached by the first test
    local ok, err = pcall(function()
      H.sync(dns.resolve("localhost", { family = "inet" }), 15)
      assert.equal("127.0.0.1", cache:get("inet localhost"))
      assert.is_true(H.eventually(function() return cache:get("inet localhost") == nil end, 5))
    end)
    dns.ttl = ttl
    assert(ok, err)
  end)

  it("netrun.connect takes a host name, resolved off the loop", function()
    local server, port = H.echo_server(group)
    local got = H.sync(group:next():submit(function(p)
      return netrun.spawn(function()
        local ch = netrun.connect { group = netrun.current(), host = "localhost", port = p }:await()
        local host = ch:remote_address()
        ch:close()
        return host
      end)
    end, port)):sync()
    assert.equal("127.0.0.1", got)
    server:close():sync()
  end)

  it("netrun.connect to a name that does not resolve fails its future, never on the loop", function()
    local name = fresh_invalid()
    local was_done, f = table.unpack(H.sync(group:next():submit(function(n)
      local f = netrun.connect { group = netrun.current(), host = n, port = 9 }
      return { f:is_done(), f }
    end, name)))
    assert.is_false(was_done)
    local ok, err = pcall(H.sync, f, 15)
    assert.is_false(ok)
    assert.matches("netrun.connect: netrun.dns.resolve: " .. name, err, 1, true)
  end)

  -- netrun.server and netrun.udp called on a loop: the name is looked up
  -- off the loop, as connect's (before, getaddrinfo ran on the loop and
  -- a bad name failed the future before the call returned).
  for _, kind in ipairs { "server", "udp" } do
    it("netrun." .. kind .. " on a loop resolves a host name off the loop", function()
      local name = fresh_invalid()
      local was_done, f = table.unpack(H.sync(group:next():submit(function(k, n)
        local nr = require "netrun"
        local f = nr[k] { group = nr.current(), host = n, port = 0, init = function() end }
        return { f:is_done(), f }
      end, kind, name)))
      assert.is_false(was_done)
      local ok, err = pcall(H.sync, f, 15)
      assert.is_false(ok)
      assert.matches("netrun." .. kind .. ": netrun.dns.resolve: " .. name, err, 1, true)
    end)

    it("netrun." .. kind .. " on a loop binds localhost", function()
      local ch = H.sync(group:next():submit(function(k)
        local nr = require "netrun"
        return nr[k] { group = nr.current(), host = "localhost", port = 0,
                       init = function() end }
      end, kind))
      local ch2 = H.sync(ch)
      local host, port = ch2:local_address()
      assert.is_true(host == "127.0.0.1" or host == "::1", host)
      assert.is_true(port > 0)
      H.sync(ch2:close())
    end)
  end
end)
