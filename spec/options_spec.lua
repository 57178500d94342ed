-- options_spec.lua -- every public constructor reads its options one way
-- (runtime/bindings/lopts.c, DESIGN.md §9.7): a numeric string is taken
-- where a number is ("8080" from arg, os.getenv or LuaSocket's
-- getsockname), a value of the wrong type is refused naming the
-- constructor, the field, the value and what is expected, a key near a
-- real one is answered with "did you mean", and every message names the
-- caller's line -- called directly, through pcall, in a coroutine, on a
-- loop. One row per constructor: a new constructor is a new row.
local H = require "spec.helper"
local netrun = H.netrun

local dir = H.tmpdir()
assert(H.run("bash " .. H.root .. "/spec/fixtures/tls/make_certs.sh " .. dir))
local CERT, KEY = dir .. "/server.crt", dir .. "/server.key"
local tls_server = netrun.tls.server { cert = CERT, key = KEY }
local tls_client = netrun.tls.client { verify = false }

-- What netrun.websocket.upgrade is given when its options pass: a request
-- it refuses (405) on a context that takes the answer.
local CTX = { write_and_flush = function() end }
local POST = { method = "POST", headers = {} }

-- Each row: the constructor's name as messages give it; call(o), on one
-- line (its line is the caller's line every message must name: not a
-- tail call, which would take its frame off the stack); base,
-- the options every case adds to; numeric, options given as strings where
-- numbers belong, taken (done(result) ends what they made; loop: the
-- constructor runs only on a loop); wrong, { options, message } refused;
-- typo (and typo2), { options, what it meant }.
local rows = {
  { name = "netrun.server", call = function(o) local r = netrun.server(o) return r end,
    base = { host = "127.0.0.1", port = 0 },
    numeric = { port = "0", backlog = "16", child_options = { sndbuf = "64k", send_timeout = "1.5" } },
    done = function(f) f:sync():close():sync() end,
    wrong = { { { backlog = "many" }, 'backlog must be an integer from 1 to 2147483647, got "many"' },
              { { tls = tls_client }, "tls must be a netrun.tls.server config, got netrun.tls.client (generation 1)" },
              { { child_options = { tcp_nodelay = "no" } }, 'child_options.tcp_nodelay must be a boolean, got "no"' } },
    typo = { { bakclog = 16 }, "backlog" } },
  { name = "netrun.server (tls)", what = "netrun.server", call = function(o) local r = netrun.server(o) return r end,
    base = { host = "127.0.0.1", port = 0, tls = tls_server },
    numeric = { port = "0" }, done = function(f) f:sync():close():sync() end,
    wrong = { { { init = 5 }, "init must be a function, got 5" } },
    typo = { { chlid_group = 1 }, "child_group" } },
  { name = "netrun.connect", call = function(o) local r = netrun.connect(o) return r end,
    base = { host = "127.0.0.1", port = 1 },
    numeric = { port = "1", timeout = "0.5", options = { write_buffer_high = "128k" } },
    done = function(f) pcall(f.sync, f) end,
    wrong = { { { timeout = "soon" }, 'timeout must be a number of seconds from 0 to 1e9, got "soon"' },
              { { tls = tls_server }, "tls must be a netrun.tls.client config, got netrun.tls.server (generation 1)" } },
    typo = { { timout = 1 }, "timeout" } },
  { name = "netrun.udp", call = function(o) local r = netrun.udp(o) return r end,
    base = { host = "127.0.0.1", port = 0 },
    numeric = { port = "0" }, done = function(f) f:sync():close():sync() end,
    wrong = { { { host = 5 }, "host must be a string, got 5" } },
    typo = { { hots = "127.0.0.1" }, "host" } },
  { name = "netrun.group", call = function(o) local r = netrun.group(o) return r end,
    numeric = { threads = "1", io_ratio = "50", stall_threshold = "2.5", lua_memory_limit = "64m" },
    done = H.shutdown,
    wrong = { { { io_ratio = "half" }, 'io_ratio must be an integer from 1 to 100, got "half"' } },
    typo = { { thread = 1 }, "threads" } },
  { name = "netrun.executor_group", call = function(o) local r = netrun.executor_group(o) return r end,
    numeric = { threads = "1", max_pending_tasks = "100" }, done = H.shutdown,
    wrong = { { { daemon = "yes" }, 'daemon must be a boolean, got "yes"' } },
    typo = { { max_pending_task = 1 }, "max_pending_tasks" } },
  { name = "netrun.shared.dict", call = function(o) local r = netrun.shared.dict("options_spec", o) return r end,
    numeric = { capacity = "100", memory = "1m" },
    wrong = { { { capacity = "lots" }, 'capacity must be an integer >= 1, got "lots"' } },
    typo = { { capacty = 1 }, "capacity" } },
  { name = "netrun.tls.server", call = function(o) local r = netrun.tls.server(o) return r end,
    base = { cert = CERT, key = KEY },
    numeric = { handshake_timeout = "5", session_tickets = "2" },
    wrong = { { { verify = "yes" }, 'verify must be "none", "optional" or "required", got "yes"' },
              { { alpn = "h2" }, 'alpn must be an array of 1 to 32 strings, got "h2"' } },
    typo = { { apln = { "h2" } }, "alpn" } },
  { name = "netrun.tls.client", call = function(o) local r = netrun.tls.client(o) return r end,
    numeric = { handshake_timeout = "5" },
    wrong = { { { verify = "yes" }, 'verify must be a boolean, got "yes"' },
              { { min_version = "TLSv1.1" }, 'min_version must be "TLSv1.2" or "TLSv1.3", got "TLSv1.1"' } },
    typo = { { server_nam = "x" }, "server_name" } },
  { name = "netrun.codec.line", call = function(o) local r = netrun.codec.line(o) return r end,
    numeric = { max_length = "64" },
    wrong = { { { strip = "no" }, 'strip must be a boolean, got "no"' } },
    typo = { { max_lenght = 64 }, "max_length" } },
  { name = "netrun.codec.delimiter", call = function(o) local r = netrun.codec.delimiter(o) return r end,
    base = { delimiters = { "\n" } }, numeric = { max_length = "1k" },
    wrong = { { { delimiters = { "\n", 5 } }, "delimiters[2] must be a string, got 5" } },
    typo = { { delimiter = { "\n" } }, "delimiters" } },
  { name = "netrun.codec.length_field", call = function(o) local r = netrun.codec.length_field(o) return r end,
    numeric = { length = "2", offset = "1", max_frame = "64k" },
    wrong = { { { length = 5 }, "length must be 1, 2, 3, 4 or 8, got 5" } },
    typo = { { ofset = 1 }, "offset" } },
  { name = "netrun.codec.length_prepender", call = function(o) local r = netrun.codec.length_prepender(o) return r end,
    numeric = { length = "2", adjustment = "-1" },
    wrong = { { { includes_length = 1 }, "includes_length must be a boolean, got 1" } },
    typo = { { lenght = 2 }, "length" } },
  { name = "netrun.codec.fixed_length", call = function(o) local r = netrun.codec.fixed_length(o) return r end,
    base = { length = 4 }, numeric = { length = "4" },
    wrong = { { { length = {} }, "length must be a size in bytes from 1 to 1099511627776, got a table" } },
    typo = { { lengh = 4 }, "length" } },
  { name = "netrun.codec.http_server", call = function(o) local r = netrun.codec.http_server(o) return r end,
    numeric = { header_timeout = "2", max_body = "1m", max_headers = "50", body_budget = "32m",
                conn_body_budget = "8388608" },
    wrong = { { { keepalive_timeout = "soon" }, 'keepalive_timeout must be a number of seconds from 0 to 1e9, got "soon"' },
              { { conn_body_budget = -1 }, "conn_body_budget must be a size in bytes from 0 to 1125899906842624, got -1" } },
    typo = { { max_bdy = 1 }, "max_body" }, typo2 = { { body_bugdet = 1 }, "body_budget" } },
  { name = "netrun.codec.http_client", call = function(o) local r = netrun.codec.http_client(o) return r end,
    numeric = { max_headers = "50", max_header = "16k" },
    wrong = { { { raw = "yes" }, 'raw must be a boolean, got "yes"' } },
    typo = { { max_hedaer = 1 }, "max_header" } },
  { name = "netrun.codec.websocket", call = function(o) local r = netrun.codec.websocket(o) return r end,
    numeric = { max_message = "65536", close_timeout = "1.5", inflate_ratio = "10" },
    wrong = { { { max_frame = 0 }, "max_frame must be a size in bytes from 1 to 1099511627776, got 0" } },
    typo = { { max_mesage = 1 }, "max_message" } },
  { name = "netrun.codec.resp", call = function(o) local r = netrun.codec.resp(o) return r end,
    numeric = { max_args = "10", max_bulk = "1m" },
    wrong = { { { max_inline = -1 }, "max_inline must be a size in bytes from 1 to 1099511627776, got -1" } },
    typo = { { max_arg = 1 }, "max_args" } },
  { name = "netrun.handler.idle_state", call = function(o) local r = netrun.handler.idle_state(o) return r end,
    numeric = { reader = "1.5", all = "60" },
    wrong = { { { writer = {} }, "writer must be a number of seconds from 0 to 1e9, got a table" } },
    typo = { { raeder = 1 }, "reader" } },
  { name = "netrun.handler.logging", call = function(o) local r = netrun.handler.logging(o) return r end,
    wrong = { { { level = "verbose" }, 'level must be "debug", "info", "warn" or "error", got "verbose"' } },
    typo = { { levle = "info" }, "level" } },
  { name = "netrun.handler.static", call = function(o) local r = netrun.handler.static(o) return r end,
    numeric = { max_chunk = "64k", max_ranges = "8" },
    wrong = { { { max_chunk = 1 }, "max_chunk must be a size in bytes from 4096 to 1099511627776, got 1" },
              { { precompressed = "yes" }, 'precompressed must be a boolean, got "yes"' } },
    typo = { { max_chunck = 1 }, "max_chunk" } },
  { name = "netrun.handler.metrics", call = function(o) local r = netrun.handler.metrics(o) return r end,
    wrong = { { { path = 5 }, "path must be a string, got 5" } },
    typo = { { pth = "/m" }, "path" } },
  { name = "netrun.metrics.histogram", call = function(o) local r = netrun.metrics.histogram(o) return r end,
    base = { name = "options_spec_histogram" },
    numeric = { max_series = "10" },
    wrong = { { { max_series = "many" }, 'max_series must be an integer from 1 to 100000, got "many"' } },
    typo = { { bucket = { 1 } }, "buckets" } },
  { name = "netrun.handler.access_log", call = function(o) local r = netrun.handler.access_log(o) return r end,
    base = { path = "/dev/null" },
    numeric = { buffer = "64k" },
    wrong = { { { format = 5 }, "format must be a string, got 5" } },
    typo = { { fromat = "$status" }, "format" } },
  { name = "netrun.limit.req", call = function(o) local r = netrun.limit.req(o) return r end,
    base = { rate = 10 },
    numeric = { burst = "5", capacity = "100", shed_lag = "0.5" },
    wrong = { { { nodelay = "yes" }, 'nodelay must be a boolean, got "yes"' } },
    typo = { { brust = 1 }, "burst" } },
  { name = "netrun.http.client", call = function(o) local r = netrun.http.client(o) return r end,
    numeric = { pool = "4", timeout = "2", max_body = "1m", keepalive = "30", max_waiting = "16" },
    wrong = { { { pool = "many" }, 'pool must be an integer >= 1, got "many"' },
              { { tls = tls_server }, "tls must be a netrun.tls.client config, got netrun.tls.server (generation 1)" },
              { { follow_downgrade = "yes" }, 'follow_downgrade must be a boolean, got "yes"' } },
    typo = { { keepalvie = 1 }, "keepalive" } },
  { name = "netrun.http.request", call = function(o) local r = netrun.http.request(o) return r end,
    base = { url = "http://127.0.0.1:1/" }, numeric = { timeout = "0.5", max_body = "64k", follow = "2" },
    done = function(f) pcall(f.sync, f) end,
    wrong = { { { timeout = "soon" }, 'timeout must be a number of seconds from 0 to 1e9, got "soon"' },
              { { headers = "x" }, 'headers must be a table, got "x"' },
              { { follow_downgrade = 1 }, "follow_downgrade must be a boolean, got 1" } },
    typo = { { ulr = "http://127.0.0.1:1/" }, "url" } },
  { name = "client:request", what = "netrun.http.request",
    call = function(o) local r = netrun.http.client {}:request(o) return r end,
    base = { url = "http://127.0.0.1:1/" }, numeric = { timeout = "0.5" },
    done = function(f) pcall(f.sync, f) end,
    wrong = { { { max_body = "big" }, 'max_body must be a size in bytes from 0 to 1099511627776, got "big"' } },
    typo = { { methdo = "GET" }, "method" } },
  { name = "netrun.websocket.connect", call = function(o) local r = netrun.websocket.connect(o) return r end,
    base = { url = "ws://127.0.0.1:1/" }, numeric = { timeout = "0.5", max_message = "64k" },
    done = function(f) pcall(f.sync, f) end,
    wrong = { { { url = "http://x/" }, 'url must be ws:// or wss://host[:port][/path], got "http://x/"' },
              { { protocols = "chat" }, 'protocols must be an array of 1 to 64 strings, got "chat"' } },
    typo = { { protocls = { "chat" } }, "protocols" } },
  { name = "netrun.websocket.upgrade", call = function(o) local r = netrun.websocket.upgrade(CTX, POST, o) return r end,
    numeric = { max_message = "64k", frame_timeout = "30" },
    wrong = { { { deflate = "yes" }, 'deflate must be a boolean, got "yes"' } },
    typo = { { protocls = { "chat" } }, "protocols" } },
  { name = "netrun.tcp.connect", call = function(o) local r = netrun.tcp.connect("127.0.0.1", "1", o) return r end,
    numeric = { timeout = "0.5" }, loop = true,
    done = function(f) pcall(f.await, f) end,
    wrong = { { { timeout = {} }, "timeout must be a number of seconds from 0 to 1e9, got a table" } },
    typo = { { timeuot = 1 }, "timeout" } },
  { name = "netrun.redis.connect", call = function(o) local r = netrun.redis.connect(o) return r end,
    numeric = { port = "6379", timeout = "2", pool = "2", max_reply = "1m", db = "1" },
    wrong = { { { resp = "three" }, 'resp must be an integer from 2 to 3, got "three"' } },
    typo = { { poool = 1 }, "pool" } },
  { name = "netrun.redis.cluster", call = function(o) local r = netrun.redis.cluster(o) return r end,
    base = { nodes = { "127.0.0.1:7000" } }, numeric = { max_retries = "2", retry_delay = "0.1" },
    wrong = { { { read_from = "slave" }, 'read_from must be "master" or "replica", got "slave"' } },
    typo = { { max_redirect = 1 }, "max_redirects" } },
  { name = "netrun.dns.configure", call = function(o) local r = netrun.dns.configure(o) return r end,
    numeric = { max_waiting = "1000" },
    wrong = { { { max_inflight = 0 }, "max_inflight must be an integer from 1 to 1000000, got 0" } },
    typo = { { max_infligth = 1 }, "max_inflight" } },
  { name = "netrun.dns.resolve", call = function(o) local r = netrun.dns.resolve("localhost", o) return r end,
    numeric = {}, done = function(f) pcall(f.sync, f) end,
    wrong = { { { family = 4 }, 'family must be "inet" or "inet6", got 4' } },
    typo = { { famliy = "inet" }, "family" } },
  { name = "netrun.json.configure", call = function(o) local r = netrun.json.configure(o) return r end,
    numeric = { encode_max_depth = "1000" },
    wrong = { { { decode_invalid_numbers = "yes" }, 'decode_invalid_numbers must be a boolean, got "yes"' } },
    typo = { { encode_max_dept = 1 }, "encode_max_depth" } },
}

