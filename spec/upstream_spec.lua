-- upstream_spec.lua -- netrun.http.upstream (DESIGN.md §9.2): a pool of
-- backends shared by every loop. Backends are netrun processes
-- (spec/fixtures/upstream_backend.lua: killing one resets its connections,
-- as a crash does); requests go through client:request { upstream } and
-- through examples/proxy.lua with several --backend. What a user relies
-- on: no GET fails while a backend dies and comes back (retries), the
-- dead one is out within health.interval and back within two, a POST is
-- never sent twice, hash sticks, least_conn avoids the busy server, https
-- backends are verified, and bad options say which field is wrong.
local H = require "spec.helper"
local netrun = H.netrun
local socket = H.socket

local FIXTURE = H.root .. "/spec/fixtures/upstream_backend.lua"
local slow = H.sanitized and 5 or 1          -- sanitizer builds run ~5x slower

-- Every process a test starts, stopped after it whatever happened (a
-- failed assertion leaves none behind).
local started = {}
local function started_pid(pid)
  started[#started + 1] = pid
  return pid
end

local function backend(name, args, port)
  port = port or H.free_port()
  local pid = started_pid(H.start(FIXTURE, port, "--name " .. name .. " " .. (args or "")))
  return { pid = pid, port = port, addr = "127.0.0.1:" .. port }
end

local function proxy(port, args)
  local pid, log = H.start(H.root .. "/examples/proxy.lua", port, args)
  return started_pid(pid), log
end

after_each(function()
  for _, pid in ipairs(started) do
    if H.alive(pid) then H.stop(pid) end
  end
  started = {}
end)

local function kill(b)
  os.execute("kill -KILL " .. b.pid)
  H.eventually(function() return not H.alive(b.pid) end, 5)
end

local client = netrun.http.client { timeout = 2 * slow }

-- GET through the upstream: the answering backend's name, or nil, err.
local function get(up, path, headers)
  local ok, res = pcall(H.sync, client:request { upstream = up, path = path or "/x",
                                                 headers = headers }, 20)
  if not ok then return nil, res end
  return res.headers["x-backend"], res
end

local function up_of(up, i) return up:status()[i].up end

-- The requests a backend process has seen (the fixture's /hits).
local function hits(b)
  return tonumber(H.sync(client:request { url = "http://" .. b.addr .. "/hits" }, 10).body)
end

describe("netrun.http.upstream", function()
  it("refuses bad options, naming the field", function()
    local function err(opts)
      local ok, e = pcall(netrun.http.upstream, opts)
      assert.is_false(ok)
      return tostring(e)
    end
    assert.matches('servers%[2%] must be "host:port".*got "10%.0%.0%.1"',
      err { servers = { "10.0.0.1:80", "10.0.0.1" } })
    assert.matches("servers%[1%] must be .*got \"ftp://a:1\"", err { servers = { "ftp://a:1" } })
    assert.matches("servers%[1%] must be .*got \"a:99999\"", err { servers = { "a:99999" } })
    assert.matches("servers must list at least one server", err { servers = {} })
    assert.matches("servers must be a table", err { servers = "a:1" })
    assert.matches('balance must be "round_robin", "least_conn" or "hash", got "random"',
      err { servers = { "a:1" }, balance = "random" })
    assert.matches("hash must be a function or a header name", err { servers = { "a:1" }, balance = "hash" })
    assert.matches("health: path must be a string", err { servers = { "a:1" }, health = { interval = 1 } })
    assert.matches("unknown option 'retry'", err { servers = { "a:1" }, retry = 1 })
    assert.matches("retries must be", err { servers = { "a:1" }, retries = -1 })
    local ok, e = pcall(function()
      return client:request { upstream = netrun.http.upstream { servers = { "a:1" } },
                              url = "http://a:1/" }
    end)
    assert.is_false(ok)
    assert.matches("url or upstream", e)
  end)

  it("keeps every GET answered while a backend dies and comes back; probes take it out within an interval and back within two", function()
    local b = { backend("a"), backend("b"), backend("c") }
    local interval = 0.2 * slow
    local up = netrun.http.upstream {
      servers = { b[1].addr, b[2].addr, b[3].addr }, retries = 2,
      health = { path = "/health", interval = interval } }
    local seen, failed = {}, 0
    local function load(n)
      for _ = 1, n do
        local name, res = get(up)
        if name then seen[name] = (seen[name] or 0) + 1 else failed = failed + 1; print(res) end
      end
    end
    load(30)
    for _, n in ipairs { "a", "b", "c" } do       -- round robin (a turn per loop)
      assert.is_true(seen[n] >= 8 and seen[n] <= 12, n .. ": " .. tostring(seen[n]))
    end
    -- b dies (its keep-alive connections reset): its requests go elsewhere
    kill(b[2])
    local t0 = socket.gettime()
    load(30)
    assert.equal(0, failed)
    -- out by the passive count already; the probes keep it out
    local out = H.eventually(function() return not up_of(up, 2) and socket.gettime() end, 5)
    assert.truthy(out)
    assert.is_true(out - t0 <= interval + 0.1 * slow, "out after " .. (out - t0) .. " s")
    -- it comes back on its port: probes bring it back within two intervals
    b[2] = backend("b", nil, b[2].port)
    local t1 = socket.gettime()
    local back = H.eventually(function() return up_of(up, 2) and socket.gettime() end, 5)
    assert.truthy(back)
    assert.is_true(back - t1 <= 2 * interval + 0.1 * slow, "back after " .. (back - t1) .. " s")
    seen = {}
    load(30)
    assert.equal(0, failed)
    assert.truthy(seen.b, "b gets requests again")
    -- with no traffic at all, a probe alone takes a dead server out
    kill(b[3])
    t0 = socket.gettime()
    out = H.eventually(function() return not up_of(up, 3) and socket.gettime() end, 5)
    assert.is_true(out - t0 <= interval + 0.1 * slow, "probe took it out after " .. (out - t0) .. " s")
    up:close()
    for _, x in ipairs(b) do if H.alive(x.pid) then H.stop(x.pid) end end
  end)

  it("sends a POST once: a dead backend's POST fails, a GET is retried", function()
    local live = backend("live")
    local dead = "127.0.0.1:" .. H.free_port()
    local up = netrun.http.upstream { servers = { dead, live.addr }, retries = 1 }
    local ok, e = pcall(H.sync, client:request { upstream = up, method = "POST", path = "/p",
                                                 body = "once" }, 10)
    assert.is_false(ok)
    assert.matches("connect", tostring(e))
    local s = up:status()
    assert.equal(0, s[2].requests)        -- not retried on the live one
    assert.is_false(s[1].up)              -- the dead one is out (fails = 1)
    -- another upstream, the dead one first again: the GET is retried
    up = netrun.http.upstream { servers = { dead, live.addr }, retries = 1 }
    local name, res = get(up)
    assert.equal("live", name, tostring(res))
    s = up:status()
    assert.same({ 1, 1 }, { s[1].requests, s[2].requests })
    H.stop(live.pid)
  end)

  it("is one pool for every loop: a failure seen on one loop takes the server out for all", function()
    local live = backend("live")
    local dead = "127.0.0.1:" .. H.free_port()
    local up = netrun.http.upstream { servers = { dead, live.addr }, retries = 1 }
    local g = netrun.group { threads = 2, name = "users" }
    local function on(loop)
      return H.on_loop(loop, function(u)
        local c = require("netrun").http.client { timeout = 5 }
        local res = c:request({ upstream = u, path = "/l" }):await()
        return res.headers["x-backend"] .. " " .. tostring(u:status()[1].up)
      end, up)
    end
    local l1, l2 = g:next(), g:next()
    assert.are_not.equal(l1, l2)
    assert.equal("live false", on(l1))   -- tried the dead one first, then the live one
    assert.equal("live false", on(l2))   -- its turn starts at the dead one: passed over
    local s = up:status()
    assert.same({ 1, 2 }, { s[1].requests, s[2].requests })
    H.shutdown(g)
    H.stop(live.pid)
  end)

  it("sticks a hash key to a server; least_conn prefers the idle server", function()
    local b = { backend("a"), backend("b"), backend("c") }
    local servers = { b[1].addr, b[2].addr, b[3].addr }
    local up = netrun.http.upstream { servers = servers, balance = "hash", hash = "X-User" }
    local by_user = {}
    for round = 1, 3 do
      for u = 1, 12 do
        local name = assert(get(up, "/h", { ["x-user"] = "user" .. u }))
        if round == 1 then by_user[u] = name else assert.equal(by_user[u], name) end
      end
    end
    local names = {}
    for _, n in ipairs(by_user) do names[n] = true end
    assert.truthy(next(names, next(names)), "12 keys spread over more than one server")
    -- a function of the request as the hash
    local fup = netrun.http.upstream { servers = servers, balance = "hash",
                                       hash = function(o) return o.path end }
    local first = get(fup, "/k")
    for _ = 1, 5 do assert.equal(first, (get(fup, "/k"))) end
    -- least_conn: while a slow request holds one server, the rest go to the idle ones
    local lc = netrun.http.upstream { servers = { b[1].addr, b[2].addr }, balance = "least_conn" }
    local pending = client:request { upstream = lc, path = "/slow" }
    H.eventually(function() return lc:status()[1].in_flight + lc:status()[2].in_flight == 1 end, 5)
    local busy = lc:status()[1].in_flight == 1 and "a" or "b"
    for _ = 1, 6 do assert.are_not.equal(busy, (get(lc, "/fast"))) end
    assert.equal(busy, H.sync(pending, 10).headers["x-backend"])
    for _, x in ipairs(b) do H.stop(x.pid) end
  end)

  it("retries past a backend that never answers (its timeout counts) and one that closes mid-response", function()
    local hold, cut, good = backend("hold", "--mode hold"), backend("cut", "--mode cut"), backend("good")
    local c = netrun.http.client { timeout = 0.3 * slow }
    local up = netrun.http.upstream { servers = { hold.addr, cut.addr, good.addr }, retries = 2 }
    local res = H.sync(c:request { upstream = up, path = "/x" }, 10)
    assert.equal("good", res.headers["x-backend"])
    local s = up:status()
    assert.same({ 1, 1, 1 }, { s[1].failures, s[2].failures, s[3].requests })
    assert.same({ false, false, true }, { s[1].up, s[2].up, s[3].up })
    -- a POST that met the cut backend is not sent again
    up = netrun.http.upstream { servers = { cut.addr, good.addr }, retries = 2 }
    local ok, e = pcall(H.sync, c:request { upstream = up, method = "POST", path = "/p", body = "x" }, 10)
    assert.is_false(ok)
    assert.matches("middle of a response", tostring(e))
    assert.equal(0, up:status()[2].requests)
    for _, x in ipairs { hold, cut, good } do H.stop(x.pid) end
  end)

  it("reaches https backends, verified against the CA given", function()
    local dir = H.tmpdir()
    assert(H.run("bash " .. H.root .. "/spec/fixtures/tls/make_certs.sh " .. dir))
    local b = backend("tls", "--tls " .. dir)
    local up = netrun.http.upstream { servers = { "https://127.0.0.1:" .. b.port },
                                      tls = netrun.tls.client { ca = dir .. "/ca.crt" } }
    assert.equal("tls", (get(up)))
    -- the system's CAs do not know this one: verification fails
    local bad = netrun.http.upstream { servers = { "https://127.0.0.1:" .. b.port }, retries = 0 }
    local name, err = get(bad)
    assert.is_nil(name)
    assert.matches("certificate", tostring(err))
    H.stop(b.pid)
  end)
end)

describe("netrun.options", function()
  it("returns every value of an option given several times, else the environment's, split at commas", function()
    local script = [[echo 'local n = require "netrun"; print(table.concat(n.options("backend"), ",") .. "|" .. tostring(n.option("backend")) .. "|" .. #n.options("none"))' | ]]
    local out = H.run(script .. "env -u BACKEND " .. H.BIN .. " - --backend a:1 --port 3 --backend=b:2 --backend")
    assert.equal("a:1,b:2|a:1|0\n", out)
    out = H.run(script .. "BACKEND='c:3, d:4' " .. H.BIN .. " -")
    assert.equal("c:3,d:4|c:3, d:4|0\n", out)
  end)
end)

describe("examples/proxy.lua with several --backend", function()
  it("answers every GET while a backend dies and comes back, 502 for a POST it cannot place", function()
    local b = { backend("a"), backend("b"), backend("c") }
    local port = H.free_port()
    local pid = proxy(port, string.format(
      "--backend %s --backend %s --backend %s --health-path /health --health-interval %g " ..
      "--retries 2 --timeout %g", b[1].addr, b[2].addr, b[3].addr, 0.2 * slow, 2 * slow))
    local pc = netrun.http.client { timeout = 5 * slow }
    local base = "http://127.0.0.1:" .. port
    local seen, failed = {}, 0
    local function load(n)
      for i = 1, n do
        local ok, res = pcall(H.sync, pc:request { url = base .. "/g" .. i }, 20)
        if ok and res.status == 200 then
          local name = res.headers["x-backend"]
          seen[name] = (seen[name] or 0) + 1
        else
          failed = failed + 1
        end
      end
    end
    load(30)
    for _, n in ipairs { "a", "b", "c" } do
      assert.is_true(seen[n] >= 8 and seen[n] <= 12, n .. ": " .. tostring(seen[n]))
    end
    kill(b[2])
    load(30)
    b[2] = backend("b", nil, b[2].port)
    seen = {}
    -- back within two intervals: requests reach it again
    H.eventually(function() load(3); return seen.b end, 5)
    assert.equal(0, failed)
    assert.truthy(seen.b)
    -- a POST whose backend is dead: 502, not sent to another (a proxy
    -- whose first pick is a dead backend: the live one would answer 200)
    local port2 = H.free_port()
    local pid2 = proxy(port2, string.format(
      "--backend 127.0.0.1:%d --backend %s --retries 2", H.free_port(), b[1].addr))
    local res = H.sync(pc:request { url = "http://127.0.0.1:" .. port2 .. "/p", method = "POST",
                                    body = "x" }, 20)
    assert.equal(502, res.status)
    local before = hits(b[1])
    res = H.sync(pc:request { url = "http://127.0.0.1:" .. port2 .. "/p", method = "POST",
                              body = "x" }, 20)
    assert.equal(before + 1, hits(b[1]))   -- the first POST never reached it
    assert.equal(200, res.status)          -- the dead one is out now
    assert.equal("a POST /p x", res.body)
    H.stop(pid2)
    -- a PUT whose first backend is dead goes to the other, body and all
    pid2 = proxy(port2, string.format(
      "--backend 127.0.0.1:%d --backend %s --retries 2", H.free_port(), b[1].addr))
    res = H.sync(pc:request { url = "http://127.0.0.1:" .. port2 .. "/u", method = "PUT",
                              body = "payload" }, 20)
    assert.equal(200, res.status)
    assert.equal("a PUT /u payload", res.body)
    H.stop(pid2)
    H.stop(pid)
    for _, x in ipairs(b) do if H.alive(x.pid) then H.stop(x.pid) end end
  end)

  it("streams by default: no GET of a bounded concurrent load fails while one of three backends is killed", function()
    local b = { backend("a"), backend("b"), backend("c") }
    local port = H.free_port()
    local pid, log = proxy(port, string.format("--backend %s --backend %s --backend %s " ..
      "--retries 2 --timeout %g", b[1].addr, b[2].addr, b[3].addr, 2 * slow))
    assert.matches("bodies streamed", H.read_file(log))
    local pc = netrun.http.client { timeout = 5 * slow, pool = 8 }
    local base = "http://127.0.0.1:" .. port
    -- a PUT's body goes on
    local res = H.sync(pc:request { url = base .. "/up", method = "PUT", body = "chunk" }, 20)
    assert.equal(200, res.status)
    assert.matches("PUT /up chunk$", res.body)
    local failed, seen, answered = 0, {}, 0
    for round = 1, 24 do                     -- 8 in flight at a time
      if round == 7 then os.execute("kill -KILL " .. b[2].pid) end
      local fs = {}
      for i = 1, 8 do fs[i] = pc:request { url = base .. "/g" .. round .. "-" .. i } end
      for i = 1, 8 do
        local ok, r = pcall(H.sync, fs[i], 20)
        if ok and r.status == 200 then
          answered = answered + 1
          seen[r.headers["x-backend"]] = true
        else
          failed = failed + 1
          print(ok and r.status or r)
        end
      end
    end
    assert.equal(0, failed)
    assert.equal(192, answered)
    assert.same({ a = true, b = true, c = true }, seen)
    H.stop(pid)
  end)

  it("streamed: a backend cut after its head closes the client's connection and is not retried", function()
    local cut, good = backend("cut", "--mode cut"), backend("good")
    local port = H.free_port()
    local pid = proxy(port, string.format("--backend %s --backend %s --retries 2 --timeout %g",
                                          cut.addr, good.addr, 2 * slow))
    local pc = netrun.http.client { timeout = 5 * slow }
    local ok, e = pcall(H.sync, pc:request { url = "http://127.0.0.1:" .. port .. "/x" }, 20)
    assert.is_false(ok)                      -- the head came, then the end
    assert.matches("middle of a response", tostring(e))
    assert.equal(0, hits(good))              -- not sent again: its head had gone on
    -- the cut counted against its backend (fails = 1): the next GET goes to good
    local res = H.sync(pc:request { url = "http://127.0.0.1:" .. port .. "/y" }, 20)
    assert.equal("good", res.headers["x-backend"])
    H.stop(pid)
  end)

  it("reaches an https backend verified with --backend-ca, and sticks a hash key", function()
    local dir = H.tmpdir()
    assert(H.run("bash " .. H.root .. "/spec/fixtures/tls/make_certs.sh " .. dir))
    local t, a = backend("tls", "--tls " .. dir), backend("a")
    local port = H.free_port()
    local pid = proxy(port, string.format(
      "--backend https://127.0.0.1:%d --backend %s --backend-ca %s --balance hash " ..
      "--hash-header x-user", t.port, a.addr, dir .. "/ca.crt"))
    local pc = netrun.http.client { timeout = 5 * slow }
    local names = {}
    for u = 1, 8 do
      for _ = 1, 3 do
        local res = H.sync(pc:request { url = "http://127.0.0.1:" .. port .. "/h",
                                        headers = { ["x-user"] = "u" .. u } }, 20)
        assert.equal(200, res.status)
        names[u] = names[u] or res.headers["x-backend"]
        assert.equal(names[u], res.headers["x-backend"])
      end
    end
    local got = {}
    for _, n in ipairs(names) do got[n] = true end
    assert.same({ tls = true, a = true }, got)
    H.stop(pid)
    H.stop(t.pid)
    H.stop(a.pid)
  end)
end)
