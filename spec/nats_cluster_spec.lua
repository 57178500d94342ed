-- nats_cluster_spec.lua -- netrun.nats against a three-node routed
-- nats-server cluster with JetStream (Debian's nats-server, started here
-- once for the file on free loopback ports, file stores in a temporary
-- directory): messages routed between nodes, the cluster discovered from
-- INFO and a killed node failed over, and JetStream acknowledgements of
-- an R3 stream that survive the kill of its leader.
local H = require "spec.helper"
local N = require "nats_server"
local netrun = H.netrun

local on_loop = N.on_loop

describe("netrun.nats against a three-node cluster", function()
  local group, loop, dir, nodes, urls
  setup(function()
    group = netrun.group { threads = 1, name = "nats-cluster" }
    loop = group:next()
    dir = H.tmpdir()
    nodes = N.cluster(dir, 3)
    urls = {}
    for i, s in ipairs(nodes) do urls[i] = "nats://127.0.0.1:" .. s.port end
  end)
  teardown(function()
    for _, s in ipairs(nodes or {}) do N.stop(s) end
    H.shutdown(group)
    os.execute("rm -rf " .. dir)
  end)

  it("routes messages and queue groups between nodes, and learns the cluster from INFO", function()
    local got = on_loop(loop, function(u1, u2, u3)
      local a = assert(netrun.nats.connect { url = u1 })
      local b = assert(netrun.nats.connect { url = u2 })
      local c = assert(netrun.nats.connect { url = u3 })
      local n = { all = 0, qb = 0, qc = 0 }
      local done, queued = netrun.promise(), netrun.promise()
      b:subscribe("spec.route", function()
        n.all = n.all + 1
        if n.all == 200 then done:try_success() end
      end)
      local function member(k)
        return function()
          n[k] = n[k] + 1
          if n.qb + n.qc == 200 then queued:try_success() end
        end
      end
      b:subscribe("spec.route", member("qb"), { queue = "q" })
      c:subscribe("spec.route", member("qc"), { queue = "q" })
      assert(b:flush())
      assert(c:flush())
      -- interest crosses the routes: wait until a probe gets through
      local probe = b:subscribe("spec.probe", function(m) m:respond("here") end)
      assert(b:flush())
      while not a:request("spec.probe", "", { timeout = 0.5 }) do netrun.sleep(0.05) end
      probe:unsubscribe()
      for i = 1, 200 do a:publish("spec.route", tostring(i)) end
      done:await()                       -- routed messages: no flush tells when they land
      queued:await()
      n.pool = #a:servers()
      for _, x in ipairs { a, b, c } do x:close() end
      return n
    end, urls[1], urls[2], urls[3])
    assert.equal(200, got.all)
    assert.equal(200, got.qb + got.qc)
    assert.equal(3, got.pool)              -- n2 and n3 came from connect_urls
  end)

  it("an acknowledged JetStream publish survives the kill of its stream's leader (R3)", function()
    local here = group:next()
    local first = on_loop(here, function(url)
      local S = {}
      rawset(_G, "spec_js", S)
      S.nc = assert(netrun.nats.connect { url = url, reconnect_wait = 0.1, max_reconnects = -1 })
      S.js = S.nc:jetstream { timeout = 5 }
      -- the cluster elects its JetStream leader a little after it starts
      local info, err
      for _ = 1, 120 do
        info, err = S.js:api("STREAM.CREATE.SPEC", { name = "SPEC", subjects = { "spec.js.>" },
                                                     num_replicas = 3, storage = "file" })
        if info then break end
        netrun.sleep(0.25)
      end
      assert(info, err)
      local seqs = {}
      for i = 1, 200 do
        local ack = assert(S.js:publish("spec.js.orders", "order " .. i))
        seqs[i] = ack.seq
        assert(ack.stream == "SPEC")
      end
      local out = { seqs = seqs }
      out.bad, out.bad_err = S.js:publish("spec.js.orders", "x", { expect = { last_seq = 5 } })
      out.none, out.none_err = S.js:publish("spec.nostream", "x")
      local dup = assert(S.js:publish("spec.js.orders", "d", { msg_id = "once" }))
      local dup2 = assert(S.js:publish("spec.js.orders", "d", { msg_id = "once" }))
      out.dup = { dup.seq, dup2.seq, dup2.duplicate }
      local si = assert(S.js:api("STREAM.INFO.SPEC"))
      out.leader = si.cluster.leader
      out.replicas = #(si.cluster.replicas or {})
      return out
    end, table.concat(urls, ","))
    for i = 1, 200 do assert.equal(i, first.seqs[i]) end
    assert.is_nil(first.bad)
    assert.matches("wrong last sequence", first.bad_err)
    assert.is_nil(first.none)
    assert.equal("no responders", first.none_err)
    assert.same({ 201, 201, true }, first.dup)
    assert.equal(2, first.replicas)
    local leader
    for _, s in ipairs(nodes) do
      if s.name == first.leader then leader = s end
    end
    assert(leader, "no leader named " .. tostring(first.leader))
    N.kill(leader)                                      -- SIGKILL: no goodbye
    local after = on_loop(here, function(dead)
      local S = rawget(_G, "spec_js")
      local si, err
      for _ = 1, 120 do                                 -- a new leader is elected
        si, err = S.js:api("STREAM.INFO.SPEC", nil, 1)
        if si and si.cluster and si.cluster.leader and si.cluster.leader ~= dead then break end
        si = nil
        netrun.sleep(0.25)
      end
      assert(si, err)
      local out = { messages = si.state.messages, last = si.state.last_seq,
                    leader = si.cluster.leader }
      out.got = {}
      for _, seq in ipairs { 1, 100, 200 } do
        local m = assert(S.js:api("STREAM.MSG.GET.SPEC", { seq = seq }))
        out.got[#out.got + 1] = m.message.data       -- base64
      end
      local ack = assert(S.js:publish("spec.js.orders", "after"))
      out.next = ack.seq
      out.server = S.nc:connected_server()
      S.nc:close()
      return out
    end, first.leader)
    N.restart(leader)
    assert.equal(201, after.messages)
    assert.equal(201, after.last)
    assert.is_not.equal(first.leader, after.leader)
    local b64 = { "b3JkZXIgMQ==", "b3JkZXIgMTAw", "b3JkZXIgMjAw" }   -- "order 1", "order 100", ...
    assert.same(b64, after.got)
    assert.equal(202, after.next)
    assert.is_not.equal("127.0.0.1:" .. leader.port, after.server)
  end)

  it("fails over to a node it learned from INFO when its node is killed", function()
    local here = group:next()
    on_loop(here, function(u1, u3)
      local S = { count = 0, back = netrun.promise(), all = netrun.promise() }
      rawset(_G, "spec_failover", S)
      S.nc = assert(netrun.nats.connect { url = u1, reconnect_wait = 0.1,
        on_reconnect = function() S.back:try_success() end })
      S.sub = assert(netrun.nats.connect { url = u3 })
      S.sub:subscribe("spec.fo", function()
        S.count = S.count + 1
        if S.count == 100 then S.all:try_success() end
      end)
      S.sub:subscribe("spec.fo.ping", function(m) m:respond("") end)
      assert(S.sub:flush())
      -- the subscriber's interest has crossed the route once a probe is answered
      while not S.nc:request("spec.fo.ping", "", { timeout = 0.2 }) do netrun.sleep(0.05) end
      S.pool = #S.nc:servers()
    end, urls[1], urls[3])
    N.kill(nodes[1])
    local got = on_loop(here, function(u1)
      local S = rawget(_G, "spec_failover")
      S.back:await()
      local now = S.nc:connected_server()
      -- the route to n3 carries the subscriber's interest
      while not S.nc:request("spec.fo.ping", "", { timeout = 0.2 }) do netrun.sleep(0.05) end
      for i = 1, 100 do assert(S.nc:publish("spec.fo", tostring(i))) end
      S.all:await()                       -- across a route: no flush tells when they land
      local out = { pool = S.pool, now = now, count = S.count, u1 = u1 }
      S.nc:close()
      S.sub:close()
      return out
    end, urls[1])
    N.restart(nodes[1])
    assert.equal(3, got.pool)
    assert.is_not.equal("127.0.0.1:" .. nodes[1].port, got.now)
    assert.equal(100, got.count)
  end)
end)
