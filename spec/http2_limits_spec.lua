-- http2_limits_spec.lua -- the HTTP/2 server's limits (docs/guide/limits.md's limits
-- table) under the attacks they are for: each attack (spec/h2/attacks.py,
-- frames written by hand) runs against a fresh netrun process serving
-- spec/fixtures/h2_app.lua for at most ATTACK s, and must end with the GOAWAY
-- named, having cost the server under one CPU-second, the server serving
-- others afterwards.
local H = require "spec.helper"
local json = H.netrun.json

local PY = "/usr/bin/python3"          -- Debian's, with python3-h2 and friends
-- Each attack runs ATTACK seconds at most here (10 by hand: run
-- spec/h2/attacks.py --bin build/bin/netrun NAME); one that is not
-- stopped shows as a missing GOAWAY whatever its length.
local ATTACK = 3

local function attack(name)
  local out, status = H.run(("NETRUN_H2_ATTACK_SECONDS=%d timeout 60 %s %s/spec/h2/attacks.py --bin %s %s")
                            :format(ATTACK, PY, H.root, H.BIN, name))
  assert.equal(0, status, out)
  local r = json.decode(out:match("({.*})%s*$"))
  assert.is_true(r.alive, "the server died")
  assert.equal(200, r.after, "the server did not serve a request afterwards")
  return r
end

-- Every flood ends the same way: GOAWAY code, cheaply, quickly.
local function ends(r, code)
  assert.equal(code, r.goaway)
  assert.is_true(r.cpu < 1, "cost " .. r.cpu .. " CPU-s")
  assert.is_true(r.seconds < ATTACK, "lasted " .. r.seconds .. " s")
end

describe("HTTP/2 graceful shutdown", function()
  it("sends GOAWAY twice (RFC 9113 6.8), finishes the open stream, then closes and exits", function()
    local out, status = H.run(("timeout 60 %s %s/spec/h2/attacks.py --bin %s shutdown")
                              :format(PY, H.root, H.BIN))
    assert.equal(0, status, out)
    local r = json.decode(out:match("({.*})%s*$"))
    assert.equal(2, #r.goaways)
    assert.same({ 2147483647, 0 }, r.goaways[1])   -- every stream may still come
    assert.same({ 1, 0 }, r.goaways[2])            -- then: the last one taken
    assert.is_true(r.acked)                        -- after our PING's round trip
    assert.equal(1048576, r.body)
    assert.is_true(r.ended)
    assert.equal(0, r.exit)
    assert.is_true(r.exit_after < 3, "exited " .. r.exit_after .. " s after")
  end)
end)

describe("HTTP/2 limits under attack", function()
  it("Rapid Reset (CVE-2023-44487): the client's resets drain a bucket of 1000, then GOAWAY ENHANCE_YOUR_CALM", function()
    local r = attack("rapid_reset")
    ends(r, "ENHANCE_YOUR_CALM")
    assert.is_true(r.streams >= 1000 and r.streams <= 1400, "after " .. r.streams .. " streams")
  end)

  it("at most 2 x the stream limit of new streams per read: 300 opened and reset in one write", function()
    ends(attack("streams_per_read"), "ENHANCE_YOUR_CALM")
  end)

  it("CONTINUATION flood: more than 8 a header block ends the connection", function()
    ends(attack("continuation"), "ENHANCE_YOUR_CALM")
  end)

  it("MadeYouReset (CVE-2025-8671): the resets the server sends drain a bucket of 1000 too", function()
    local r = attack("made_you_reset")
    ends(r, "ENHANCE_YOUR_CALM")
    assert.is_true(r.resets >= 1000 and r.resets <= 1100, r.resets .. " resets")
  end)

  it("PING, SETTINGS, empty DATA and WINDOW_UPDATE floods", function()
    for _, name in ipairs { "ping_flood", "settings_flood", "empty_data_flood",
                            "window_update_flood" } do
      ends(attack(name), "ENHANCE_YOUR_CALM")
    end
  end)

  it("an HPACK bomb (64 MB of fields from a 16 KB block) ends the connection before it decodes", function()
    local r = attack("hpack_bomb")
    ends(r, "ENHANCE_YOUR_CALM")
    assert.is_true(r.cpu < 0.2, "cost " .. r.cpu .. " CPU-s")
  end)

  it("a peer that never opens its window: GOAWAY after the send timeout", function()
    local r = attack("shut_window")       -- h2_send_timeout = 1
    ends(r, "FLOW_CONTROL_ERROR")
    assert.is_true(r.seconds >= 0.9, "after " .. r.seconds .. " s")
  end)

  it("a streamed answer to a peer that never opens its window: GOAWAY after the send timeout", function()
    local r = attack("shut_window_stream")   -- h2_send_timeout = 1
    ends(r, "FLOW_CONTROL_ERROR")
    assert.is_true(r.seconds >= 0.9, "after " .. r.seconds .. " s")
  end)

  it("an idle connection: GOAWAY NO_ERROR after keepalive_timeout", function()
    local r = attack("idle")              -- keepalive_timeout = 0.5
    ends(r, "NO_ERROR")
    assert.is_true(r.seconds >= 0.45, "after " .. r.seconds .. " s")
  end)

  it("128 concurrent streams are all answered", function()
    assert.equal(128, attack("concurrency").answered)
  end)

  it("1 GiB sent on one stream to a server that cannot take it adds at most the window + 1 MiB", function()
    local r = attack("upload_slow_reader")
    assert.is_true(r.cpu < 1, "cost " .. r.cpu .. " CPU-s")
    if not H.sanitized then
      assert.is_true(r.rss_growth <= r.window + (1 << 20),
                     ("RSS grew by %d bytes (window %d)"):format(r.rss_growth, r.window))
    end
  end)
end)
