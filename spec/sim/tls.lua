-- spec/sim/tls.lua -- TLS for real over the simulated network: OpenSSL's
-- handshakes and records run unchanged on the world's sockets (its random
-- numbers drawn from the seed, so a run replays), certificates verified,
-- an untrusted one refused, close_notify answered, and a handshake that
-- never completes ended by handshake_timeout on virtual time.
--
-- Its certificates are made once per machine (spec/fixtures/tls/
-- make_certs.sh) in a fixed directory and reused, so that the two runs of
-- the determinism check handshake with the same keys.
local S = {}

local function certs()
  local dir = (os.getenv("TMPDIR") or "/tmp") .. "/netrun-sim-tls-certs"
  local f = io.open(dir .. "/ready")
  if f then f:close() return dir end
  local tmp = dir .. "." .. tostring(os.time()) .. "." .. tostring(math.random(1 << 30))
  assert(os.execute("bash spec/fixtures/tls/make_certs.sh " .. tmp .. " >/dev/null"
    .. " && touch " .. tmp .. "/ready && (mv -T " .. tmp .. " " .. dir
    .. " 2>/dev/null || rm -rf " .. tmp .. ")"))
  return dir
end

-- The virtual clock starts a day after the certificates' notBefore:
-- OpenSSL checks their dates against it (the default epoch, 2025-01-01,
-- is before certificates made today).
do
  local p = assert(io.popen("date -d \"$(openssl x509 -noout -startdate -in "
    .. certs() .. "/server.crt | cut -d= -f2)\" +%s"))
  S.epoch = assert(math.tointeger(tonumber(p:read("*l")))) + 86400
  p:close()
end

local function serve(b, dir, opts)
  b:run(function(dir, opts)
    local netrun = require "netrun"
    local tls = netrun.tls.server { cert = dir .. "/server.crt", key = dir .. "/server.key",
                                    handshake_timeout = opts.handshake_timeout }
    netrun.server { port = 443, tls = tls, stream = function(s)
      local line = s:receive("*l")
      if line then s:send("hello " .. line .. "\n") end
      s:close()
    end }:sync()
  end, dir, opts or {}):await()
end

function S.a_verified_tls_stream_gets_its_answer(world)
  local dir = certs()
  local a, b = world:host "a", world:host "b"
  world:latency(a, b, 0.010)
  serve(b, dir)
  local got = a:run(function(dir)
    local netrun = require "netrun"
    local t0 = netrun.now()
    local s = assert(netrun.tcp.connect("b", 443, { tls = netrun.tls.client {
      ca = dir .. "/ca.crt", server_name = "localhost" } }):await())
    s:send("sim\n")
    local line = assert(s:receive("*l"))
    local closed = select(2, s:receive("*l"))
    s:close()
    return { line = line, closed = closed, took = netrun.now() - t0 }
  end, dir):await()
  assert(got.line == "hello sim", got.line)
  assert(got.closed == "closed", tostring(got.closed))
  -- TCP's handshake and TLS 1.3's one round trip, then the line's, at
  -- 10 ms each way: at least 3 round trips of virtual time
  assert(got.took >= 0.060 and got.took < 1, ("took %.3f s"):format(got.took))
end

function S.an_untrusted_certificate_is_refused(world)
  local dir = certs()
  local a, b = world:host "a", world:host "b"
  serve(b, dir)
  local err = a:run(function(dir)
    local netrun = require "netrun"
    local ok, err = pcall(function()
      return netrun.tcp.connect("b", 443, { tls = netrun.tls.client {
        ca = dir .. "/other-ca.crt", server_name = "localhost" } }):await()
    end)
    assert(not ok, "an untrusted server was accepted")
    return tostring(err)
  end, dir):await()
  assert(err:find("certificate verify failed", 1, true), err)
end

function S.a_silent_client_is_dropped_at_the_handshake_timeout(world)
  local dir = certs()
  local a, b = world:host "a", world:host "b"
  serve(b, dir, { handshake_timeout = 10 })
  local got = a:run(function()
    local netrun = require "netrun"
    local s = assert(netrun.tcp.connect("b", 443):await())   -- plain TCP: no ClientHello
    local t0 = netrun.now()
    s:settimeout(100)
    local data, err = s:receive("*a")
    return { err = err, data = data, took = netrun.now() - t0 }
  end):await()
  assert(got.took >= 10 and got.took < 11, ("closed after %.3f s"):format(got.took))
end

return S
