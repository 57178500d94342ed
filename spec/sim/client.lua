-- spec/sim/client.lua -- the HTTP client's pool, keep-alive, timeouts,
-- retries and reconnects on virtual time: the simulated counterparts of
-- http_client_spec's tests that wait on the wall clock (keepalive = 0.2,
-- timeouts of a fraction of a second there; the defaults here), and races
-- a real network makes rare: a request sent just as the server's
-- keep-alive timeout closes its connection.
--
-- A file of scenarios (each a function of a fresh world): run by
-- spec/sim_scenarios_spec.lua, and by `netrun --sim 1-100
-- spec/sim/client.lua` twice for the determinism check.
local S = {}

-- On host h: an HTTP server on port counting its connections (and their
-- closes, with the time) in the host's dict "server"; /slow answers after
-- `slow` seconds (never when slow is false); /count answers the count of
-- POSTs seen with its id.
local function server(h, port, opts)
  return h:run(function(p, o)
    local netrun = require "netrun"
    local d = netrun.shared.dict("server")
    local codec = netrun.codec.http_server { keepalive_timeout = o.keepalive_timeout }
    netrun.server { port = p, init = function(ch)
      d:incr("conns", 1, 0)
      ch:pipeline():add_last("http", codec)
      ch:pipeline():add_last("app", {
        channel_read = function(_, ctx, req)
          if req.method == "POST" then d:incr("post " .. req.path, 1, 0) end
          local res = { status = 200, body = "ok " .. req.path }
          if req.path == "/slow" then
            if o.slow then ctx:loop():schedule(o.slow, function() ctx:write_and_flush(res) end) end
          else
            ctx:write_and_flush(res)
          end
        end,
        channel_inactive = function(_, ctx)
          d:incr("closes", 1, 0)
          d:set("closed_at", netrun.now())
          ctx:fire_channel_inactive()
        end,
      })
    end }:sync()
    return true
  end, port, opts or {}):await()
end

local function dict_of(h, name)
  return h:run(function(n)
    local d = require("netrun").shared.dict(n)
    local t = {}
    for _, k in ipairs(d:keys()) do t[k] = d:get(k) end
    return t
  end, name):await()
end

local function near(x, want, slack)
  assert(math.abs(x - want) <= (slack or 0.01), ("%.6f is not %.3f"):format(x, want))
end

