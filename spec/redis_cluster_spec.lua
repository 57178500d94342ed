-- redis_cluster_spec.lua -- netrun.redis.cluster against a real six-node
-- Redis Cluster (Debian's redis-server, three masters and a replica each,
-- made by `redis-cli --cluster create` on loopback ports of this spec's
-- own; spec/fixtures/redis_servers.lua): routing by slot and hash tag,
-- pipelines split by node and put back in order, replica reads, sharded
-- pub/sub, ASK during a slot's migration (set up by hand with CLUSTER
-- SETSLOT IMPORTING/MIGRATING), and under a steady load a live `redis-cli --cluster reshard`
-- of 1,000 slots, a CLUSTER FAILOVER and a master killed: no command
-- fails, the counts come out exact (checked with redis-cli), and every
-- MOVED and ASK the client decoded is counted in netrun.metrics.
local H = require "spec.helper"
local S = require "redis_servers"
local netrun = H.netrun

local function cluster_get(port, keys)
  -- one redis-cli -c for every key: it follows redirects itself
  local path = os.tmpname()
  local cmds = {}
  for i, k in ipairs(keys) do cmds[i] = "GET " .. k end
  local w = assert(io.open(path, "w"))
  w:write(table.concat(cmds, "\n"), "\n")
  w:close()
  local out = H.run(string.format("timeout 60 redis-cli -c -p %d < %s", port, path))
  os.remove(path)
  local vals = {}
  for line in out:gmatch("[^\n]*") do
    if line ~= "" and not line:find("^%-> Redirected") then vals[#vals + 1] = line end
  end
  return vals
end

local function metric(text, name, label)
  local key = name .. (label and ('{kind="' .. label .. '"}') or "")
  for line in text:gmatch("[^\n]+") do
    local k, v = line:match("^(%S+) (%d+)$")
    if k == key then return tonumber(v) end
  end
  return 0
end

;(S.available() and describe or pending)("netrun.redis.cluster against a six-node cluster", function()
  local cl, group, seeds

  setup(function()
    cl = S.cluster(6, 1000)
    seeds = {}
    for i = 1, 3 do seeds[i] = "127.0.0.1:" .. cl.ports[i] end
    group = netrun.group { threads = 1, name = "cluster" }
  end)
  teardown(function()
    if group then H.shutdown(group) end
    if cl then cl.stop() end
  end)

  local function on_loop(fn, ...)
    return H.sync(H.sync(group:submit(function(fn, ...)
      return require("netrun").spawn(fn, ...)
    end, fn, ...)), 60)
  end

  it("routes each key to its slot's master, hash tags together, pipelines split and put back in order", function()
    local res = on_loop(function(seeds)
      local netrun = require "netrun"
      local c = netrun.redis.cluster { nodes = seeds }
      assert(c:await())
      local out = {}
      for i = 1, 50 do assert(c:set("route:" .. i, "v" .. i) == "OK") end
      out.get = c:get("route:7")
      out.missing = c:get("route:none")
      out.tag = { c:set("{user42}.name", "ann"), c:set("{user42}.age", 7),
                  c:mget("{user42}.name", "{user42}.age") }
      out.cross = { c:mget("route:1", "route:2") }
      local res = c:pipeline(function(p)
        for i = 1, 50 do p:get("route:" .. i) end
        p:get("route:none")
        p:incr("route:1")              -- an error in the middle stays in its place
      end)
      out.pipe = res
      out.tx = c:transaction(function(t) t:incr("{tx}:a") t:incr("{tx}:b") t:get("{tx}:a") end)
      out.eval = c:eval("return redis.call('GET', KEYS[1]) .. ARGV[1]", 1, "route:3", "!")
      out.eval2 = c:eval("return redis.call('GET', KEYS[1]) .. ARGV[1]", 1, "route:40", "?")
      out.slot = netrun.redis.slot("route:7")
      out.owner = c:slot_owner(out.slot)
      return out
    end, seeds)
    assert.equal("v7", res.get)
    assert.is_nil(res.missing)
    assert.same({ "OK", "OK" }, { res.tag[1], res.tag[2] })
    assert.same({ "ann", "7" }, res.tag[3])
    assert.is_nil(res.cross[1])
    assert.matches("^CROSSSLOT", res.cross[2])
    assert.equal(52, res.pipe.n)
    for i = 1, 50 do assert.equal("v" .. i, res.pipe[i]) end
    assert.equal(netrun.redis.null, res.pipe[51])
    assert.matches("not an integer", res.pipe[52].err)
    assert.same({ 1, 1, "1" }, res.tx)
    assert.equal("v3!", res.eval)
    assert.equal("v40?", res.eval2)
    -- the key is on the node the client sent it to (redis-cli without -c)
    local port = tonumber(res.owner:match(":(%d+)$"))
    assert.equal("v7", S.cli(port, "GET route:7"))
    assert.equal(tostring(res.slot), S.cli(port, "CLUSTER KEYSLOT route:7"))
  end)

  it("reads from replicas when asked (READONLY), and writes to masters", function()
    local before = {}
    for _, p in ipairs(cl.ports) do
      before[p] = tonumber(S.cli(p, "INFO commandstats"):match("cmdstat_get:calls=(%d+)")) or 0
    end
    local res = on_loop(function(seeds)
      local netrun = require "netrun"
      local c = netrun.redis.cluster { nodes = seeds, read_from = "replica" }
      for i = 1, 30 do assert(c:set("ro:" .. i, i)) end
      local got = 0
      for _ = 1, 5 do                                       -- replication is asynchronous
        got = 0
        for i = 1, 30 do if c:get("ro:" .. i) == tostring(i) then got = got + 1 end end
        if got == 30 then break end
        netrun.sleep(0.1)
      end
      return got
    end, seeds)
    assert.equal(30, res)
    local masters, on_replicas, on_masters = cl.masters(), 0, 0
    for _, p in ipairs(cl.ports) do
      local n = (tonumber(S.cli(p, "INFO commandstats"):match("cmdstat_get:calls=(%d+)")) or 0) - before[p]
      if masters[p] then on_masters = on_masters + n else on_replicas = on_replicas + n end
    end
    assert.is_true(on_replicas >= 30, "replicas served " .. on_replicas)
    assert.equal(0, on_masters)
  end)

  it("subscribes to sharded channels on their slots' masters (SSUBSCRIBE)", function()
    local got = on_loop(function(seeds)
      local netrun = require "netrun"
      local c = netrun.redis.cluster { nodes = seeds }
      local ready, msgs = netrun.promise(), {}
      local done = netrun.spawn(function()
        assert(c:ssubscribe("news", "sport", "{news}.eu"))
        ready:set_success()
        for _ = 1, 3 do
          local m = assert(c:read_reply(5))
          msgs[#msgs + 1] = m[1] .. " " .. m[2] .. " " .. m[3]
        end
      end)
      ready:await()
      for _, ch in ipairs { "news", "sport", "{news}.eu" } do
        assert(c:spublish(ch, "to " .. ch) == 1)
      end
      done:await()
      table.sort(msgs)
      return msgs
    end, seeds)
    assert.same({ "smessage news to news", "smessage sport to sport",
                  "smessage {news}.eu to {news}.eu" }, got)
  end)

  it("follows ASK while a slot migrates (ASKING once, the map unchanged), then MOVED", function()
    local slot = tonumber((S.cli(cl.ports[1], "CLUSTER KEYSLOT ask:probe")))
    local masters = cl.masters()
    local src, dst
    for port in pairs(masters) do          -- the owner is the one that does not redirect
      if not S.cli(port, "GET ask:probe"):find("MOVED", 1, true) then src = port end
    end
    for port in pairs(masters) do if port ~= src then dst = port break end end
    assert(src and dst)
    local moved0, ask0 = require("netrun.core").redis.seen()
    assert.equal("OK", S.cli(dst, "CLUSTER SETSLOT " .. slot .. " IMPORTING " .. masters[src]))
    assert.equal("OK", S.cli(src, "CLUSTER SETSLOT " .. slot .. " MIGRATING " .. masters[dst]))
    local out = on_loop(function(seeds, slot)
      local netrun = require "netrun"
      local c = netrun.redis.cluster { nodes = seeds }
      assert(c:await())
      local owner = c:slot_owner(slot)
      local r = { c:set("ask:probe", "there"), c:get("ask:probe") }
      r[3] = c:slot_owner(slot) == owner
      return r
    end, seeds, slot)
    assert.same({ "OK", "there", true }, out)
    -- the key lives on the importing node (which answers it after ASKING)
    local on_dst = H.run(string.format("printf 'ASKING\\nGET ask:probe\\n' | redis-cli -p %d", dst))
    assert.equal("OK\nthere", (on_dst:gsub("%s+$", "")))
    local moved1, ask1 = require("netrun.core").redis.seen()
    assert.equal(2, ask1 - ask0)
    assert.equal(0, moved1 - moved0)
    -- the migration ends: the slot is dst's, and a client with the old map gets MOVED
    for port in pairs(masters) do
      S.cli(port, "CLUSTER SETSLOT " .. slot .. " NODE " .. masters[dst])
    end
    assert(H.eventually(function()
      return S.cli(src, "GET ask:probe"):find("MOVED", 1, true) ~= nil
    end, 10))
    local v = on_loop(function(seeds)
      local c = require("netrun").redis.cluster { nodes = seeds }
      return c:get("ask:probe")
    end, seeds)
    assert.equal("there", v)
    local text = netrun.metrics.text()
    local moved2, ask2 = require("netrun.core").redis.seen()
    assert.equal(ask2, metric(text, "netrun_redis_redirects_total", "ask"))
    assert.equal(moved2, metric(text, "netrun_redis_redirects_total", "moved"))
  end)

  it("keeps every command going through a live reshard of 1,000 slots, a CLUSTER FAILOVER "
     .. "and a master killed, counting every MOVED and ASK", function()
    local NKEYS = 2000
    -- the load: 16 coroutines, INCR on 2,000 keys spread over every slot,
    -- now and then as a pipeline, until told to stop
    H.sync(group:submit(function(seeds, nkeys)
      local netrun = require "netrun"
      local c = netrun.redis.cluster { nodes = seeds, timeout = 5 }
      LOAD = { ops = 0, failures = {}, expected = {}, stop = false, paused = false, running = 0 }
      for w = 1, 16 do
        LOAD.running = LOAD.running + 1
        netrun.spawn(function()
          local i = w
          while not LOAD.stop do
            if LOAD.paused then
              netrun.sleep(0.01)
            elseif i % 10 == 0 then
              local ks = {}
              for j = 1, 4 do ks[j] = "load:" .. ((i + j * 97) % nkeys + 1) end
              local res, err = c:pipeline(function(p) for _, k in ipairs(ks) do p:incr(k) end end)
              for j, k in ipairs(ks) do
                local v = res and res[j]
                if math.type(v) == "integer" then
                  LOAD.expected[k] = (LOAD.expected[k] or 0) + 1
                else
                  LOAD.failures[#LOAD.failures + 1] = tostring(err or (v and v.err) or v)
                end
              end
              LOAD.ops = LOAD.ops + 4
            else
              local k = "load:" .. (i % nkeys + 1)
              local v, err = c:incr(k)
              if v then
                LOAD.expected[k] = (LOAD.expected[k] or 0) + 1
              else
                LOAD.failures[#LOAD.failures + 1] = tostring(err)
              end
              LOAD.ops = LOAD.ops + 1
            end
            i = i + 16
          end
          LOAD.running = LOAD.running - 1
        end)
      end
    end, seeds, NKEYS))
    local function ops()
      return H.sync(group:submit(function() return LOAD.ops end))
    end
    local function failures()
      return H.sync(group:submit(function() return LOAD.failures end))
    end
    local function going(from)
      return H.eventually(function() return ops() > from + 500 end, 20)
    end
    assert(going(0), "the load never got going")

    -- 1. a live reshard: 1,000 slots from the first master to the second
    local masters = cl.masters()
    local src, dst = masters[cl.ports[1]], masters[cl.ports[2]]
    assert(src and dst, "the first two nodes are masters")
    local out, st = H.run(string.format("timeout 90 redis-cli --cluster reshard 127.0.0.1:%d "
      .. "--cluster-from %s --cluster-to %s --cluster-slots 1000 --cluster-yes", cl.ports[1], src, dst))
    assert.equal(0, st, out)
    assert(going(ops()), "no progress after the reshard")

    -- 2. a forced failover: the third master's replica takes over
    local old = cl.ports[3]
    local rep = assert(cl.replica_of(old), "no replica of " .. old)
    assert.matches("OK", S.cli(rep, "CLUSTER FAILOVER"))
    assert(H.eventually(function()
      return S.cli(rep, "ROLE"):match("^master") ~= nil and
             S.cli(old, "ROLE"):match("^slave") ~= nil
    end, 20), "the failover never completed")
    assert(going(ops()), "no progress after the failover")

    -- the counts are exact so far: pause, and read every key with redis-cli
    H.sync(group:submit(function() LOAD.paused = true end))
    assert(H.eventually(function()
      local a = ops()
      H.sync(group:schedule(0.1, function() end))
      return ops() == a
    end, 10))
    local expected = H.sync(group:submit(function() return LOAD.expected end))
    local keys = {}
    for k in pairs(expected) do keys[#keys + 1] = k end
    table.sort(keys)
    local vals = cluster_get(cl.ports[2], keys)
    assert.equal(#keys, #vals)
    local wrong = 0
    for i, k in ipairs(keys) do
      if tonumber(vals[i]) ~= expected[k] then wrong = wrong + 1 end
    end
    assert.equal(0, wrong, "keys whose count is off")
    assert.same({}, failures())
    H.sync(group:submit(function() LOAD.paused = false end))

    -- 3. a master killed: its replica is promoted (node timeout 1 s); the
    -- commands caught by it are sent again once the map says where
    masters = cl.masters()
    local victim = cl.ports[2]
    assert(masters[victim], "the second node is still a master")
    local heir = assert(cl.replica_of(victim))
    cl.kill(victim)
    assert(H.eventually(function() return S.cli(heir, "ROLE"):match("^master") ~= nil end, 30),
      "the replica of the killed master was never promoted")
    assert(going(ops()), "no progress after the kill")

    H.sync(group:submit(function() LOAD.stop = true end))
    assert(H.eventually(function()
      return H.sync(group:submit(function() return LOAD.running end)) == 0
    end, 20))
    assert.same({}, failures())
    assert.is_true(ops() > 3000, "ops " .. ops())

    -- every MOVED and ASK decoded off the wire was counted in the metrics
    local moved, ask = require("netrun.core").redis.seen()
    local text = netrun.metrics.text()
    assert.is_true(moved + ask > 0, "the reshard caused no redirect")
    assert.equal(moved, metric(text, "netrun_redis_redirects_total", "moved"))
    assert.equal(ask, metric(text, "netrun_redis_redirects_total", "ask"))
    assert.is_true(metric(text, "netrun_redis_retries_total") > 0, "the kill caused no retry")
    assert.is_true(metric(text, "netrun_redis_slot_refreshes_total") > 1)
  end)
end)