local function with(base, extra)
  local o = {}
  for k, v in pairs(base or {}) do o[k] = v end
  for k, v in pairs(extra) do o[k] = v end
  return o
end

local function escape(s) return (s:gsub("[%^%$%(%)%%%.%[%]%*%+%-%?]", "%%%0")) end

-- The whole message: the caller's line (that of row.call), the
-- constructor, the cause.
local function expected(row, cause)
  local line = debug.getinfo(row.call, "S").linedefined
  return "^[^:]*options_spec%.lua:" .. line .. ": " .. escape(row.what or row.name) .. ": "
    .. escape(cause) .. "$"
end

local function refused(row, opts)
  local ok, err = pcall(row.call, with(row.base, opts))
  assert.is_false(ok, row.name .. " took " .. require("netrun.pretty").format(opts))
  return tostring(err)
end

local group
setup(function() group = netrun.group { threads = 1, name = "opts" } end)
teardown(function() H.shutdown(group) end)

describe("every constructor's options", function()
  for _, row in ipairs(rows) do
    describe(row.name, function()
      if row.numeric then
        it("takes numeric strings where numbers belong", function()
          local opts = with(row.base, row.numeric)
          local ok, res
          if row.loop then
            local r = group:next():submit(function(call, o, done)
              return require("netrun").spawn(function()
                local ok, r = pcall(call, o)
                if ok and done then done(r) end
                return { ok, ok or tostring(r) }
              end)
            end, row.call, opts, row.done):sync():sync()
            ok, res = r[1], r[2]
          else
            ok, res = pcall(row.call, opts)
            if ok and row.done then row.done(res) end
          end
          assert(ok, tostring(res))
        end)
      end

      it("refuses a wrong type naming the constructor, the field, the value and what it takes", function()
        for _, case in ipairs(row.wrong) do
          assert.matches(expected(row, case[2]), refused(row, case[1]))
        end
      end)

      it("answers a key near a real one with did you mean", function()
        for _, typo in ipairs { row.typo, row.typo2 } do
          local k = next(typo[1])
          assert.matches(expected(row, ("unknown option '%s' (did you mean '%s'?)"):format(k, typo[2])),
            refused(row, typo[1]))
        end
      end)

      it("names the caller's line in a coroutine and on a loop", function()
        local opts = with(row.base, row.wrong[1][1])
        local where = expected(row, ""):sub(1, -2)    -- the position and the name
        local _, err = coroutine.wrap(function() return pcall(row.call, opts) end)()
        assert.matches(where, tostring(err))
        local r = group:next():submit(function(call, o)
          return { pcall(call, o) }
        end, row.call, opts):sync()
        assert.is_false(r[1])
        assert.matches(where, tostring(r[2]))
      end)
    end)
  end
end)

