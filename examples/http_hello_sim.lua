-- http_hello_sim.lua -- examples/http_hello.lua tested on virtual time
-- (netrun.sim): a file of scenarios, each a function of a fresh world.
--   netrun --sim 1-100 examples/http_hello_sim.lua     (from the repo's root)
-- runs every scenario once per seed, in milliseconds of wall time although
-- they wait minutes of virtual time; a failure prints its seed and the
-- command that replays it. docs/guide/simulation.md.
local S = {}

-- nginx's default keep-alive timeout (75 s) closes an idle client: on
-- virtual time this takes milliseconds.
function S.an_idle_connection_is_closed_after_75_s(world)
  local server, client = world:host "server", world:host "client"
  server:run("examples/http_hello.lua", { port = 80, host = "0.0.0.0" }):await()
  return client:run(function()
    local netrun = require "netrun"
    local s = assert(netrun.tcp.connect("server", 80):await())
    s:send("GET / HTTP/1.1\r\nHost: server\r\n\r\n")
    assert(s:receive("*l") == "HTTP/1.1 200 OK")
    local t0 = netrun.now()
    s:settimeout(300)                                -- (the default is 60 s)
    local rest = assert(s:receive("*a"))             -- until the server closes
    assert(rest:find("Hello, World!", 1, true))
    local idle = netrun.now() - t0
    assert(idle >= 75 and idle < 75.01, idle)
  end):await()
end

-- A partition longer than the client's timeout fails the request; after
-- the heal the next one is answered.
function S.a_request_across_a_partition_times_out(world)
  local server, client = world:host "server", world:host "client"
  server:run("examples/http_hello.lua", { port = 80, host = "0.0.0.0" }):await()
  local http = world:client(client, { timeout = 5 })
  world:partition(server, client)
  local ok = pcall(function() return http:request { url = "http://server/" }:await() end)
  assert(not ok, "answered through a partition")
  world:heal()
  assert(http:request { url = "http://server/" }:await().status == 200)
end

return S
