-- metrics_spec.lua -- netrun.metrics.text() and netrun.handler.metrics
-- (DESIGN.md §8.5), checked by a real parser: the Prometheus client's
-- text parser (Debian's python3-prometheus-client) reading what curl got
-- from the handler.
local H = require "spec.helper"
local netrun = H.netrun

local PY = "/usr/bin/python3"
local have_parser = os.execute(PY .. " -c 'import prometheus_client.parser' 2>/dev/null") == true

-- Parse exposition text with prometheus_client; returns an array of
-- { family, type, sample, labels = {}, value } or raises with the parser's
-- complaint.
local function parse(text)
  local dir = H.tmpdir()
  local f = assert(io.open(dir .. "/metrics.txt", "w"))
  f:write(text)
  f:close()
  local script = [[
import sys
from prometheus_client.parser import text_string_to_metric_families
text = open(sys.argv[1]).read()
for fam in text_string_to_metric_families(text):
    for s in fam.samples:
        labels = "\x01".join("%s\x02%s" % (k, v) for k, v in sorted(s.labels.items()))
        print("%s\t%s\t%s\t%s\t%r" % (fam.name, fam.type, s.name, labels.replace("\\", "\\\\").replace("\n", "\\n"), s.value))
]]
  f = assert(io.open(dir .. "/parse.py", "w"))
  f:write(script)
  f:close()
  local out, st = H.run(PY .. " " .. dir .. "/parse.py " .. dir .. "/metrics.txt")
  os.execute("rm -rf " .. dir)
  assert(st == 0, "the Prometheus parser refused it:\n" .. out .. "\n--- text:\n" .. text)
  local rows = {}
  for line in out:gmatch("[^\n]+") do
    local fam, typ, sample, labels, value = line:match("^(.-)\t(.-)\t(.-)\t(.-)\t(.*)$")
    local l = {}
    for kv in labels:gmatch("[^\1]+") do
      local k, v = kv:match("^(.-)\2(.*)$")
      l[k] = (v:gsub("\\(.)", { n = "\n", ["\\"] = "\\" }))
    end
    rows[#rows + 1] = { family = fam, type = typ, sample = sample, labels = l, value = tonumber(value) }
  end
  return rows
end

local function find(rows, sample, labels)
  for _, r in ipairs(rows) do
    if r.sample == sample then
      local ok = true
      for k, v in pairs(labels or {}) do
        if r.labels[k] ~= v then ok = false end
      end
      if ok then return r end
    end
  end
  return nil
end

-- Answers /missing with 404, everything else with 200.
local App = {}
function App:channel_read(ctx, req)
  local status = req.path == "/missing" and 404 or 200
  ctx:write_and_flush { status = status, headers = { ["content-type"] = "text/plain" }, body = "ok\n" }
end

describe("netrun.metrics", function()
  local group, server, port

  setup(function()
    group = netrun.group { threads = 2, name = 'we"ird\\name' }
    server = netrun.server { group = group, host = "127.0.0.1", port = 0, init = function(ch)
      ch:pipeline():add_last("http", netrun.codec.http_server {})
      ch:pipeline():add_last("metrics", netrun.handler.metrics {})
      ch:pipeline():add_last("app", App)
    end }:sync()
    port = select(2, server:local_address())
  end)
  teardown(function() H.shutdown(group) end)

  if not have_parser then
    it("needs python3-prometheus-client", function() pending("scripts/deps.sh installs it") end)
    return
  end

  it("serves the text format over HTTP, and the Prometheus parser reads every loop, server and status", function()
    local before = find(parse(netrun.metrics.text()), "netrun_http_requests_total", { code = "404" })
    local base404 = before and before.value or 0
    local c = H.client(port)
    for i = 1, 7 do
      assert(c:send("GET /missing HTTP/1.1\r\nHost: x\r\n\r\n"))
      assert.equal(404, H.read_response(c))
    end
    assert(c:send("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert.equal(200, H.read_response(c))
    local out, st = H.run("curl -s -D " .. "/dev/stderr http://127.0.0.1:" .. port .. "/metrics")
    assert.equal(0, st)
    assert.matches("[Cc]ontent%-[Tt]ype: text/plain; version=0%.0%.4", out)
    local body = out:match("\r\n\r\n(.*)$")
    local rows = parse(body)
    -- every loop, its name escaped and read back as it is
    for i = 1, 2 do
      local name = 'we"ird\\name-' .. i
      local r = find(rows, "netrun_loop_tasks_total", { loop = name })
      assert.truthy(r, "no tasks counter for " .. name)
      assert.equal("counter", r.type)
      assert.equal("netrun_loop_tasks", r.family)
      for _, s in ipairs { "netrun_loop_channels", "netrun_loop_pending_tasks", "netrun_loop_lua_memory_bytes",
                           "netrun_loop_stalls_total", "netrun_loop_busy_seconds_total", "netrun_loop_max_busy_seconds" } do
        assert.truthy(find(rows, s, { loop = name }), s .. " missing for " .. name)
      end
      assert.equal(1, find(rows, "netrun_loop_state", { loop = name, state = "started" }).value)
    end
    local label = "127.0.0.1:" .. port
    local open = find(rows, "netrun_server_connections", { server = label })
    assert.truthy(open, "no connection gauge for " .. label)
    assert.equal("gauge", open.type)
    assert.truthy(open.value >= 2)          -- c and curl's
    assert.truthy(find(rows, "netrun_server_accepted_total", { server = label }).value >= 2)
    assert.equal(base404 + 7, find(rows, "netrun_http_requests_total", { code = "404" }).value)
    assert.truthy(find(rows, "netrun_http_requests_total", { code = "200" }))
    c:close()
    -- the closed connection leaves the gauge
    assert(H.eventually(function()
      local r = find(parse(netrun.metrics.text()), "netrun_server_connections", { server = label })
      return r.value == 0
    end, 5))
  end)

  it("passes other paths on to the handlers after it", function()
    local c = H.client(port)
    assert(c:send("GET /other HTTP/1.1\r\nHost: x\r\n\r\n"))
    local status, _, body = H.read_response(c)
    assert.equal(200, status)
    assert.equal("ok\n", body)
    c:close()
  end)

  it("takes another path, and checks its options", function()
    local h = netrun.handler.metrics { path = "/m" }
    assert.equal("/m", h.path)
    assert.has_error(function() netrun.handler.metrics { pth = "/m" } end,
      "netrun.handler.metrics: unknown option 'pth' (did you mean 'path'?)")
    assert.has_error(function() netrun.handler.metrics { path = "m" } end)
  end)

  it("renders HELP and TYPE once per family and counters ending in _total", function()
    local text = netrun.metrics.text()
    local seen = {}
    for name, kind in text:gmatch("# TYPE (%S+) (%S+)") do
      assert.is_nil(seen[name], name .. " typed twice")
      seen[name] = true
      if kind == "counter" then assert.matches("_total$", name) end
      assert.truthy(text:find("# HELP " .. name .. " ", 1, true), name .. " has no HELP")
    end
  end)
end)

describe("netrun.metrics of a process with a console", function()
  it("lists the program's servers and not the console's socket", function()
    local port = H.free_port()
    local dir = H.tmpdir()
    local sock = dir .. "/console.sock"
    local pid, log = H.start("--console " .. sock .. " spec/fixtures/middleware_app.lua", port, "--front metrics")
    local out, st = H.run("curl -s --max-time 5 http://127.0.0.1:" .. port .. "/metrics")
    assert.equal(0, st, out)
    local servers = {}
    for label in out:gmatch('netrun_server_accepted_total{server="([^"]*)"}') do servers[#servers + 1] = label end
    assert.same({ "127.0.0.1:" .. port }, servers)
    assert.is_true(H.stop(pid))
    os.remove(log)
    os.execute("rm -rf " .. dir)
  end)
end)