describe("the caller's line", function()
  it("is the pcall's when pcall calls the constructor itself", function()
    local cases = {
      { netrun.server, { port = 0, backlog = "many" }, "netrun.server: backlog" },
      { netrun.connect, { port = 1, timout = 1 }, "netrun.connect: unknown option 'timout'" },
      { netrun.tls.server, { cert = CERT, key = KEY, verify = "yes" }, "netrun.tls.server: verify" },
      { netrun.codec.line, { strip = 1 }, "netrun.codec.line: strip" },
      { netrun.http.request, { ulr = "x" }, "netrun.http.request: unknown option 'ulr'" },
      { netrun.websocket.connect, { url = "ws://x/", protocls = {} }, "netrun.websocket.connect: unknown option" },
      { netrun.handler.metrics, { pth = "/" }, "netrun.handler.metrics: unknown option" },
    }
    for _, c in ipairs(cases) do
      local line, ok, err = debug.getinfo(1, "l").currentline + 1, nil, nil
      ok, err = pcall(c[1], c[2])
      assert.is_false(ok)
      assert.matches("^[^:]*options_spec%.lua:" .. line .. ": " .. escape(c[3]), tostring(err))
    end
  end)

  it("is the script's when a script gives netrun.server a port from arg (not lua/netrun/init.lua)", function()
    local script = dir .. "/port.lua"
    local f = assert(io.open(script, "w"))
    f:write([[
local netrun = require "netrun"
local port = arg[1]                       -- a string, as arg always is
local server = netrun.server { host = "127.0.0.1", port = port, tls = nil }:sync()
print("listening", select(2, server:local_address()))
server:close():sync()
netrun.server { host = "127.0.0.1", port = port, tls = netrun.tls.client {} }
]])
    f:close()
    local out = H.run(H.BIN .. " " .. script .. " 0 2>&1")
    assert.matches("listening\t%d+", out)
    assert.matches("port%.lua:6: netrun%.server: tls must be a netrun%.tls%.server config, got netrun%.tls%.client", out)
  end)
end)
