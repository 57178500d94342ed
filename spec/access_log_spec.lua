-- access_log_spec.lua -- netrun.handler.access_log (DESIGN.md §9.6): a
-- line per answer in nginx's variables, written off-loop by the log
-- thread, read back from the file (the codec refuses other control
-- bytes in a head, so tab is the one to see escaped): pipelined requests in order, the
-- codec's own answers (500 for a raising handler, 400 for garbage), 499
-- for a client gone before its answer, a big answer to a client that
-- resets, nginx's escaping, and a file nobody drains: lines dropped and
-- counted while every request is still answered.
local H = require "spec.helper"
local netrun = H.netrun
local core = require "netrun.core"

local FORMAT = '$remote_addr "$request" $status $body_bytes_sent $request_time "$http_user_agent" $request_method $request_uri'

-- The app: /boom raises, /never is never answered, /big is 8 MiB.
local function app()
  return { channel_read = function(_, ctx, req)
    if req.path == "/boom" then error("boom") end
    if req.path == "/never" then return end
    if req.path == "/big" then
      return ctx:write_and_flush { status = 200, body = string.rep("x", 8 << 20) }
    end
    ctx:write_and_flush { status = 200, body = "hello" }
  end }
end

local function serve(group, log)
  local server = netrun.server { group = group, host = "127.0.0.1", port = 0, init = function(ch)
    ch:pipeline():add_last("http", netrun.codec.http_server {})
    ch:pipeline():add_last("log", log)
    ch:pipeline():add_last("app", app())
  end }:sync()
  return server, select(2, server:local_address())
end

local function lines_of(path, n)
  local lines
  assert(H.eventually(function()
    lines = {}
    for l in H.read_file(path):gmatch("[^\n]+") do lines[#lines + 1] = l end
    return #lines >= n
  end, 10), "expected " .. n .. " lines in " .. path .. ", got:\n" .. H.read_file(path))
  return lines
end

describe("netrun.handler.access_log", function()
  local group, dir
  setup(function()
    group = netrun.group { threads = 2, name = "accesslog" }
    dir = H.tmpdir()
  end)
  teardown(function()
    H.shutdown(group)
    os.execute("rm -rf " .. dir)
  end)

  it("logs pipelined requests in order, a raising handler's 500 and the codec's 400", function()
    local path = dir .. "/pipelined.log"
    local server, port = serve(group, netrun.handler.access_log { path = path, format = FORMAT })
    finally(function() server:close():sync() end)
    local c = H.client(port)
    assert(c:send("GET /1 HTTP/1.1\r\nHost: x\r\nUser-Agent: a\r\n\r\n" ..
                  "GET /boom HTTP/1.1\r\nHost: x\r\n\r\n" ..
                  "GET /3?q=1 HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert.equal(200, H.read_response(c))
    assert.equal(500, H.read_response(c))
    assert.equal(200, H.read_response(c))
    assert(c:send("NOT HTTP\r\n\r\n"))
    assert.equal(400, (H.read_response(c)))
    c:close()
    local lines = lines_of(path, 4)
    local pat = '^127%.0%.0%.1 "(.-)" (%d+) (%d+) (%d+%.%d%d%d) "(.-)" (%S+) (%S+)$'
    local expect = {
      { "GET /1 HTTP/1.1", "200", "5", "a", "GET", "/1" },
      { "GET /boom HTTP/1.1", "500", nil, "-", "GET", "/boom" },
      { "GET /3?q=1 HTTP/1.1", "200", "5", "-", "GET", "/3?q=1" },
      { "-", "400", nil, "-", "-", "-" },
    }
    for i, e in ipairs(expect) do
      local req, status, bytes, _, ua, method, uri = lines[i]:match(pat)
      assert.truthy(req, "line " .. i .. " does not match: " .. lines[i])
      assert.same({ e[1], e[2], e[4], e[5], e[6] }, { req, status, ua, method, uri })
      if e[3] then assert.equal(e[3], bytes) end
    end
    assert.equal(4, #lines)
  end)

  it("logs 499 for a request whose client left unanswered, and a reset in a big answer", function()
    local path = dir .. "/gone.log"
    local server, port = serve(group, netrun.handler.access_log { path = path, format = "$status $request_uri $body_bytes_sent" })
    finally(function() server:close():sync() end)
    local c = H.client(port)
    assert(c:send("GET /never HTTP/1.1\r\nHost: x\r\n\r\n"))
    c:close()
    local big = H.client(port)
    assert(big:send("GET /big HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert(big:receive(100))
    big:setoption("linger", { on = true, timeout = 0 })   -- a reset, not a FIN
    big:close()
    local lines = lines_of(path, 2)
    table.sort(lines)
    assert.same({ "200 /big " .. (8 << 20), "499 /never 0" }, lines)
    -- the server goes on
    local out, st = H.run("curl -s http://127.0.0.1:" .. port .. "/after")
    assert.equal(0, st)
    assert.equal("hello", out)
    assert.equal("200 /after 5", lines_of(path, 3)[3])
  end)

  it("escapes quotes, backslashes, control and non-ASCII bytes as nginx's escape=default", function()
    local path = dir .. "/escape.log"
    local server, port = serve(group, netrun.handler.access_log { path = path, format = '"$http_user_agent" "${http_x_odd}" $status' })
    finally(function() server:close():sync() end)
    local c = H.client(port)
    assert(c:send('GET / HTTP/1.1\r\nHost: x\r\nUser-Agent: a"b\\c\tdé\r\nX-Odd: \xff!\r\n\r\n'))
    assert.equal(200, H.read_response(c))
    c:close()
    assert.equal('"a\\x22b\\x5Cc\\x09d\\xC3\\xA9" "\\xFF!" 200', lines_of(path, 1)[1])
  end)

  it("drops and counts lines when the file takes none, and the loop keeps answering", function()
    local fifo = dir .. "/fifo"
    assert(os.execute("mkfifo " .. fifo))
    local reader = assert(io.open(fifo, "r+"))   -- a reader that never reads
    local log = netrun.handler.access_log { path = fifo, buffer = 65536, format = "$status $http_x_pad" }
    local server, port = serve(group, log)
    finally(function() server:close():sync() end)
    local pad = string.rep("p", 2000)
    local c = H.client(port)
    for _ = 1, 10 do                             -- 1000 lines of 2 KB: 2 MB
      local batch = {}
      for _ = 1, 100 do batch[#batch + 1] = "GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " .. pad .. "\r\n\r\n" end
      assert(c:send(table.concat(batch)))
      for _ = 1, 100 do assert.equal(200, (H.read_response(c))) end
    end
    c:close()
    local stats
    for _, s in ipairs(core.access_log_stats()) do
      if s.path == fifo then stats = s end
    end
    assert.truthy(stats.dropped > 0, "nothing dropped")
    assert.equal(1000, stats.lines + stats.dropped)
    assert.matches('netrun_access_log_dropped_total{path="' .. fifo:gsub("%p", "%%%0") .. '"} ' .. stats.dropped,
      netrun.metrics.text())
    reader:close()                               -- the log thread's write fails and it goes on
  end)

  it("checks its options", function()
    assert.has_error(function() netrun.handler.access_log { format = "$nope" } end,
      "netrun.handler.access_log: format: unknown variable $nope")
    assert.has_error(function() netrun.handler.access_log { format = "a $ b" } end)
    assert.has_error(function() netrun.handler.access_log { path = dir .. "/no/such/dir/x.log" } end)
    assert.has_error(function() netrun.handler.access_log { fromat = "$status" } end,
      "netrun.handler.access_log: unknown option 'fromat' (did you mean 'format'?)")
  end)
end)
