-- redis_commands_spec.lua -- netrun.redis against a real redis-server
-- (Debian's, started here on loopback; spec/fixtures/redis_servers.lua),
-- checked with redis-cli, the independent client: commands as methods and
-- their replies, pipelines, many coroutines on one connection,
-- transactions with WATCH, scripts by SHA, pub/sub (RESP3 pushes and
-- RESP2), AUTH/SELECT from the URL, TLS (rediss://), RESP3 maps, blocking
-- commands, the main thread, and a server that stops answering.
local H = require "spec.helper"
local S = require "redis_servers"
local netrun = H.netrun

;(S.available() and describe or pending)("netrun.redis against redis-server", function()
  local srv, group, url

  setup(function()
    srv = S.standalone()
    url = "redis://127.0.0.1:" .. srv.port
    group = netrun.group { threads = 1, name = "redis-spec" }
  end)
  teardown(function()
    if group then H.shutdown(group) end
    if srv then srv.stop() end
  end)

  -- fn(...) in a coroutine on the group's loop; its result.
  local function on_loop(fn, ...)
    return H.sync(H.sync(group:submit(function(fn, ...)
      return require("netrun").spawn(fn, ...)
    end, fn, ...)), 30)
  end

  it("runs commands as methods: a value, nil for a missing key, nil and the error for an error reply", function()
    local r = on_loop(function(url)
      local netrun = require "netrun"
      local r = assert(netrun.redis.connect { url = url }:await())
      local out = {}
      out.set = r:set("cmd:a", "hello", "EX", 100)
      out.get = r:get("cmd:a")
      out.missing = { r:get("cmd:none") }
      out.num = { r:set("cmd:n", 41), r:incr("cmd:n"), r:incrbyfloat("cmd:f", 1.5) }
      out.wrongtype = { r:lpush("cmd:a", "x") }
      out.unknown = { r:call("NOSUCH", "x") }
      out.still = r:ping()
      out.list = { r:rpush("cmd:l", "a", "b", "c"), r:lrange("cmd:l", 0, -1) }
      out.mget = r:mget("cmd:a", "cmd:none", "cmd:n")
      out.bin = { r:set("cmd:bin", "a\r\n\0b"), r:get("cmd:bin") }
      return out
    end, url)
    assert.equal("OK", r.set)
    assert.equal("hello", r.get)
    assert.same({}, r.missing)                       -- nil and no error
    assert.same({ "OK", 42, "1.5" }, r.num)
    assert.is_nil(r.wrongtype[1])
    assert.matches("^WRONGTYPE", r.wrongtype[2])
    assert.is_nil(r.unknown[1])
    assert.matches("^ERR unknown command", r.unknown[2])
    assert.equal("PONG", r.still)
    assert.same({ 3, { "a", "b", "c" } }, r.list)
    assert.same({ "hello", netrun.redis.null, "42" }, r.mget)
    assert.same({ "OK", "a\r\n\0b" }, r.bin)
    -- what redis-cli sees
    assert.equal("hello", S.cli(srv.port, "GET cmd:a"))
    local ttl = tonumber((S.cli(srv.port, "TTL cmd:a")))
    assert.is_true(ttl > 90 and ttl <= 100, "TTL " .. tostring(ttl))
  end)

  it("raises at the caller's line for an argument that is not a string or a number", function()
    local err = on_loop(function(url)
      local r = require("netrun").redis.connect { url = url }
      local ok, e = pcall(function() return r:set("k", nil) end)
      return not ok and e
    end, url)
    assert.matches("redis_commands_spec%.lua:%d+: netrun%.redis: SET: argument 2 is a nil", err)
  end)

  it("pipelines: replies in order, nulls as netrun.redis.null, errors in their place", function()
    local res = on_loop(function(url)
      local r = require("netrun").redis.connect { url = url }
      return r:pipeline(function(p)
        p:set("pipe:a", "1")
        p:get("pipe:none")
        p:incr("pipe:a")
        p:hset("pipe:a", "f", "v")               -- wrong type: an error in the middle
        p:call("GET", "pipe:a")
        for i = 1, 100 do p:incr("pipe:c") end
      end)
    end, url)
    assert.equal(105, res.n)
    assert.equal("OK", res[1])
    assert.equal(netrun.redis.null, res[2])
    assert.equal(2, res[3])
    assert.is_true(netrun.redis.is_error(res[4]))
    assert.matches("^WRONGTYPE", tostring(res[4]))
    assert.equal("2", res[5])
    assert.equal(100, res[105])
  end)

  it("shares a connection between coroutines: each gets its own replies, in one write per turn", function()
    local out = on_loop(function(url)
      local netrun = require "netrun"
      local r = netrun.redis.connect { url = url, pool = 1 }
      local bad, futures = 0, {}
      for c = 1, 40 do
        futures[c] = netrun.spawn(function()
          for i = 1, 50 do
            local k = "share:" .. c .. ":" .. i
            if i % 5 == 0 then
              local res = r:pipeline(function(p) p:set(k, c * i) p:get(k) p:get("share:none") end)
              if res[2] ~= tostring(c * i) or res[3] ~= netrun.redis.null then bad = bad + 1 end
            else
              r:set(k, c * i)
              if r:get(k) ~= tostring(c * i) then bad = bad + 1 end
            end
          end
        end)
      end
      for _, f in ipairs(futures) do f:await() end
      return { bad = bad, stats = r:stats(), clients = r:client("LIST") }
    end, url)
    assert.equal(0, out.bad)
    assert.same({ shared = 1, idle = 0, bound = 0, unread = 0 }, out.stats)
    assert.equal("2000", S.cli(srv.port, "EVAL \"return #redis.call('keys', 'share:*')\" 0"))
  end)

  it("runs WATCH/MULTI/EXEC on a connection of the coroutine's own; a watched key changed aborts", function()
    local out = on_loop(function(url, port)
      local netrun = require "netrun"
      local r = netrun.redis.connect { url = url }
      local out = {}
      r:set("tx:k", 1)
      -- untouched: EXEC runs
      out.watch = r:watch("tx:k")
      local v = tonumber(r:get("tx:k"))
      out.multi = r:multi()
      out.queued = r:set("tx:k", v + 1)
      out.exec = r:exec()
      out.stats = r:stats()
      -- another client changes the key between WATCH and EXEC: aborted
      r:watch("tx:k")
      os.execute("redis-cli -p " .. port .. " SET tx:k 100 > /dev/null")
      r:multi()
      r:incr("tx:k")
      out.aborted = { r:exec() }
      out.after = r:get("tx:k")
      -- r:transaction: one write, EXEC's replies
      out.tx = r:transaction(function(t) t:incr("tx:n") t:incr("tx:n") t:get("tx:n") end)
      out.txerr = { r:transaction(function(t) t:set("tx:k") end) }
      return out
    end, url, srv.port)
    assert.equal("OK", out.watch)
    assert.equal("OK", out.multi)
    assert.equal("QUEUED", out.queued)
    assert.same({ "OK" }, out.exec)
    assert.same({ shared = 1, idle = 1, bound = 0, unread = 0 }, out.stats)   -- kept idle
    assert.same({}, out.aborted)                                  -- nil, no error
    assert.equal("100", out.after)
    assert.same({ 1, 2, "2" }, out.tx)
    assert.is_nil(out.txerr[1])
    assert.matches("EXECABORT", out.txerr[2])
  end)

  it("sends scripts by SHA, and the script itself once the server does not know it", function()
    local script = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
    local out = on_loop(function(url, script, port)
      local r = require("netrun").redis.connect { url = url }
      local out = { r:eval(script, 1, "sc:n", 5), r:eval(script, 1, "sc:n", 5) }
      os.execute("redis-cli -p " .. port .. " SCRIPT FLUSH > /dev/null")
      out[3] = r:eval(script, 1, "sc:n", 5)
      local res = r:pipeline(function(p) p:eval(script, 1, "sc:n", 1) p:eval(script, 1, "sc:n", 1) end)
      out[4], out[5] = res[1], res[2]
      out[6] = { r:eval("return redis.error_reply('nope')", 0) }
      return out
    end, url, script, srv.port)
    assert.same({ 5, 10, 15, 16, 17 }, { table.unpack(out, 1, 5) })
    assert.is_nil(out[6][1])
    assert.matches("nope", out[6][2])
    local stats = S.cli(srv.port, "INFO commandstats")
    assert.is_true(tonumber(stats:match("cmdstat_evalsha:calls=(%d+)")) >= 3)
  end)

  for _, resp in ipairs { 3, 2 } do
    it("subscribes on a connection of its own and reads messages (RESP" .. resp .. ")", function()
      local out = on_loop(function(url, port, resp)
        local netrun = require "netrun"
        local r = netrun.redis.connect { url = url, resp = resp }
        local out, ready = {}, netrun.promise()
        local reader = netrun.spawn(function()
          out.sub = r:subscribe("news", "sport")
          out.psub = r:psubscribe("n*")
          ready:set_success()
          for i = 1, 3 do out[i] = r:read_reply(5) end
          out.timeout = { r:read_reply(0.05) }
          out.unsub = r:unsubscribe()
          out.punsub = r:punsubscribe()
          out.none = { r:read_reply(0.05) }
        end)
        ready:await()
        -- a command of the same client meanwhile, on its shared connection
        out.get = r:get("ps:none")
        os.execute("redis-cli -p " .. port .. " PUBLISH news hello > /dev/null")
        os.execute("redis-cli -p " .. port .. " PUBLISH sport goal > /dev/null")
        reader:await()
        -- a callback
        local got = {}
        local sub = assert(r:subscribe("cb", function(payload, channel) got[#got + 1] = channel .. "=" .. payload end))
        for i = 1, 3 do r:publish("cb", "m" .. i) end
        for _ = 1, 100 do
          if #got == 3 then break end
          netrun.sleep(0.01)
        end
        sub:close()
        out.cb = got
        out.stats = r:stats()
        return out
      end, url, srv.port, resp)
      assert.same({ "subscribe", "sport", 2 }, out.sub)
      assert.same({ "psubscribe", "n*", 3 }, out.psub)
      assert.is_nil(out.get)
      local got = {}
      for i = 1, 3 do got[i] = table.concat(out[i], " ") end
      table.sort(got)
      assert.same({ "message news hello", "message sport goal", "pmessage n* news hello" }, got)
      assert.same({ nil, "timeout" }, out.timeout)
      assert.same({ "punsubscribe", "n*", 0 }, out.punsub)
      assert.same({ nil, "not subscribed" }, out.none)
      assert.same({ "cb=m1", "cb=m2", "cb=m3" }, out.cb)
      assert.equal(0, out.stats.bound)
    end)
  end

  it("stops reading a subscriber's socket past max_messages unread, and loses none", function()
    local out = on_loop(function(url, port)
      local netrun = require "netrun"
      local r = netrun.redis.connect { url = url, max_messages = 10 }
      local ready, go = netrun.promise(), netrun.promise()
      local reader = netrun.spawn(function()
        r:subscribe("flood")
        ready:set_success()
        go:await()                           -- read nothing until told
        local n, order = 0, true
        for i = 1, 10000 do
          local m = r:read_reply(5)
          if not m then break end
          n = n + 1
          if m[3] ~= string.format("%05d", i) .. string.rep("x", 1000) then order = false end
        end
        return { n, order }
      end)
      ready:await()
      local pub = netrun.redis.connect { url = url }
      local res = pub:pipeline(function(p)
        for i = 1, 10000 do p:publish("flood", string.format("%05d", i) .. string.rep("x", 1000)) end
      end)
      netrun.sleep(0.3)
      local unread = r:stats().unread
      local held = r:client("LIST")            -- the server holds the rest
      go:set_success()
      local got = reader:await()
      return { unread, got[1], got[2], res[1], held }
    end, url, srv.port)
    -- at most the limit plus what one read brought (64 KiB of 1 KiB messages)
    assert.is_true(out[1] >= 10 and out[1] <= 10 + 70, "unread " .. out[1])
    assert.equal(10000, out[2])
    assert.is_true(out[3], "messages out of order")
    assert.equal(1, out[4])
    -- 10 MB published: past the kernel's buffers, Redis holds the rest
    assert.matches("omem=[1-9][^\n]*cmd=subscribe", out[5])
  end)

  it("gives maps, doubles and booleans as Lua values in RESP3, flat arrays in RESP2", function()
    local out = on_loop(function(url)
      local netrun = require "netrun"
      local r3 = netrun.redis.connect { url = url }
      local r2 = netrun.redis.connect { url = url, resp = 2 }
      r3:hset("map:h", "a", "1", "b", "2")
      r3:zadd("map:z", 1.5, "m")
      return { r3:hgetall("map:h"), r2:hgetall("map:h"), r3:zscore("map:z", "m"),
               r2:zscore("map:z", "m") }
    end, url)
    assert.same({ a = "1", b = "2" }, out[1])
    table.sort(out[2])
    assert.same({ "1", "2", "a", "b" }, out[2])
    assert.equal(1.5, out[3])
    assert.equal("1.5", out[4])
  end)

  it("takes AUTH and SELECT from the URL, and refuses a wrong password", function()
    local auth = S.standalone("--requirepass s3cret --user ann on '>annpass' '~*' '&*' '+@all'")
    finally(function() auth.stop() end)
    local out = on_loop(function(port)
      local netrun = require "netrun"
      local r = netrun.redis.connect { url = "redis://:s3cret@127.0.0.1:" .. port .. "/3" }
      local ann = netrun.redis.connect { url = "redis://ann:annpass@127.0.0.1:" .. port .. "/4" }
      local bad = netrun.redis.connect { url = "redis://:wrong@127.0.0.1:" .. port }
      local old = netrun.redis.connect { url = "redis://:s3cret@127.0.0.1:" .. port .. "/5", resp = 2 }
      return { r:set("auth:k", "in db 3"), ann:set("auth:k", "in db 4"), { bad:get("x") },
               old:set("auth:k", "in db 5") }
    end, auth.port)
    assert.same({ "OK", "OK" }, { out[1], out[2] })
    assert.is_nil(out[3][1])
    assert.matches("WRONGPASS", out[3][2])
    assert.equal("OK", out[4])
    for db = 3, 5 do
      assert.equal("in db " .. db, S.cli(auth.port, "-a s3cret --no-auth-warning -n " .. db .. " GET auth:k"))
    end
  end)

  it("speaks TLS for rediss:// URLs", function()
    local dir = H.tmpdir()
    assert(H.run("bash " .. H.root .. "/spec/fixtures/tls/make_certs.sh " .. dir))
    local tport = H.free_port()
    local tls = S.standalone(string.format("--tls-port %d --tls-cert-file %s/server.crt " ..
      "--tls-key-file %s/server.key --tls-ca-cert-file %s/ca.crt --tls-auth-clients no",
      tport, dir, dir, dir))
    finally(function() tls.stop() os.execute("rm -rf " .. dir) end)
    local out = on_loop(function(tport, dir)
      local netrun = require "netrun"
      local r = netrun.redis.connect { url = "rediss://127.0.0.1:" .. tport,
                                       tls = netrun.tls.client { ca = dir .. "/ca.crt" } }
      local untrusted = netrun.redis.connect { url = "rediss://127.0.0.1:" .. tport,
                                               tls = netrun.tls.client { ca = dir .. "/other-ca.crt" } }
      return { r:set("tls:k", "secret"), r:get("tls:k"), { untrusted:get("tls:k") } }
    end, tport, dir)
    assert.equal("OK", out[1])
    assert.equal("secret", out[2])
    assert.is_nil(out[3][1])
    assert.matches("certificate", out[3][2])
    assert.equal("secret", S.cli(tls.port, "GET tls:k"))
  end)

  it("runs blocking commands on a connection of their own, so others go on", function()
    local out = on_loop(function(url)
      local netrun = require "netrun"
      local r = netrun.redis.connect { url = url }
      local popped = netrun.spawn(function() return r:blpop("blk:list", 5) end)
      local t0 = netrun.now()
      local quick = {}
      for i = 1, 10 do quick[i] = r:ping() end       -- not stuck behind BLPOP
      local dt = netrun.now() - t0
      r:lpush("blk:list", "item")
      return { popped:await(), dt, quick[10] }
    end, url)
    assert.same({ "blk:list", "item" }, out[1])
    assert.is_true(out[2] < 1, "PINGs waited " .. out[2] .. " s")
    assert.equal("PONG", out[3])
  end)

  it("works from the main thread (a script, the REPL): the call blocks until done", function()
    local r = netrun.redis.connect { url = url }
    assert.equal(r.id, r:await().id)          -- a copy: it came back from the loop
    assert.equal("OK", r:set("main:k", "v"))
    assert.equal("v", r:get("main:k"))
    assert.is_nil(r:get("main:none"))
    local res = r:pipeline(function(p) p:get("main:k") p:get("main:none") end)
    assert.same({ "v", netrun.redis.null, n = 2 }, res)
    local ok, err = r:call("NOSUCH")
    assert.is_nil(ok)
    assert.matches("unknown command", err)
  end)

  it("fails a command the server does not answer in time with \"timeout\", and recovers", function()
    local out = on_loop(function(url, port)
      local netrun = require "netrun"
      local r = netrun.redis.connect { url = url, timeout = 0.4 }
      assert(r:ping())
      os.execute("redis-cli -p " .. port .. " CLIENT PAUSE 1500 ALL > /dev/null")
      local t0 = netrun.now()
      local v, err = r:get("pause:k")
      local waited = netrun.now() - t0
      netrun.sleep(1.5)
      return { v, err, waited, r:ping() }
    end, url, srv.port)
    assert.is_nil(out[1])
    assert.equal("timeout", out[2])
    assert.is_true(out[3] >= 0.35 and out[3] < 1.2, "waited " .. out[3])
    assert.equal("PONG", out[4])
  end)

  it("refuses the commands that would change a shared connection", function()
    local r = netrun.redis.connect { url = url }
    for _, call in ipairs { function() r:select(2) end, function() r:call("HELLO", "2") end,
                            function() r:client("REPLY", "OFF") end, function() r:monitor() end } do
      local ok, err = pcall(call)
      assert.is_false(ok)
      assert.matches("would change", err)
    end
  end)

  it("checks its options and URLs", function()
    local bad = {
      { { url = "http://x" }, "unsupported scheme" },
      { { url = "redis://h/x" }, "database number" },
      { { url = "redis://h:99999" }, "port out of range" },
      { { url = 5 }, "url must be a string" },
      { { pool = 0 }, "pool must be an integer from 1" },
      { { resp = 4 }, "resp must be an integer from 2 to 3" },
      { { timeout = -1 }, "timeout must be a number" },
      { { tls = "yes" }, "tls must be true, false or a netrun.tls.client" },
      { { poool = 1 }, "unknown option 'poool'" },
    }
    for _, b in ipairs(bad) do
      local ok, err = pcall(netrun.redis.connect, b[1])
      assert.is_false(ok)
      assert.matches(b[2], err, 1, true)
    end
    local u = netrun.redis.parse_url("rediss://us%40r:p%3Ass@[::1]:7000/2")
    assert.same({ tls = true, host = "::1", port = 7000, db = 2, username = "us@r",
                  password = "p:ss" }, u)
  end)
end)
