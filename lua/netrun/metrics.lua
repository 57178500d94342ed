--- The process's figures in the Prometheus text exposition format 0.0.4:
-- `netrun.metrics`, loaded on first use. Every loop's
-- stats (`netrun_loop_*{loop}`), each server's connections
-- (`netrun_server_connections{server}`, labelled by `netrun.server`'s
-- `metrics` option), the HTTP server codec's responses by status, the
-- Redis cluster client's redirects and retries. Nothing is counted for
-- it: it sums counters that exist anyway when rendered. docs/guide/operating.md, "Metrics".
-- @module netrun.metrics

-- netrun.metrics -- the process's figures in the Prometheus text
-- exposition format 0.0.4 (DESIGN.md §8.5): every loop's stats, each
-- server's connections, the HTTP codec's responses by status, the Redis
-- cluster client's redirects and retries.
--
-- Nothing is counted for this module: it reads counters that exist anyway
-- (loop:stats(), the per-server counts of lchannel.c, the per-thread HTTP
-- stripes of runtime/codec/http_stats.c) and sums them when rendered, so
-- a process that never renders pays nothing.
local core = require "netrun.core"

local M = {}

local function escape(v)
  return (tostring(v):gsub('[\\"\n]', { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" }))
end

local function number(v)
  if math.type(v) == "integer" then return string.format("%d", v) end
  if v ~= v then return "NaN" end
  if v == math.huge then return "+Inf" elseif v == -math.huge then return "-Inf" end
  return string.format("%.10g", v)
end

-- One family: its HELP and TYPE lines, then a sample per row
-- ({ labels = { name = value, ... } (kept in order as pairs), value }).
local function family(out, name, kind, help, rows)
  if #rows == 0 then return end
  out[#out + 1] = "# HELP " .. name .. " " .. help:gsub("\\", "\\\\"):gsub("\n", "\\n")
  out[#out + 1] = "# TYPE " .. name .. " " .. kind
  for _, r in ipairs(rows) do
    local labels = {}
    for i = 1, #r.labels, 2 do
      labels[#labels + 1] = r.labels[i] .. '="' .. escape(r.labels[i + 1]) .. '"'
    end
    local l = #labels > 0 and ("{" .. table.concat(labels, ",") .. "}") or ""
    out[#out + 1] = name .. l .. " " .. number(r.value)
  end
end

-- The loop families: field of loop:stats() (or a function of them), type,
-- help.
local LOOP = {
  { "netrun_loop_tasks_total", "counter", "tasks_run", "Tasks the loop has run." },
  { "netrun_loop_pending_tasks", "gauge", "pending_tasks", "Tasks queued and not yet run." },
  { "netrun_loop_scheduled_tasks", "gauge", "scheduled_tasks", "Timers and scheduled tasks waiting." },
  { "netrun_loop_channels", "gauge", "channels", "Channels registered on the loop." },
  { "netrun_loop_io_events_total", "counter", "io_events", "I/O readiness events handled." },
  { "netrun_loop_wakeups_total", "counter", "wakeups", "Wakeups from other threads." },
  { "netrun_loop_iterations_total", "counter", "iterations", "Iterations of the loop." },
  { "netrun_loop_selector_rebuilds_total", "counter", "selector_rebuilds",
    "Selectors rebuilt after spurious wakeups." },
  { "netrun_loop_busy_seconds_total", "counter", function(s) return s.io_time + s.task_time end,
    "Seconds spent handling I/O and running tasks." },
  { "netrun_loop_stalls_total", "counter", "stalls",
    "Stalls: a task or handler call that ran past the group's stall_threshold." },
  { "netrun_loop_max_busy_seconds", "gauge", "max_busy", "The longest uninterrupted run, seconds." },
  { "netrun_loop_lua_memory_bytes", "gauge", "lua_memory", "Bytes held by the loop's Lua state." },
}

local function loop_stats()
  local rows, seen = {}, {}
  for _, g in ipairs(core.groups()) do
    for _, l in ipairs(g:loops()) do
      local s = l:stats()
      local name = s.name
      if seen[name] then                   -- two groups of one name
        seen[name] = seen[name] + 1
        name = name .. "#" .. seen[name]
      else
        seen[name] = 1
      end
      rows[#rows + 1] = { name = name, s = s }
    end
  end
  return rows
end

--- Render the exposition, every family once.
-- @treturn string the text, as a scrape wants it
function M.text()
  local out, loops = {}, loop_stats()
  for _, f in ipairs(LOOP) do
    local name, kind, field, help = f[1], f[2], f[3], f[4]
    local rows = {}
    for _, l in ipairs(loops) do
      local v = type(field) == "function" and field(l.s) or l.s[field]
      rows[#rows + 1] = { labels = { "loop", l.name }, value = v }
    end
    family(out, name, kind, help, rows)
  end
  local states = {}
  for _, l in ipairs(loops) do
    states[#states + 1] = { labels = { "loop", l.name, "state", l.s.state }, value = 1 }
  end
  family(out, "netrun_loop_state", "gauge", "The loop's state (the labelled one is 1).", states)

  local open, accepted = {}, {}
  for _, s in ipairs(core.server_stats()) do
    open[#open + 1] = { labels = { "server", s.server }, value = s.open }
    accepted[#accepted + 1] = { labels = { "server", s.server }, value = s.accepted }
  end
  family(out, "netrun_server_connections", "gauge", "Connections open, per server.", open)
  family(out, "netrun_server_accepted_total", "counter", "Connections accepted, per server.", accepted)

  local http, codes = core.http_stats(), {}
  for code in pairs(http) do codes[#codes + 1] = code end
  table.sort(codes)
  local rows = {}
  for _, code in ipairs(codes) do
    rows[#rows + 1] = { labels = { "code", tostring(code) }, value = http[code] }
  end
  family(out, "netrun_http_requests_total", "counter",
    "HTTP requests answered by the server codec, by status code.", rows)
  M.redis_families(out)
  local written, dropped = {}, {}
  for _, f in ipairs(core.access_log_stats()) do
    written[#written + 1] = { labels = { "path", f.path }, value = f.lines }
    dropped[#dropped + 1] = { labels = { "path", f.path }, value = f.dropped }
  end
  family(out, "netrun_access_log_lines_total", "counter",
    "Access log lines queued for the log thread, per file.", written)
  family(out, "netrun_access_log_dropped_total", "counter",
    "Access log lines dropped: the file's buffer was full (a slow disk).", dropped)
  out[#out + 1] = ""
  return table.concat(out, "\n") .. core.metrics_text()
end

-- The program's own families (runtime/bindings/lmetrics.c): handles to
-- C memory shared by every state, updated without a lock.
M.counter = core.metric_counter
M.gauge = core.metric_gauge
M.histogram = core.metric_histogram

-- netrun.redis's cluster client counts its redirects, retries and slot
-- map refreshes in a shared dict (lua/netrun/redis/cluster.lua); shown
-- once there is something to show.
function M.redis_families(out)
  local d = core.dict("netrun.redis.metrics", { capacity = 64 })
  if #d == 0 then return end
  local redirects = {}
  for _, kind in ipairs { "moved", "ask" } do
    redirects[#redirects + 1] = { labels = { "kind", kind }, value = d:get(kind) or 0 }
  end
  family(out, "netrun_redis_redirects_total", "counter",
    "Redis Cluster redirects followed (MOVED, ASK).", redirects)
  family(out, "netrun_redis_retries_total", "counter",
    "Redis Cluster commands sent again after a failed connection, TRYAGAIN, CLUSTERDOWN or LOADING.",
    { { labels = {}, value = d:get("retries") or 0 } })
  family(out, "netrun_redis_slot_refreshes_total", "counter",
    "Redis Cluster slot maps fetched.", { { labels = {}, value = d:get("refreshes") or 0 } })
end

local CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

local Handler = {}
Handler.__index = Handler
M.Handler = Handler

-- After netrun.codec.http_server: answers GET (and HEAD) of its path with
-- the exposition, passes every other request on.
function Handler:channel_read(ctx, req)
  if type(req) ~= "userdata" and type(req) ~= "table" or req.path ~= self.path then
    return ctx:fire_channel_read(req)
  end
  if req.method ~= "GET" and req.method ~= "HEAD" then
    return ctx:write_and_flush { status = 405, headers = { allow = "GET, HEAD",
      ["content-type"] = "text/plain" }, body = "method not allowed\n" }
  end
  ctx:write_and_flush { status = 200, headers = { ["content-type"] = CONTENT_TYPE },
    body = require("netrun.metrics").text() }
end

local check_handler = core.options("netrun.handler.metrics", { path = "string" })

--- A handler that serves `text()` over HTTP (also `netrun.handler.metrics`):
-- after `netrun.codec.http_server`, it answers GET and HEAD of its path and
-- passes every other request on.
-- @tparam[opt] table opts
-- @string[opt="/metrics"] opts.path the path it answers
-- @return the handler
function M.handler(opts)
  opts = check_handler(opts) or {}
  local path = opts.path or "/metrics"
  if path:sub(1, 1) ~= "/" then
    core.option_error("netrun.handler.metrics", "path", path, "a string starting with '/'")
  end
  return setmetatable({ path = path }, Handler)
end

return M
