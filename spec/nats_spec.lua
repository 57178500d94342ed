-- nats_spec.lua -- netrun.nats (DESIGN.md §9.5) against Debian's
-- nats-server, started here once for the file (a plain server with a
-- small max_payload and its monitoring port, one with a user and
-- password, one with a token, one with TLS), and against scripted fake
-- servers (netrun stream servers in this process) for what a real server
-- does not do on demand: stop answering PINGs, close in the middle of a
-- message, send sizes past the limits, garbage, -ERR, new INFO, a slow
-- drip.
local H = require "spec.helper"
local N = require "nats_server"
local netrun = H.netrun

local on_loop = N.on_loop

describe("netrun.nats against nats-server", function()
  local group, loop, dir, main, auth, token, tls
  setup(function()
    group = netrun.group { threads = 2, name = "nats" }
    loop = group:next()
    dir = H.tmpdir()
    assert(H.run("bash " .. H.root .. "/spec/fixtures/tls/make_certs.sh " .. dir))
    main = N.start { dir = dir, name = "main", config = "max_payload: 65536\n" }
    auth = N.start { dir = dir, name = "auth",
                     config = "authorization { user: alice, password: \"s3 cret\" }\n" }
    token = N.start { dir = dir, name = "token", config = "authorization { token: t0ken }\n" }
    tls = N.start { dir = dir, name = "tls", config = string.format(
      "tls { cert_file: \"%s/server.crt\", key_file: \"%s/server.key\" }\n", dir, dir) }
  end)
  teardown(function()
    for _, s in ipairs { main, auth, token, tls } do N.stop(s) end
    H.shutdown(group)
    os.execute("rm -rf " .. dir)
  end)

  it("publishes and subscribes: wildcards, order, headers, on the loop that subscribed", function()
    local got = on_loop(loop, function(port)
      local nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. port })
      local seen, done, here = {}, netrun.promise(), netrun.current()
      local wrong_loop = 0
      nc:subscribe("spec.ps.>", function(m)
        if netrun.current() ~= here then wrong_loop = wrong_loop + 1 end
        seen[#seen + 1] = { m.subject, m.data, m.headers and m.headers["X-Trace"] or false,
                            m.headers and m.headers.Multi or false }
        if #seen == 101 then done:try_success() end
      end)
      local it = nc:subscribe("spec.ps.n.*")      -- an iterator beside the callback
      for i = 1, 100 do assert(nc:publish("spec.ps.n." .. i, "m" .. i)) end
      assert(nc:publish("spec.ps.h", "with headers", nil,
                        { ["X-Trace"] = "abc", Multi = { "one", "two" } }))
      assert(nc:flush())
      done:await()
      local first3 = {}
      for m in it:messages() do
        first3[#first3 + 1] = m.data
        if #first3 == 3 then break end
      end
      local st = nc:stats()
      nc:close()
      return { seen = seen, wrong_loop = wrong_loop, st = st, status = nc:status(),
               first3 = first3 }
    end, main.port)
    assert.equal(101, #got.seen)
    for i = 1, 100 do assert.same({ "spec.ps.n." .. i, "m" .. i, false, false }, got.seen[i]) end
    assert.same({ "spec.ps.h", "with headers", "abc", { "one", "two" } }, got.seen[101])
    assert.equal(0, got.wrong_loop)
    assert.equal(101, got.st.out_msgs)
    assert.equal(201, got.st.in_msgs)
    assert.same({ "m1", "m2", "m3" }, got.first3)
    assert.equal("closed", got.status)
  end)

  it("queue groups share the messages; UNSUB and max stop delivery", function()
    local got = on_loop(loop, function(port)
      local url = "nats://127.0.0.1:" .. port
      local a, b = assert(netrun.nats.connect { url = url }), assert(netrun.nats.connect { url = url })
      local counts = { q1 = 0, q2 = 0, q3 = 0, all = 0, max = 0, unsub = 0 }
      local function count(k) return function() counts[k] = counts[k] + 1 end end
      a:subscribe("spec.q", count("q1"), { queue = "workers" })
      a:subscribe("spec.q", count("q2"), { queue = "workers" })
      b:subscribe("spec.q", count("q3"), { queue = "workers" })
      b:subscribe("spec.q", count("all"))
      local capped = b:subscribe("spec.q", count("max"), { max = 5 })
      local gone = b:subscribe("spec.q", count("unsub"))
      assert(a:flush())
      assert(b:flush())
      assert(gone:unsubscribe())
      for i = 1, 300 do a:publish("spec.q", tostring(i)) end
      assert(a:flush())
      assert(b:flush())
      counts.capped_delivered = capped:delivered()
      a:close()
      b:close()
      return counts
    end, main.port)
    assert.equal(300, got.q1 + got.q2 + got.q3)
    assert.is_true(got.q1 > 0 and got.q2 > 0 and got.q3 > 0)
    assert.equal(300, got.all)
    assert.equal(5, got.max)
    assert.equal(5, got.capped_delivered)
    assert.equal(0, got.unsub)
  end)

  it("request/reply: one inbox subscription serves concurrent requests; callbacks may wait", function()
    local got = on_loop(loop, function(port, monitor)
      local url = "nats://127.0.0.1:" .. port
      local svc = assert(netrun.nats.connect { url = url, name = "spec-svc" })
      svc:subscribe("spec.svc.upper", function(m) m:respond(m.data:upper()) end)
      -- a callback that itself waits on a request before answering
      svc:subscribe("spec.svc.chain", function(m)
        local r = assert(svc:request("spec.svc.upper", m.data))
        m:respond("chained " .. r.data)
      end)
      svc:subscribe("spec.svc.mute", function() end)
      assert(svc:flush())
      local nc = assert(netrun.nats.connect { url = url, name = "spec-req" })
      local futures = {}
      for i = 1, 50 do
        futures[i] = netrun.spawn(function()
          local r = assert(nc:request("spec.svc.upper", "abc" .. i, { timeout = 5 }))
          return r.data
        end)
      end
      local answers = netrun.all(futures):await()
      local chained = assert(nc:request("spec.svc.chain", "x"))
      -- a reply is plain data: it may leave its coroutine as a spawn's result
      local copied = netrun.spawn(function() return nc:request("spec.svc.upper", "copy") end):await()
      local copied_ok = copied.data == "COPY" and copied.respond == netrun.nats.Msg.respond
      local leak = netrun.spawn(function() return nc end)
      local leak_err = select(2, pcall(leak.await, leak))
      local t0 = netrun.now()
      local none, none_err = nc:request("spec.svc.nobody", "x", { timeout = 5 })
      local none_took = netrun.now() - t0
      local mute, mute_err = nc:request("spec.svc.mute", "x", { timeout = 0.2 })
      -- deadlines out of order: each request times out at its own
      local order, t1 = {}, netrun.now()
      local waits = {}
      for _, t in ipairs { 0.3, 0.1, 0.2 } do
        waits[#waits + 1] = netrun.spawn(function()
          local r, e = nc:request("spec.svc.mute", "x", { timeout = t })
          order[#order + 1] = { t, e, netrun.now() - t1 }
        end)
      end
      netrun.all(waits):await()
      -- the server's view of this client: its subscriptions
      local res = netrun.http.request { url = "http://127.0.0.1:" .. monitor ..
                                              "/connz?subs=1" }:await()
      local subs
      for _, c in ipairs(netrun.json.decode(res.body).connections) do
        if c.name == "spec-req" then subs = c.subscriptions_list end
      end
      nc:close()
      svc:close()
      return { answers = answers, chained = chained.data, copied_ok = copied_ok, leak_err = leak_err,
               none = none, none_err = none_err,
               none_took = none_took, mute = mute, mute_err = mute_err, subs = subs,
               order = order }
    end, main.port, main.monitor)
    for i = 1, 50 do assert.equal("ABC" .. i, got.answers[i]) end
    assert.equal("chained X", got.chained)
    assert.is_true(got.copied_ok)
    assert.matches("cannot transfer a netrun.nats.connection", got.leak_err)
    assert.is_nil(got.none)
    assert.equal("no responders", got.none_err)
    assert.is_true(got.none_took < 1)
    assert.is_nil(got.mute)
    assert.equal("timeout", got.mute_err)
    for i, t in ipairs { 0.1, 0.2, 0.3 } do
      assert.equal(t, got.order[i][1])
      assert.equal("timeout", got.order[i][2])
      assert.is_true(got.order[i][3] >= t and got.order[i][3] < t + 0.5, got.order[i][3])
    end
    assert.equal(1, #got.subs)
    assert.matches("^_INBOX%.[%w]+%.%*$", got.subs[1])
  end)

  it("outside a coroutine, request, flush and connect return futures", function()
    local f = H.sync(loop:submit(function(port)
      local p = netrun.promise()
      netrun.nats.connect { url = "nats://127.0.0.1:" .. port }:add_listener(function(cf)
        local nc = cf:result()
        nc:subscribe("spec.fut", function(m) m:respond("pong") end)
        local ff = nc:flush()
        local kind = tostring(ff):match("^netrun%.future") and "future" or type(ff)
        nc:request("spec.fut", "ping"):add_listener(function(rf)
          p:try_success({ kind = kind, data = rf:result().data })
          nc:close()
        end)
      end)
      return p
    end, main.port))
    local got = H.sync(f)
    assert.same({ kind = "future", data = "pong" }, got)
  end)

  it("authenticates with a user and password, or a token, and fails with the server's reason", function()
    local got = on_loop(loop, function(ap, tp)
      local out = {}
      local nc = netrun.nats.connect { url = "nats://alice:s3%20cret@127.0.0.1:" .. ap }
      out.url_auth = nc and nc:status()
      if nc then nc:close() end
      nc = netrun.nats.connect { url = "nats://127.0.0.1:" .. ap, user = "alice", pass = "s3 cret" }
      out.opt_auth = nc and nc:status()
      if nc then nc:close() end
      nc = netrun.nats.connect { url = "nats://t0ken@127.0.0.1:" .. tp }
      out.url_token = nc and nc:status()
      if nc then nc:close() end
      nc = netrun.nats.connect { url = "nats://127.0.0.1:" .. tp, token = "t0ken" }
      out.opt_token = nc and nc:status()
      if nc then nc:close() end
      out.bad, out.bad_err = netrun.nats.connect { url = "nats://alice:wrong@127.0.0.1:" .. ap }
      out.none, out.none_err = netrun.nats.connect { url = "nats://127.0.0.1:" .. tp }
      return out
    end, auth.port, token.port)
    assert.equal("connected", got.url_auth)
    assert.equal("connected", got.opt_auth)
    assert.equal("connected", got.url_token)
    assert.equal("connected", got.opt_token)
    assert.is_nil(got.bad)
    assert.matches("Authorization Violation", got.bad_err)
    assert.is_nil(got.none)
    assert.matches("Authorization Violation", got.none_err)
  end)

  it("speaks TLS after INFO, verifying the server's certificate", function()
    local got = on_loop(loop, function(port, d)
      local out = {}
      local ca = netrun.tls.client { ca = d .. "/ca.crt" }
      local nc = assert(netrun.nats.connect { url = "tls://127.0.0.1:" .. port, tls = ca })
      local r = nc:subscribe("spec.tls", function(m) m:respond("secret " .. m.data) end)
      out.reply = assert(nc:request("spec.tls", "x")).data
      out.tls_required = nc:server_info().tls_required
      nc:close()
      -- nats:// to a server that requires TLS: the client upgrades
      nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. port, tls = ca })
      out.upgraded = nc:status()
      nc:close()
      out.untrusted, out.untrusted_err = netrun.nats.connect {
        url = "tls://127.0.0.1:" .. port, tls = netrun.tls.client { ca = d .. "/other-ca.crt" } }
      out.plain, out.plain_err = netrun.nats.connect { url = "nats://127.0.0.1:" .. port,
                                                       tls = false }
      return out
    end, tls.port, dir)
    assert.equal("secret x", got.reply)
    assert.is_true(got.tls_required)
    assert.equal("connected", got.upgraded)
    assert.is_nil(got.untrusted)
    assert.matches("certificate", got.untrusted_err)
    assert.is_nil(got.plain)
    assert.matches("requires TLS", got.plain_err)
  end)

  it("refuses a publication over the server's max_payload, and takes one at it", function()
    local got = on_loop(loop, function(port)
      local nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. port })
      local sizes = {}
      nc:subscribe("spec.big", function(m) sizes[#sizes + 1] = #m.data end)
      local ok, err = nc:publish("spec.big", string.rep("x", 65537))
      local hok, herr = nc:publish("spec.big", string.rep("x", 65530), nil, { ["X-Pad"] = "yy" })
      assert(nc:publish("spec.big", string.rep("x", 65536)))
      assert(nc:flush())
      local info = nc:server_info().max_payload
      nc:close()
      return { ok = ok, err = err, hok = hok, herr = herr, sizes = sizes, info = info }
    end, main.port)
    assert.equal(65536, got.info)
    assert.is_nil(got.ok)
    assert.matches("maximum payload exceeded", got.err)
    assert.is_nil(got.hok)                 -- headers count against it too
    assert.matches("maximum payload exceeded", got.herr)
    assert.same({ 65536 }, got.sizes)
  end)

  it("raises for programming errors", function()
    local got = on_loop(loop, function(port)
      local nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. port })
      local out = {}
      out[1] = select(2, pcall(function() nc:publish("has space", "x") end))
      out[2] = select(2, pcall(function() nc:publish("ok", "x", "bad\r\nreply") end))
      out[3] = select(2, pcall(nc.subscribe, nc, "", function() end))
      out[4] = select(2, pcall(nc.subscribe, nc, "a", function() end, { qeue = "x" }))
      out[5] = select(2, pcall(netrun.nats.connect, { url = "nats://x", timeuot = 1 }))
      out[6] = select(2, pcall(nc.publish, nc, "a", "x", nil, { ["bad name"] = "v" }))
      nc:close()
      out[7] = select(2, nc:publish("a", "x"))
      return out
    end, main.port)
    assert.matches("spec/nats_spec.lua:%d+: netrun.nats: publish: the subject", got[1])
    assert.matches("reply subject", got[2])
    assert.matches("the subject must be a non%-empty string", got[3])
    assert.matches("unknown option 'qeue'", got[4])
    assert.matches("unknown option 'timeuot'", got[5])
    assert.matches("header name", got[6])
    assert.equal("closed", got[7])
  end)

  it("bounds a slow consumer: past pending_msgs messages are dropped, counted and reported once", function()
    local got = on_loop(loop, function(port)
      local errors = {}
      local nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. port,
        on_error = function(_, err) errors[#errors + 1] = err end })
      local gate, seen = netrun.promise(), 0
      local sub = nc:subscribe("spec.slow", function()
        seen = seen + 1
        if seen == 1 then gate:await() end     -- the callback waits: messages queue
      end, { pending_msgs = 10 })
      local it = nc:subscribe("spec.slow", { pending_bytes = 100 })   -- an iterator nobody reads
      for i = 1, 100 do nc:publish("spec.slow", string.format("%010d", i)) end
      assert(nc:flush())
      local out = { pending = sub:pending(), dropped = sub:dropped(),
                    it_pending = select(2, it:pending()), it_dropped = it:dropped(),
                    errors = #errors, first = errors[1] }
      gate:try_success()
      assert(nc:flush())
      out.seen = seen
      local first = it:next(1)
      out.it_first = first and first.data
      nc:close()
      out.after_close = select(2, it:next(1))
      return out
    end, main.port)
    assert.equal(10, got.pending)
    assert.equal(89, got.dropped)          -- 1 in the callback, 10 queued
    assert.equal(11, got.seen)
    assert.equal(100, got.it_pending)      -- 10 messages of 10 bytes
    assert.equal(90, got.it_dropped)
    assert.equal(2, got.errors)            -- once per subscription
    assert.matches("slow consumer", got.first)
    assert.equal("0000000001", got.it_first)
    assert.equal("closed", got.after_close)
  end)

  it("drain: queued messages are still delivered, then the connection closes", function()
    local got = on_loop(loop, function(port)
      local nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. port })
      local seen = {}
      nc:subscribe("spec.drain", function(m)
        netrun.sleep(0.01)
        seen[#seen + 1] = m.data
      end)
      assert(nc:flush())
      local pub = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. port })
      for i = 1, 5 do pub:publish("spec.drain", tostring(i)) end
      assert(pub:flush())
      local ok, err = nc:drain()
      local late = select(2, nc:publish("spec.drain", "late"))
      pub:close()
      return { ok = ok, err = err, seen = seen, status = nc:status(), late = late }
    end, main.port)
    assert.is_true(got.ok, got.err)
    assert.same({ "1", "2", "3", "4", "5" }, got.seen)
    assert.equal("closed", got.status)
    assert.equal("closed", got.late)
  end)

  it("a nats-server restart loses no publication made during the outage", function()
    local here = group:next()
    on_loop(here, function(port)
      local S = { count = 0, down = netrun.promise(), up = netrun.promise() }
      rawset(_G, "spec_restart", S)
      S.nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. port,
        reconnect_wait = 0.05, max_reconnects = -1,
        on_disconnect = function() S.down:try_success() end,
        on_reconnect = function() S.up:try_success() end })
      S.nc:subscribe("spec.restart", function() S.count = S.count + 1 end)
      assert(S.nc:flush())
    end, main.port)
    N.stop(main)                                  -- SIGTERM: connections closed
    local during = on_loop(here, function()
      local S = rawget(_G, "spec_restart")
      S.down:await()
      for i = 1, 1000 do assert(S.nc:publish("spec.restart", "during " .. i)) end
      return { status = S.nc:status(), held = S.nc:stats().buffered }
    end)
    assert.equal("reconnecting", during.status)
    assert.is_true(during.held > 1000 * 20)
    N.restart(main)
    local after = on_loop(here, function()
      local S = rawget(_G, "spec_restart")
      S.up:await()
      assert(S.nc:flush())
      local out = { count = S.count, reconnects = S.nc:stats().reconnects,
                    held = S.nc:stats().buffered }
      S.nc:close()
      return out
    end)
    assert.equal(1000, after.count)
    assert.equal(1, after.reconnects)
    assert.equal(0, after.held)
  end)

  it("examples/nats_chat.lua: two processes, one chat, rooms apart", function()
    local pa, pb = N.port(), N.port()
    local nats_url = "--nats nats://127.0.0.1:" .. main.port
    local a = H.start("examples/nats_chat.lua", pa, nats_url .. " --name A")
    local b = H.start("examples/nats_chat.lua", pb, nats_url .. " --name B")
    finally(function() H.stop(a); H.stop(b) end)
    local function line(c)
      return assert(c:receive("*l"))
    end
    local ann, bob, cy, dee = H.client(pa), H.client(pb), H.client(pb), H.client(pa)
    for _, c in ipairs { ann, bob, cy, dee } do assert.matches("^welcome", line(c)) end
    local function skip_to(c, want)          -- past join/leave notices
      for _ = 1, 20 do
        local l = line(c)
        if l == want then return end
        assert.matches("^%* ", l)
      end
      error("never saw " .. want)
    end
    local function say(c, text, want)
      c:send(text .. "\n")
      if want then skip_to(c, want) end
    end
    say(ann, "/nick ann", "* you are ann")
    say(bob, "/nick bob", "* you are bob")
    say(cy, "/nick cy", "* you are cy")
    say(dee, "/nick dee", "* you are dee")
    say(cy, "/join other", "* you are in other")
    say(dee, "/join other", "* you are in other")
    say(ann, "hello from A")
    skip_to(bob, "ann: hello from A")           -- A to B, through NATS
    say(bob, "hi from B")
    skip_to(ann, "bob: hi from B")
    say(dee, "in other")                         -- A's other room reaches B's cy
    skip_to(cy, "dee: in other")                 -- ... and the lobby's lines did not
    say(cy, "/quit")
    skip_to(dee, "* cy left")
    for _, c in ipairs { ann, bob, dee } do c:close() end
  end)

  it("past `buffer` bytes during an outage, publish returns nil, err", function()
    local got = on_loop(loop, function()
      -- no server: the first connect fails; a connection that was up and
      -- lost is what holds publications, so use a fake that lets go
      local srv = netrun.server { group = netrun.current(), host = "127.0.0.1", port = 0,
        stream = function(s)
          s:send('INFO {"server_id":"f","max_payload":1048576}\r\n')
          s:receive("*l"); s:receive("*l")
          s:send("PONG\r\n")
          s:receive("*l")                          -- the test's flush PING
          s:send("PONG\r\n")
        end }:await()
      local _, port = srv:local_address()
      local down = netrun.promise()
      local nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. port,
        buffer = 1000, reconnect_wait = 30, on_disconnect = function() down:try_success() end })
      assert(nc:flush())
      down:await()
      local n, err = 0, nil
      while n < 100 do
        local ok, e = nc:publish("spec.buf", string.rep("x", 50))
        if not ok then err = e break end
        n = n + 1
      end
      nc:close()
      srv:close()
      return { n = n, err = err }
    end)
    assert.equal(14, got.n)                 -- 14 x 69 bytes fit in 1000
    assert.equal("reconnect buffer full", got.err)
  end)
