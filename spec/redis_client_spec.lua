-- redis_client_spec.lua -- examples/redis_client.lua, a Redis client in
-- straight-line code over a stream, against a real redis-server (Debian's
-- redis-server, started here on a loopback port without persistence),
-- checked with redis-cli.
local H = require "spec.helper"

local function redis_cli(port, cmd)
  local out, st = H.run("redis-cli -p " .. port .. " " .. cmd)
  assert.equal(0, st, out)
  return (out:gsub("%s+$", ""))
end

describe("redis_client.lua against redis-server", function()
  local port, pid
  setup(function()
    port = H.free_port()
    local f = assert(io.popen(string.format("redis-server --port %d --bind 127.0.0.1 "
      .. "--save '' --appendonly no > /dev/null 2>&1 & echo $!", port)))
    pid = tonumber(f:read("l"))
    f:close()
    assert(H.eventually(function()
      local out = H.run("redis-cli -p " .. port .. " PING")
      return out:find("PONG", 1, true)
    end), "redis-server never answered")
  end)
  teardown(function() if pid then H.stop(pid) end end)

  it("runs commands and a pipelined batch, and reads every reply", function()
    redis_cli(port, "SET spec:other keep-me")
    local out, st = H.run(H.BIN .. " examples/redis_client.lua --port " .. port
      .. " --batch 500 --key spec:rc")
    assert.equal(0, st, out)
    assert.matches('GET %->%s+"hello from netrun"', out)
    assert.matches("INCRBY %->%s+41\n", out)
    assert.matches("NOSUCH %->%s+%(error%) ERR unknown command", out)
    assert.matches("pipelined 500 INCR %-> last 542\n", out)
    assert.matches('MGET %->%s+%["hello from netrun", "542", %(nil%)%]', out)
    assert.matches("done: counter=542\n", out)
    -- it cleaned up its own keys and touched nothing else
    assert.equal("0", redis_cli(port, "EXISTS spec:rc spec:rc:n"))
    assert.equal("keep-me", redis_cli(port, "GET spec:other"))
  end)

  it("fails clearly when no server listens", function()
    local out, st = H.run(H.BIN .. " examples/redis_client.lua --port " .. H.free_port())
    assert.is_not.equal(0, st)
    assert.matches("refused", out)
  end)
end)
