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

-- The program's own families (netrun.metrics.counter / gauge / histogram,
-- DESIGN.md §9.6): updated from several loops at once without a lock,
-- rendered after netrun's, read back by the Prometheus parser.
describe("netrun.metrics user families", function()
  if not have_parser then
    it("needs python3-prometheus-client", function() pending("scripts/deps.sh installs it") end)
    return
  end
  local group
  setup(function() group = netrun.group { threads = 2, name = "usermetrics" } end)
  teardown(function() H.shutdown(group) end)

  it("adds up exactly the counts of two loops updating at once", function()
    local c = netrun.metrics.counter { name = "spec_loops_total", help = "Updates.", labels = { "who" } }
    local g = netrun.metrics.gauge { name = "spec_loops_gauge" }
    local N = 50000
    local fs = {}
    for _, l in ipairs(group:loops()) do
      fs[#fs + 1] = l:submit(function()
        -- the same family, by handle (an upvalue) and by name
        local same = require("netrun").metrics.counter { name = "spec_loops_total", help = "Updates.", labels = { "who" } }
        for i = 1, N do
          c:inc(1, { who = "both" })
          same:inc(2, { who = i % 2 == 0 and "even" or "odd" })
          g:inc()
          g:dec(0.5)
        end
        return true
      end)
    end
    for _, f in ipairs(fs) do assert.is_true(H.sync(f, 20)) end
    assert.equal(2 * N, c:get { who = "both" })
    assert.equal(2 * N, c:get { who = "even" })
    assert.equal(2 * N, c:get { who = "odd" })
    assert.equal(N, g:get())
    local rows = parse(netrun.metrics.text())
    local r = find(rows, "spec_loops_total", { who = "both" })
    assert.equal("counter", r.type)
    assert.equal(2 * N, r.value)
    assert.equal(N, find(rows, "spec_loops_gauge").value)
  end)

  it("counts requests of a server on two loops, buckets cumulative, scraped with curl", function()
    local hist = netrun.metrics.histogram { name = "spec_size_bytes", help = "Sizes.",
                                            labels = { "method" }, buckets = { 10, 100, 1000 } }
    local reqs = netrun.metrics.counter { name = "spec_requests_total", labels = { "code" } }
    local server = netrun.server { group = group, host = "127.0.0.1", port = 0, init = function(ch)
      ch:pipeline():add_last("http", netrun.codec.http_server {})
      ch:pipeline():add_last("metrics", netrun.handler.metrics {})
      ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
        local n = tonumber(req.path:match("%d+")) or 0
        hist:observe(n, { method = req.method })
        reqs:inc(1, { code = 200 })            -- a number label reads as its string
        ctx:write_and_flush { status = 200, body = "ok" }
      end })
    end }:sync()
    finally(function() server:close():sync() end)
    local port = select(2, server:local_address())
    -- 4 connections (spread over the loops by the kernel), 5 sizes each
    local urls = {}
    for _, n in ipairs { 5, 10, 50, 500, 5000 } do urls[#urls + 1] = "http://127.0.0.1:" .. port .. "/" .. n end
    for _ = 1, 4 do
      local _, st = H.run("curl -s -o /dev/null " .. table.concat(urls, " -o /dev/null "))
      assert.equal(0, st)
    end
    local out, st = H.run("curl -s http://127.0.0.1:" .. port .. "/metrics")
    assert.equal(0, st)
    local rows = parse(out)
    local function bucket(le) return find(rows, "spec_size_bytes_bucket", { method = "GET", le = le }).value end
    assert.equal(8, bucket("10"))            -- 5 and 10 (le is inclusive)
    assert.equal(12, bucket("100"))
    assert.equal(16, bucket("1000"))
    assert.equal(20, bucket("+Inf"))
    assert.equal(20, find(rows, "spec_size_bytes_count", { method = "GET" }).value)
    assert.equal(4 * 5565, find(rows, "spec_size_bytes_sum", { method = "GET" }).value)
    assert.equal("histogram", find(rows, "spec_size_bytes_count").type)
    assert.equal(20, find(rows, "spec_requests_total", { code = "200" }).value)
  end)

  it("bounds the label sets: past max_series updates go to one _overflow series", function()
    local c = netrun.metrics.counter { name = "spec_bounded_total", labels = { "path" }, max_series = 3 }
    for i = 1, 10 do c:inc(1, { path = "/" .. i }) end
    assert.equal(1, c:get { path = "/3" })
    assert.equal(7, c:get { path = "/9" })     -- the overflow series
    local rows = parse(netrun.metrics.text())
    assert.equal(7, find(rows, "spec_bounded_total", { path = "_overflow" }).value)
    assert.is_nil(find(rows, "spec_bounded_total", { path = "/4" }))
  end)

  it("raises clear errors for bad names, buckets, labels and clashes", function()
    local M = netrun.metrics
    assert.has_error(function() M.counter { name = "1x" } end,
      "netrun.metrics.counter: name 1x is not a valid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)")
    assert.has_error(function() M.counter { name = "a-b" } end)
    assert.has_error(function() M.counter { name = "netrun_mine" } end,
      "netrun.metrics.counter: name netrun_mine: the prefix netrun_ is netrun's own")
    assert.has_error(function() M.counter { help = "x" } end, "netrun.metrics.counter: name is required")
    assert.has_error(function() M.counter { nam = "x" } end,
      "netrun.metrics.counter: unknown option 'nam' (did you mean 'name'?)")
    assert.has_error(function() M.histogram { name = "h_bad", buckets = { 1, 1 } } end,
      "netrun.metrics.histogram: buckets must be finite and increasing, got 1.0 after 1.0")
    assert.has_error(function() M.histogram { name = "h_bad", buckets = {} } end)
    assert.has_error(function() M.histogram { name = "h_bad", labels = { "le" } } end)
    assert.has_error(function() M.counter { name = "c_bad", labels = { "a b" } } end)
    assert.has_error(function() M.counter { name = "c_bad", buckets = { 1 } } end,
      "netrun.metrics.counter: buckets: only a histogram has buckets")
    local c = M.counter { name = "spec_errors_total", labels = { "kind" } }
    assert.has_error(function() c:inc(1, { kind = true }) end,
      "metric spec_errors_total: label kind must be a string or a number, got true")
    assert.has_error(function() c:inc(1, { kind = "a", other = "b" }) end,
      'metric spec_errors_total: unknown label "other"')
    assert.has_error(function() c:inc(1) end, "metric spec_errors_total: labels must be a table, got nil")
    assert.has_error(function() c:inc(-1, { kind = "a" }) end)
    assert.has_error(function() c:set(1, { kind = "a" }) end, "metric spec_errors_total is a counter: it has no set")
    assert.has_error(function() M.gauge { name = "spec_errors_total" } end,
      "netrun.metrics.gauge: spec_errors_total is already a counter of other labels or buckets")
    assert.equal(c, M.counter { name = "spec_errors_total", labels = { "kind" } })
  end)
end)