function S.a_pool_of_two_serves_ten_requests_two_at_a_time(world)
  local a, b = world:host "a", world:host "b"
  server(b, 80, { slow = 1 })
  local r = a:run(function()
    local netrun = require "netrun"
    local c = netrun.http.client { pool = 2, timeout = 60 }
    local t0 = netrun.now()
    local fs = {}
    for i = 1, 10 do fs[i] = c:request { url = "http://b/slow" } end
    local all = netrun.all(fs):await()
    return { #all, all[10].body, netrun.now() - t0 }
  end):await()
  assert(r[1] == 10 and r[2] == "ok /slow", tostring(r[2]))
  near(r[3], 5, 0.01)                   -- five rounds of two
  assert(dict_of(b, "server").conns == 2)
end

function S.idle_pooled_connections_close_after_keepalive_seconds(world)
  local a, b = world:host "a", world:host "b"
  server(b, 80, { keepalive_timeout = 0 })   -- the server keeps them forever
  local r = a:run(function()
    local netrun = require "netrun"
    local http = require "netrun.http"
    local c = netrun.http.client {}      -- keepalive 60
    local t0 = netrun.now()
    c:request { url = "http://b/x" }:await()
    local idle = http.stats()[c.id]["http://b:80"].idle
    netrun.sleep(59)
    local still = (http.stats()[c.id] or {})["http://b:80"]
    netrun.sleep(2)
    local gone = (http.stats()[c.id] or {})["http://b:80"]
    return { idle, still and still.idle or 0, gone == nil, t0 }
  end):await()
  assert(r[1] == 1 and r[2] == 1 and r[3], "pooled: " .. r[1] .. " " .. r[2] .. " " .. tostring(r[3]))
  local d = dict_of(b, "server")
  assert(d.closes == 1)
  near(d.closed_at - r[4], 60, 0.01)
end

function S.a_request_nobody_answers_fails_at_the_client_timeout(world)
  local a, b = world:host "a", world:host "b"
  server(b, 80, { slow = false })
  local r = a:run(function()
    local netrun = require "netrun"
    local c = netrun.http.client {}      -- timeout 5
    local t0 = netrun.now()
    local ok, err = pcall(function() return c:request { url = "http://b/slow" }:await() end)
    local ok2 = c:request { url = "http://b/next" }:await()   -- a new connection
    return { ok, tostring(err), netrun.now() - t0, ok2.body }
  end):await()
  assert(r[1] == false and r[2]:find("timeout after 5 s", 1, true), r[2])
  near(r[3], 5, 0.01)
  assert(r[4] == "ok /next")
  assert(dict_of(b, "server").conns == 2)     -- the timed-out one was not reused
end

function S.a_get_is_sent_again_when_its_reused_connection_closes_unanswered(world)
  local a, b = world:host "a", world:host "b"
  b:run(function()
    local netrun = require "netrun"
    netrun.server { port = 80, stream = function(s)
      local function head() repeat local l = s:receive("*l") until l == nil or l == "" end
      head()
      s:send("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
      head()                              -- the next request on it: no answer
    end }:sync()
  end):await()
  local r = a:run(function()
    local netrun = require "netrun"
    local c = netrun.http.client {}
    local u = "http://b/"
    local x = c:request { url = u }:await().body
    local y = c:request { url = u }:await().body          -- sent again, new connection
    local ok, err = pcall(function() return c:request { url = u, method = "POST", body = "p" }:await() end)
    return { x, y, ok, tostring(err) }
  end):await()
  assert(r[1] == "first" and r[2] == "first" and r[3] == false, tostring(r[2]))
  assert(r[4]:find("closed before a response", 1, true), r[4])
end

-- The keep-alive race: the client sends on its pooled connection at the
-- moment the server's keepalive_timeout closes it. A GET is sent again on
-- a new connection; a POST is not (the server may have taken it), so it
-- either succeeds or fails -- and the server never sees it twice.
function S.requests_racing_the_servers_keepalive_timeout_never_run_twice(world)
  local a, b = world:host "a", world:host "b"
  world:latency(a, b, 0.001)
  server(b, 80, { keepalive_timeout = 5 })
  local r = a:run(function(seedy)
    local netrun = require "netrun"
    local c = netrun.http.client { keepalive = 600, timeout = 30, pool = 1 }
    local got = { get = 0, post = 0, post_failed = 0 }
    for i = 1, 40 do
      -- a wait around the server's 5 s: sometimes just past it
      netrun.sleep(5 - 0.004 + (math.random(0, 8) / 1000))
      local method = i % 2 == 0 and "POST" or "GET"
      local ok, res = pcall(function()
        return c:request { url = "http://b/" .. i, method = method, body = method == "POST" and "x" or nil }:await()
      end)
      if method == "GET" then
        assert(ok and res.body == "ok /" .. i, "GET " .. i .. ": " .. tostring(res))
        got.get = got.get + 1
      elseif ok then
        got.post = got.post + 1
      else
        assert(tostring(res):find("closed before a response", 1, true), tostring(res))
        got.post_failed = got.post_failed + 1
      end
    end
    return got
  end):await()
  assert(r.get == 20 and r.post + r.post_failed == 20)
  local d = dict_of(b, "server")
  for i = 2, 40, 2 do
    assert((d["post /" .. i] or 0) <= 1, "POST /" .. i .. " ran " .. tostring(d["post /" .. i]) .. " times")
  end
end

function S.a_pool_of_one_connects_again_after_its_connection_is_reset(world)
  local a, b = world:host "a", world:host "b"
  server(b, 80, { slow = 10 })
  local c = world:client(a, { pool = 1, timeout = 30 })
  local first = c:request { url = "http://b/slow" }   -- in flight...
  world:sleep(1 + math.random() * 8)     -- (math.random: seeded by the world)
  assert(world:reset(a, b) == 2)                      -- ...when it is reset
  local ok, err = pcall(function() return first:await() end)
  assert(not ok and tostring(err):find("ECONNRESET", 1, true), tostring(err))
  for i = 1, 3 do                        -- the pool's one place is free again
    local res = c:request { url = "http://b/" .. i, timeout = 5 }:await()
    assert(res.body == "ok /" .. i, tostring(res.body))
  end
  assert(dict_of(b, "server").conns == 2)
end

function S.the_pool_reconnects_after_the_backend_restarts(world)
  local a, b = world:host "a", world:host "b"
  local function start()
    return b:run(function()
      local netrun = require "netrun"
      local srv = netrun.server { port = 80, init = function(ch)
        ch:pipeline():add_last("http", netrun.codec.http_server {})
        ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
          ctx:write_and_flush { status = 200, body = "up" }
        end })
      end }:sync()
      local stop = netrun.promise()
      stop:add_listener(function() srv:close() end)
      return stop
    end):await()
  end
  local stop = start()
  local c = world:client(a, { keepalive = 600 })
  assert(c:request { url = "http://b/" }:await().body == "up")
  stop:set_success(true)                  -- the backend goes away...
  world:reset(a, b)                       -- ...with its connections
  world:sleep(1)
  local ok = pcall(function() return c:request { url = "http://b/", timeout = 2 }:await() end)
  assert(not ok, "nobody listens: the request fails")
  start()                                 -- and comes back
  assert(c:request { url = "http://b/" }:await().body == "up")
end

return S
