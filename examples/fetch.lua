-- fetch.lua -- an HTTP client: --requests requests to --url, --concurrency
-- of them in flight at a time, over a keep-alive pool (netrun.http.client)
-- on one loop; prints what the last response said and, at the end,
--   requests=N seconds=S errors=E cpu=C
-- (cpu: the process's CPU seconds, all threads, from os.clock)
--   netrun examples/fetch.lua --url http://127.0.0.1:8080/ [--requests 1]
--                             [--concurrency 1] [--method GET] [--body S]
--                             [--timeout 5] [--max-body BYTES] [--follow N]
--                             [--verbose 1] [--api future|callback]
--                             [--ca FILE] [--insecure] [--h2 [yes|no|auto]]  (or URL=, ...)
-- https: the server's certificate is verified against the system's CAs,
-- or against --ca FILE (PEM); --insecure verifies nothing (curl's -k: for
-- a test server with a self-signed certificate, never for real ones).
-- --h2: HTTP/2 (yes: always, h2c by prior knowledge for http://; auto, the
-- default: where TLS agrees it; no: HTTP/1.1); requests to an origin are
-- then multiplexed on one connection.
-- --api callback uses client:request(opts, callback) (no future per
-- request) instead of client:request(opts):await().
-- With --requests 1 (the default) it prints the response: status line,
-- headers and body, like curl -i.
local netrun = require "netrun"

local option = netrun.option
local url = option("url") or error("fetch: --url is required (e.g. --url http://127.0.0.1:8080/)")
local requests = math.tointeger(option("requests", 1))
local concurrency = math.tointeger(option("concurrency", 1))
local spec = {
  url = url, method = option("method", "GET"), body = option("body"),
  timeout = option("timeout", 5), follow = option("follow", 0),
}
-- A flag without a value: --name (or --name=1, NAME=1).
local function flag(name)
  for _, a in ipairs(rawget(_G, "arg") or {}) do
    if a == "--" .. name then return true end
  end
  local v = option(name)
  return v ~= nil and v ~= "0" and v ~= "false" and v ~= ""
end
-- --h2 alone (the last argument, or before another --option) is --h2 yes
local h2 = option("h2", "auto")
for i, a in ipairs(arg or {}) do
  if a == "--h2" and (arg[i + 1] == nil or arg[i + 1]:sub(1, 2) == "--") then h2 = "yes" end
end
h2 = ({ yes = true, no = false, auto = "auto" })[h2]
if h2 == nil then error("fetch: --h2 must be yes, no or auto") end
local ca, insecure = option("ca"), flag("insecure")
if ca and insecure then error("fetch: --ca and --insecure: give one (--insecure verifies nothing)") end
local tls = (ca or insecure) and netrun.tls.client {
  ca = ca, verify = not insecure,
  alpn = h2 == false and { "http/1.1" } or h2 == true and { "h2" } or { "h2", "http/1.1" } } or nil
local client = netrun.http.client {
  pool = concurrency, timeout = spec.timeout, max_body = math.tointeger(option("max-body", 1 << 20)),
  tls = tls, h2 = h2,
}
local verbose = requests == 1 or option("verbose", 0) ~= 0
local api = option("api", "future")
if api ~= "future" and api ~= "callback" then error("fetch: --api must be future or callback") end

local group = netrun.group { threads = 1, name = "fetch" }
local done = netrun.promise()

group:next():execute(function(client, spec, requests, concurrency, verbose, done, api)
  local netrun = require "netrun"
  local now = require("netrun.core").now
  local started, left, errors, finished, last = now(), requests, 0, 0, nil
  local workers = math.min(concurrency, requests)
  local function report()
    if verbose and last then
      local lines = { string.format("%s %d %s", last.version, last.status, last.reason) }
      for k, v in pairs(last.headers) do     -- (a repeated Set-Cookie: an array)
        for _, one in ipairs(type(v) == "table" and v or { v }) do lines[#lines + 1] = k .. ": " .. one end
      end
      io.write(table.concat(lines, "\n"), "\n\n", last.body, "\n")
    end
    done:set_success(string.format("requests=%d seconds=%.3f errors=%d cpu=%.3f",
      requests - errors, now() - started, errors, os.clock()))
  end
  local function failed(err)
    errors = errors + 1
    if errors <= 3 then netrun.log.warn("fetch: %s", tostring(err)) end
  end
  -- the future form: a coroutine per request in flight
  local function worker()
    while left > 0 do
      left = left - 1
      local ok, res = pcall(function() return client:request(spec):await() end)
      if ok then last = res else failed(res) end
    end
    finished = finished + 1
    if finished == workers then report() end
  end
  -- the callback form: each answer sends the next request
  local function next_request()
    if left == 0 then
      finished = finished + 1
      if finished == workers then report() end
      return
    end
    left = left - 1
    client:request(spec, function(res, err)
      if res then last = res else failed(err) end
      next_request()
    end)
  end
  for _ = 1, workers do
    if api == "callback" then next_request() else netrun.spawn(worker) end
  end
  if workers == 0 then report() end
end, client, spec, requests, concurrency, verbose, done, api)

print(done:sync())
io.stdout:flush()
group:shutdown_gracefully(0, 1):sync()
