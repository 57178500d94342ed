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

local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

-- JetStream's API hands message data over in base64.
local function base64(s)
  return (s:gsub("..?.?", function(c)
    local a, b, d = c:byte(1, 3)
    local n = a * 65536 + (b or 0) * 256 + (d or 0)
    local out = {}
    for i = 1, 4 do
      local k = (n >> (6 * (4 - i))) & 63
      out[i] = B64:sub(k + 1, k + 1)
    end
    if not d then out[4] = "=" end
    if not b then out[3] = "=" end
    return table.concat(out)
  end))
end

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

  it("no acknowledged JetStream publication is lost when its stream's leader is killed under load (R3)", function()
    local here = group:next()
    local first = on_loop(here, function(url)
      local S = { acked = {}, n = 0, failed = 0, workers = {}, warm = netrun.promise(),
                  more = netrun.promise() }
      rawset(_G, "spec_js", S)
      S.nc = assert(netrun.nats.connect { url = url, reconnect_wait = 0.1, max_reconnects = -1 })
      S.js = S.nc:jetstream { timeout = 5 }
      -- the cluster elects its JetStream meta leader a little after it
      -- starts; a request made before then is not answered: ask again
      local info, err
      for _ = 1, 100 do
        info, err = S.js:api("STREAM.CREATE.SPEC", { name = "SPEC", subjects = { "spec.js.>" },
                                                     num_replicas = 3, storage = "file" }, 1)
        if info then break end
        netrun.sleep(0.1)
      end
      assert(info, err)
      local out = {}
      out.bad, out.bad_err = S.js:publish("spec.js.orders", "x", { expect = { last_seq = 5 } })
      out.none, out.none_err = S.js:publish("spec.nostream", "x")
      local dup = assert(S.js:publish("spec.js.orders", "d", { msg_id = "once" }))
      local dup2 = assert(S.js:publish("spec.js.orders", "d", { msg_id = "once" }))
      out.dup = { dup.seq, dup2.seq, dup2.duplicate }
      S.acked[dup.seq] = "d"
      -- four publishers, each awaiting its acknowledgements, until told
      -- to stop (60 s at most); while the stream has no leader a publish
      -- fails at once (no responders) or in 1 s, and is not retried
      local deadline = netrun.now() + 60
      for w = 1, 4 do
        S.workers[w] = netrun.spawn(function()
          local i = 0
          while not S.stop and netrun.now() < deadline do
            i = i + 1
            local data = "order " .. w .. "." .. i
            local ack = S.js:publish("spec.js.orders", data, { timeout = 1 })
            if ack then
              assert(not S.acked[ack.seq], "two acknowledgements of seq " .. ack.seq)
              S.acked[ack.seq] = data
              S.n = S.n + 1
              if S.n >= 100 then S.warm:try_success() end
              if S.target and S.n >= S.target then S.more:try_success() end
            else
              S.failed = S.failed + 1
              netrun.sleep(0.05)
            end
          end
        end)
      end
      S.warm:await()
      local si = assert(S.js:api("STREAM.INFO.SPEC"))
      out.leader = si.cluster.leader
      out.replicas = #(si.cluster.replicas or {})
      return out
    end, table.concat(urls, ","))
    assert.is_nil(first.bad)
    assert.matches("wrong last sequence", first.bad_err)
    assert.is_nil(first.none)
    assert.equal("no responders", first.none_err)
    assert.same({ 1, 1, true }, first.dup)
    assert.equal(2, first.replicas)
    local leader
    for _, s in ipairs(nodes) do
      if s.name == first.leader then leader = s end
    end
    assert(leader, "no leader named " .. tostring(first.leader))
    N.kill(leader)                                      -- SIGKILL, publishers running
    local after = on_loop(here, function(dead)
      local S = rawget(_G, "spec_js")
      local si, err
      for _ = 1, 200 do                   -- nats-server's election timeout: 4 to 9 s
        si, err = S.js:api("STREAM.INFO.SPEC", nil, 1)
        if si and si.cluster and si.cluster.leader and si.cluster.leader ~= dead then break end
        si = nil
        netrun.sleep(0.1)
      end
      assert(si, err)
      local out = { at_kill = S.n }
      S.target = S.n + 100                -- acknowledged by the new leader
      S.more:await()
      S.stop = true
      netrun.all(S.workers):await()
      si = assert(S.js:api("STREAM.INFO.SPEC"))
      out.leader, out.messages, out.last = si.cluster.leader, si.state.messages, si.state.last_seq
      out.acked, out.failed, out.lost = 0, S.failed, {}
      local acked_seqs = {}
      for seq in pairs(S.acked) do acked_seqs[#acked_seqs + 1] = seq end
      out.acked = #acked_seqs
      local readers = {}
      for r = 1, 16 do                    -- each acknowledged one read back, 16 at a time
        readers[r] = netrun.spawn(function()
          for k = r, #acked_seqs, 16 do
            local seq = acked_seqs[k]
            local m, e = S.js:api("STREAM.MSG.GET.SPEC", { seq = seq })
            if not m then
              out.lost[#out.lost + 1] = seq .. ": " .. tostring(e)
            elseif m.message.data ~= base64(S.acked[seq]) then
              out.lost[#out.lost + 1] = seq .. ": holds " .. tostring(m.message.data)
            end
          end
        end)
      end
      netrun.all(readers):await()
      out.server = S.nc:connected_server()
      S.nc:close()
      return out
    end, first.leader)
    N.restart(leader)
    assert.same({}, after.lost)                         -- every acknowledged one is there
    assert.is_true(after.acked >= after.at_kill + 100)
    assert.is_true(after.messages >= after.acked)
    assert.is_not.equal(first.leader, after.leader)
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