end)

-- ---- broken and hostile servers --------------------------------------------

-- A fake NATS server: script(s, n, dict) runs for each connection (n: its
-- number, from 1), in a coroutine on the group's loop.
local fakes = 0
local function fake(group, script)
  fakes = fakes + 1
  local name = "spec_nats_fake_" .. fakes
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0,
    stream = function(s)
      local d = netrun.shared.dict(name)
      script(s, d:incr("conns", 1, 0), d)
    end,
  }:sync()
  local _, port = server:local_address()
  return server, port, netrun.shared.dict(name), name
end

-- The server half of a handshake: INFO, then CONNECT and PING read, PONG.
local function hello(s, extra)
  s:send('INFO {"server_id":"FAKE","version":"2.9.10","proto":1,"headers":true,' ..
    '"max_payload":1048576' .. (extra or "") .. '}\r\n')
  local connect, ping = s:receive("*l"), s:receive("*l")
  if not connect or ping ~= "PING" then return nil end
  s:send("PONG\r\n")
  return connect
end

-- Read lines until the peer closes (answering PINGs when asked).
local function hold(s, pong)
  while true do
    local line = s:receive("*l")
    if not line then return end
    if pong and line == "PING" then s:send("PONG\r\n") end
  end
end

describe("netrun.nats against broken and hostile servers", function()
  local group, loop
  setup(function()
    group = netrun.group { threads = 2, name = "nats-bad" }
    loop = group:next()
  end)
  teardown(function() H.shutdown(group) end)

  it("drops a server that stops answering PINGs, and reconnects", function()
    local server, port, d, name = fake(group, function(s, n, d)
      hello(s)
      if n == 1 then
        hold(s, false)                    -- reads everything, answers nothing
      else
        while true do
          local line = s:receive("*l")
          if not line then return end
          if line == "PING" then d:incr("pongs", 1, 0); s:send("PONG\r\n") end
        end
      end
    end)
    local got = on_loop(loop, function(p, dict)
      local lost = netrun.promise()
      local t0 = netrun.now()
      local nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. p,
        ping_interval = 0.1, max_pings_out = 2, reconnect_wait = 0.05,
        on_disconnect = function(_, err) lost:try_success(err) end })
      local err = lost:await()
      local took = netrun.now() - t0
      -- the second connection answers: keepalive goes on, nothing is dropped
      local pongs = netrun.shared.dict(dict)
      while (pongs:get("pongs") or 0) < 5 do netrun.sleep(0.05) end
      local out = { err = err, took = took, status = nc:status(),
                    reconnects = nc:stats().reconnects }
      nc:close()
      return out
    end, port, name)
    assert.matches("stale connection", got.err)
    assert.is_true(got.took < 2, got.took)
    assert.equal("connected", got.status)
    assert.equal(1, got.reconnects)
    assert.equal(2, d:get("conns"))
    server:close():sync()
  end)

  it("a server that closes in the middle of a message: nothing half delivered, the next whole", function()
    local server, port = fake(group, function(s, n)
      hello(s)
      s:receive("*l")                           -- SUB spec.mid 1
      if n == 1 then
        s:send("MSG spec.mid 1 10\r\nabc")        -- 3 of 10 bytes, then gone
        s:close()
      else
        s:send("MSG spec.mid 1 5\r\nwhole\r\n")
        hold(s, true)
      end
    end)
    local got = on_loop(loop, function(p)
      local errs, seen, done = {}, {}, netrun.promise()
      local nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. p,
        reconnect_wait = 0.05, on_disconnect = function(_, err) errs[#errs + 1] = err end })
      nc:subscribe("spec.mid", function(m)
        seen[#seen + 1] = m.data
        done:try_success()
      end)
      done:await()
      local out = { errs = errs, seen = seen, reconnects = nc:stats().reconnects }
      nc:close()
      return out
    end, port)
    assert.same({ "whole" }, got.seen)
    assert.equal(1, got.reconnects)
    assert.equal(1, #got.errs)
    server:close():sync()
  end)

  it("a size past max_message ends the connection before any payload is kept", function()
    local server, port = fake(group, function(s, n)
      hello(s)
      s:receive("*l")
      if n == 1 then
        s:send("MSG spec.huge 1 99999999999\r\n")     -- 100 GB, says the server
        hold(s)
      elseif n == 2 then
        s:send("MSG spec.huge 1 2000\r\n" .. string.rep("y", 2000) .. "\r\n")  -- past 1000
        hold(s)
      else
        s:send("MSG spec.huge 1 2\r\nok\r\n")
        hold(s, true)
      end
    end)
    local got = on_loop(loop, function(p)
      local errs, done = {}, netrun.promise()
      local nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. p,
        max_message = 1000, reconnect_wait = 0.05,
        on_disconnect = function(_, err) errs[#errs + 1] = err end })
      nc:subscribe("spec.huge", function(m) done:try_success(m.data) end)
      local data = done:await()
      nc:close()
      return { errs = errs, data = data }
    end, port)
    assert.equal("ok", got.data)
    assert.equal(2, #got.errs)
    assert.matches("max_message", got.errs[1])
    assert.matches("max_message", got.errs[2])
    server:close():sync()
  end)

  it("garbage: no INFO fails the connect; after the handshake, reconnects are paced", function()
    local server, port, d = fake(group, function(s, n)
      if n == 1 then
        s:send("\0\255HELLO WORLD\r\n")
        hold(s)
        return
      end
      hello(s)
      s:send("NOT NATS AT ALL\r\n")
      hold(s)
    end)
    local got = on_loop(loop, function(p)
      local out = {}
      out.first, out.first_err = netrun.nats.connect { url = "nats://127.0.0.1:" .. p }
      local errs, t0 = {}, nil
      local three = netrun.promise()
      local nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. p,
        reconnect_wait = 0.2, reconnect_jitter = 0,
        on_disconnect = function(_, err)
          errs[#errs + 1] = err
          if #errs == 1 then t0 = netrun.now() end
          if #errs == 3 then three:try_success(netrun.now() - t0) end
        end })
      out.between = three:await()
      out.errs = errs
      nc:close()
      return out
    end, port)
    assert.is_nil(got.first)
    assert.matches("NATS protocol error: unknown protocol operation", got.first_err)
    assert.matches("unknown protocol operation", got.errs[1])
    assert.is_true(got.between >= 0.35, got.between)     -- 2 waits of 0.2 s
    server:close():sync()
  end)

  it("-ERR: fails the handshake; a permissions violation is reported; others drop the link", function()
    local server, port = fake(group, function(s, n)
      if n == 1 then
        s:send('INFO {"server_id":"FAKE","max_payload":1048576,"auth_required":true}\r\n')
        s:receive("*l"); s:receive("*l")
        s:send("-ERR 'Authorization Violation'\r\n")
        s:close()
        return
      end
      hello(s)
      if n == 2 then
        s:send("-ERR 'Permissions Violation for Publish to \"spec.denied\"'\r\n")
        hold(s, true)
      else
        s:send("-ERR 'Maximum Connections Exceeded'\r\n")
        s:close()
      end
    end)
    local got = on_loop(loop, function(p)
      local out = {}
      out.first, out.first_err = netrun.nats.connect { url = "nats://127.0.0.1:" .. p }
      local errors, lost = {}, netrun.promise()
      local nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. p,
        reconnect = false, on_error = function(_, err) errors[#errors + 1] = err end,
        on_closed = function(_, err) lost:try_success(err) end })
      out.flushed = nc:flush()
      out.status = nc:status()
      out.errors = errors
      nc:close()
      lost = netrun.promise()
      nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. p, reconnect = false,
        on_error = function() end, on_closed = function(_, err) lost:try_success(err) end })
      out.closed_err = lost:await()
      return out
    end, port)
    assert.is_nil(got.first)
    assert.equal("Authorization Violation", got.first_err)
    assert.is_true(got.flushed)
    assert.equal("connected", got.status)
    assert.matches('^Permissions Violation for Publish to "spec.denied"$', got.errors[1])
    assert.equal("Maximum Connections Exceeded", got.closed_err)
    server:close():sync()
  end)

  it("INFO changes: connect_urls join the pool (bounded), a new max_payload applies", function()
    local other, other_port, od = fake(group, function(s)
      hello(s)
      hold(s, true)
    end)
    local urls = { '"127.0.0.1:' .. other_port .. '"' }
    for i = 1, 500 do urls[#urls + 1] = '"10.0.' .. (i // 250) .. '.' .. (i % 250) .. ':4222"' end
    local update = 'INFO {"server_id":"FAKE","max_payload":100,"connect_urls":[' ..
      table.concat(urls, ",") .. ']}\r\n'
    local server, port = fake(group, function(s, n)
      if n > 1 then return end                  -- gone for good after the first
      hello(s)
      s:send(update)
      while true do
        local line = s:receive("*l")
        if not line then return end
        if line == "PING" then s:send("PONG\r\n") end
        if line:find("^PUB spec.bye") then return end     -- the client asked us to go
      end
    end)
    local got = on_loop(loop, function(p)
      local back = netrun.promise()
      local nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. p,
        reconnect_wait = 0.05, on_reconnect = function() back:try_success() end })
      assert(nc:flush())                        -- the new INFO came before the PONG
      local out = { max_payload = nc:server_info().max_payload, pool = #nc:servers() }
      out.big, out.big_err = nc:publish("spec.x", string.rep("z", 101))
      nc:publish("spec.bye", "")
      back:await()
      out.now = nc:connected_server()
      nc:close()
      return out
    end, port)
    assert.equal(100, got.max_payload)
    assert.equal(64, got.pool)                  -- max_servers
    assert.is_nil(got.big)
    assert.matches("maximum payload exceeded", got.big_err)
    assert.equal("127.0.0.1:" .. other_port, got.now)
    assert.equal(1, od:get("conns"))
    server:close():sync()
    other:close():sync()
  end)

  it("a server that stops reading: publications are held up to `buffer`, then refused", function()
    local server, port = fake(group, function(s)
      hello(s)
      netrun.sleep(30)                          -- reads nothing more
    end)
    local got = on_loop(loop, function(p)
      local nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. p,
        buffer = 64 * 1024, flush_timeout = 0.3 })
      local chunk, sent, err = string.rep("z", 1024), 0, nil
      while sent < 512 * 1024 * 1024 do
        local ok, e = nc:publish("spec.flood", chunk)
        if not ok then err = e break end
        sent = sent + #chunk
      end
      -- outside a coroutine (a task on the loop) it does not wait
      local outside = netrun.current():submit(function(c, data)
        for _ = 1, 100 do
          local ok, e = c:publish("spec.flood", data)
          if not ok then return e end
        end
      end, nc, chunk):await()
      local out = { sent = sent, err = err, outside = outside, held = nc:stats().buffered,
                    status = nc:status() }
      nc:close()
      return out
    end, port)
    assert.equal("write buffer full (timeout)", got.err)
    assert.equal("write buffer full (the server does not read)", got.outside)
    assert.is_true(got.held <= 64 * 1024, got.held)
    assert.is_true(got.sent < 64 * 1024 * 1024, got.sent)    -- the kernel's buffers and ours
    assert.equal("connected", got.status)
    server:close():sync()
  end)

  it("a server that floods PINGs and reads nothing is dropped once `buffer` bytes of PONGs are held", function()
    local server, port = fake(group, function(s, n)
      hello(s)
      if n > 1 then return hold(s, true) end
      s:channel():option("rcvbuf", 4096)      -- the kernel holds little of the PONGs
      local pings = string.rep("PING\r\n", 10000)
      for _ = 1, 2000 do                       -- 120 MB of PINGs at most
        if not s:send(pings) then return end
      end
    end)
    local got = on_loop(loop, function(p)
      local lost = netrun.promise()
      local nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. p,
        buffer = 256 * 1024, reconnect_wait = 0.05, options = { sndbuf = 4096 },
        on_disconnect = function(_, err) lost:try_success(err) end })
      local err = lost:await()
      local out = { err = err, held = nc:stats().buffered }
      nc:close()
      return out
    end, port)
    assert.matches("reads nothing", got.err)
    assert.is_true(got.held <= 256 * 1024, got.held)
    server:close():sync()
  end)

  it("a control line past max_control_line fails; a message dripped byte by byte arrives whole", function()
    local server, port = fake(group, function(s, n)
      if n == 1 then
        s:send("INFO {" .. string.rep("x", 70000))
        hold(s)
        return
      end
      hello(s)
      s:receive("*l")
      local msg = "MSG spec.drip 1 _INBOX.r 11\r\nhello world\r\n"
      for i = 1, #msg do
        s:send(msg:sub(i, i))
        netrun.sleep(0.002)
      end
      s:send("PING\r\n")
      local pong = s:receive("*l")               -- the client answers the server's PING
      s:send("MSG spec.drip 1 4\r\n" .. (pong == "PONG" and "pong" or "none") .. "\r\n")
      hold(s, true)
    end)
    local got = on_loop(loop, function(p)
      local out = {}
      out.first, out.first_err = netrun.nats.connect { url = "nats://127.0.0.1:" .. p }
      local seen, done = {}, netrun.promise()
      local nc = assert(netrun.nats.connect { url = "nats://127.0.0.1:" .. p })
      nc:subscribe("spec.drip", function(m)
        seen[#seen + 1] = m.data .. "|" .. tostring(m.reply)
        if #seen == 2 then done:try_success() end
      end)
      done:await()
      out.seen = seen
      nc:close()
      return out
    end, port)
    assert.is_nil(got.first)
    assert.matches("max_control_line", got.first_err)
    assert.same({ "hello world|_INBOX.r", "pong|nil" }, got.seen)
    server:close():sync()
  end)
end)
