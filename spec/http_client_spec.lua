-- http_client_spec.lua -- DESIGN.md §8.3: netrun.http.request,
-- netrun.http.client and netrun.codec.http_client against a netrun
-- server, scripted raw servers (stream servers sending exact bytes),
-- nginx, a Node http server and the HTTPS example.
local H = require "spec.helper"
local netrun = H.netrun
local socket = H.socket

local on_loop = H.on_loop

-- On a loop: track, got, all. track(name[, also]) is a request's
-- callback recording in got[name] its calls, when (seconds since now) and
-- the body or error, then calling also(); all completes at the want-th call.
local function tracker(want)
  local netrun = require "netrun"
  local t0, got, n, all = netrun.now(), {}, 0, netrun.promise()
  local function track(name, also)
    return function(res, err)
      got[name] = got[name] or { calls = 0 }
      local g = got[name]
      g.calls, g.at, g.res = g.calls + 1, netrun.now() - t0, res and res.body or err
      n = n + 1
      if also then also() end
      if n == want then all:try_success(true) end
    end
  end
  return track, got, all
end

-- The error a future failed with (it must fail).
local function failure(f, timeout)
  local ok, err = pcall(H.sync, f, timeout)
  assert(not ok, "the request succeeded")
  return tostring(err)
end

local counters = netrun.shared.dict("http_client_spec")

-- A netrun HTTP server on group; each connection counts in the dict under
-- `name`; handler(req) returns the response table.
local function http_server(group, name, handler)
  counters:set(name, 0)
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0,
    init = function(ch)
      require("netrun").shared.dict("http_client_spec"):incr(name, 1, 0)
      ch:pipeline():add_last("http", require("netrun").codec.http_server {})
      ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
        local res = handler(req, ctx)
        if res then ctx:write_and_flush(res) end
      end })
    end,
  }:sync()
  local _, port = server:local_address()
  return server, port
end

-- A server that answers every connection with the bytes fn(s) sends.
local function raw_server(group, fn)
  local server = netrun.server { group = group, host = "127.0.0.1", port = 0, stream = fn }:sync()
  local _, port = server:local_address()
  return server, port
end

-- A front server on group whose handler calls on_request(c, ctx, req) for
-- each request, c a raw netrun.http client (pool 1) of its connection:
-- the front, and a client connected to it.
local function raw_front(group, on_request)
  local front = netrun.server {
    group = group, host = "127.0.0.1", port = 0,
    init = function(ch)
      local netrun = require "netrun"
      local c = netrun.http.client { raw = true, pool = 1 }
      ch:pipeline():add_last("http", netrun.codec.http_server {})
      ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
        on_request(c, ctx, req)
      end })
    end,
  }:sync()
  local _, port = front:local_address()
  return front, H.client(port)
end

-- Read a request head; returns its X-Info field, if any, and true when
-- the connection ended instead.
local function read_head(s)
  local info, l
  repeat
    l = s:receive("*l")
    info = info or (l and l:match("^[Xx]%-[Ii]nfo: *(.-)%s*$"))
  until l == nil or l == ""
  return info, l == nil
end

describe("netrun.http client", function()
  local group, servers
  setup(function()
    group = netrun.group { threads = 2, name = "httpc" }
    servers = netrun.group { threads = 1, name = "httpd" }
  end)
  teardown(function() H.shutdown(group); H.shutdown(servers) end)

  it("fetches from the main thread: status, lowercased headers, body", function()
    local server, port = http_server(servers, "main", function(req)
      return { status = 201, headers = { ["X-Echo"] = req.method .. " " .. req.path .. "?" ..
        tostring(req.query) .. " " .. tostring(req.headers["x-in"]) }, body = "got " .. req.body }
    end)
    local res = H.sync(netrun.http.request { method = "POST", url = "http://127.0.0.1:" .. port ..
      "/a/b?c=1", headers = { ["X-In"] = "v" }, body = "payload", timeout = 0 })   -- 0: no bound
    assert.equal(201, res.status)
    assert.equal("POST /a/b?c=1 v", res.headers["x-echo"])
    assert.equal("got payload", res.body)
    server:close():sync()
  end)

  it("reuses one keep-alive connection for sequential requests (counted by the server)", function()
    local server, port = http_server(servers, "reuse", function(req)
      return { status = 200, body = req.path }
    end)
    local c = netrun.http.client { pool = 8 }
    local bodies = on_loop(group:next(), function(c, port)
      local t = {}
      for i = 1, 50 do
        t[i] = c:request { url = "http://127.0.0.1:" .. port .. "/" .. i }:await().body
      end
      return table.concat(t, " ", 48, 50)
    end, c, port)
    assert.equal("/48 /49 /50", bodies)
    assert.equal(1, counters:get("reuse"))
    server:close():sync()
  end)

  it("decodes a chunked response and keeps the connection", function()
    local server, port = http_server(servers, "chunked", function(req, ctx)
      ctx:write { status = 200, stream = true }
      ctx:write "part one, "
      ctx:write(string.rep("x", 100000))
      ctx:write_and_flush(false)
    end)
    local c = netrun.http.client {}
    local n = on_loop(group:next(), function(c, port)
      local a = c:request { url = "http://127.0.0.1:" .. port .. "/" }:await()
      local b = c:request { url = "http://127.0.0.1:" .. port .. "/" }:await()
      assert(a.body == b.body and a.headers["transfer-encoding"] == "chunked")
      return #a.body
    end, c, port)
    assert.equal(10 + 100000, n)
    assert.equal(1, counters:get("chunked"))
    server:close():sync()
  end)

  it("reads a body that runs until the close, and skips 1xx", function()
    local server, port = raw_server(servers, function(s)
      read_head(s)
      s:send("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n")
      s:send("HTTP/1.0 200 OK\r\nX-A: 1\r\n\r\nuntil ")
      s:send("the close")
    end)
    local res = H.sync(netrun.http.request { url = "http://127.0.0.1:" .. port .. "/" })
    assert.equal(200, res.status)
    assert.equal("until the close", res.body)
    assert.is_false(res.keep_alive)
    server:close():sync()
  end)

  it("takes at most 5 informational responses before the final one: an endless 100 Continue fails at once", function()
    -- 5 then a 200: fine; 6: malformed. An upstream that sends 100
    -- Continue without end used to hold the loop at 100 % CPU until the
    -- request's timeout.
    local counted, cport = raw_server(servers, function(s)
      for _ = 1, 10 do                    -- (requests on one kept-alive connection)
        local info, gone = read_head(s)
        if gone then return end
        s:send(string.rep("HTTP/1.1 100 Continue\r\n\r\n", tonumber(info)) ..
          "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
      end
    end)
    local url = "http://127.0.0.1:" .. cport .. "/"
    local res = H.sync(netrun.http.request { url = url, headers = { ["x-info"] = "5" } })
    assert.equal("ok", res.body)
    assert.matches("malformed response: more than 5 informational %(1xx%) responses",
      failure(netrun.http.request { url = url, headers = { ["x-info"] = "6" } }))
    local flood, fport = raw_server(servers, function(s)
      read_head(s)
      local batch = string.rep("HTTP/1.1 100 Continue\r\n\r\n", 1000)
      for _ = 1, 10000 do                 -- until the client goes (bounded)
        if not s:send(batch) then return end
      end
    end)
    local t0 = socket.gettime()
    local err = failure(netrun.http.request { url = "http://127.0.0.1:" .. fport .. "/", timeout = 10 })
    assert.matches("more than 5 informational", err)
    assert.is_true(socket.gettime() - t0 < 3, "failed after " .. (socket.gettime() - t0) .. " s")
    counted:close():sync()
    flood:close():sync()
  end)

  it("keeps repeated Set-Cookie fields apart (an array), and joins other repeats with ', '", function()
    local expires = "a=1; Path=/; Expires=Wed, 21 Oct 2026 07:28:00 GMT; HttpOnly"
    local server, port = raw_server(servers, function(s)
      for _ = 1, 10 do
        local info, gone = read_head(s)
        if gone then return end
        local cookies = info == "1" and "Set-Cookie: solo=1\r\n" or
          "Set-Cookie: " .. expires .. "\r\nX-A: 1\r\nset-cookie: b=2\r\nX-A: 2\r\nSet-Cookie: c=3\r\n"
        s:send("HTTP/1.1 200 OK\r\n" .. cookies .. "Content-Length: 0\r\n\r\n")
      end
    end)
    local url = "http://127.0.0.1:" .. port .. "/"
    local res = H.sync(netrun.http.request { url = url, headers = { ["x-info"] = "3" } })
    assert.same({ expires, "b=2", "c=3" }, res.headers["set-cookie"])
    assert.equal("1, 2", res.headers["x-a"])
    res = H.sync(netrun.http.request { url = url, headers = { ["x-info"] = "1" } })
    assert.equal("solo=1", res.headers["set-cookie"])   -- once: a string, as before
    server:close():sync()
  end)

  it("gives HEAD, 204 and 304 no body whatever their Content-Length says", function()
    local server, port = raw_server(servers, function(s)
      for _, answer in ipairs {
        "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n",
        "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
        "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nlast",
      } do
        read_head(s)
        s:send(answer)
      end
      s:receive("*a")
    end)
    local c = netrun.http.client {}
    local got = on_loop(group:next(), function(c, port)
      local u = "http://127.0.0.1:" .. port .. "/"
      local t = {}
      for _, m in ipairs { "HEAD", "GET", "GET", "GET" } do
        local r = c:request { method = m, url = u }:await()
        t[#t + 1] = r.status .. ":" .. r.body
      end
      return table.concat(t, " ")
    end, c, port)
    assert.equal("200: 204: 304: 200:last", got)
    server:close():sync()
  end)

  it("fails a body over max_body and drops the connection (Content-Length and chunked)", function()
    local server, port = http_server(servers, "big", function(req, ctx)
      if req.path == "/chunked" then
        ctx:write { status = 200, stream = true }
        for _ = 1, 20 do ctx:write(string.rep("y", 1000)) end
        ctx:write_and_flush(false)
        return
      end
      return { status = 200, body = string.rep("x", 5000) }
    end)
    local c = netrun.http.client { max_body = 4096 }
    local errs = on_loop(group:next(), function(c, port)
      local _, e1 = pcall(function() return c:request { url = "http://127.0.0.1:" .. port .. "/" }:await() end)
      local _, e2 = pcall(function() return c:request { url = "http://127.0.0.1:" .. port .. "/chunked" }:await() end)
      local ok = c:request { url = "http://127.0.0.1:" .. port .. "/", max_body = 8192 }:await()
      local pools = require("netrun.http").stats()[c.id] or {}
      local pool = pools["http://127.0.0.1:" .. port]     -- gone once empty
      return { tostring(e1), tostring(e2), #ok.body, pool and pool.total or 0 }
    end, c, port)
    assert.matches("body over max_body %(4096 bytes%)", errs[1])
    assert.matches("body over max_body", errs[2])
    assert.equal(5000, errs[3])
    assert.equal(0, errs[4])               -- both failed connections were discarded
    server:close():sync()
  end)

  it("fails with 'timeout' on a server that never answers, and closes that connection", function()
    local closed = netrun.promise()
    local server, port = raw_server(servers, function(s)
      read_head(s)
      s:receive("*a")                     -- until the client gives up
      closed:try_success(true)
    end)
    local t0 = socket.gettime()
    local err = failure(netrun.http.request { url = "http://127.0.0.1:" .. port .. "/", timeout = 0.3 })
    assert.matches("GET http://127%.0%.0%.1:%d+/: timeout after 0%.3 s", err)
    assert.is_true(socket.gettime() - t0 < 3)
    assert.is_true(H.sync(closed))
    server:close():sync()
  end)

  it("fails cleanly on a refused connect, a bad URL, garbage and a reset mid-body", function()
    local port = H.free_port()
    assert.matches("connect: .*refused", failure(netrun.http.request { url = "http://127.0.0.1:" .. port .. "/" }))
    assert.matches("bad URL: unsupported scheme 'ftp'", failure(netrun.http.request { url = "ftp://a/" }))
    assert.matches("bad URL: no host", failure(netrun.http.request { url = "http:///x" }))
    local garbage, gport = raw_server(servers, function(s)
      read_head(s)
      s:send("SSH-2.0-OpenSSH_9.2\r\n\r\n")
      s:receive("*a")
    end)
    assert.matches("malformed response: not an HTTP response",
      failure(netrun.http.request { url = "http://127.0.0.1:" .. gport .. "/" }))
    local cut, cport = raw_server(servers, function(s)
      read_head(s)
      s:send("HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" .. string.rep("z", 5000))
      s:close()
    end)
    assert.matches("incomplete response: the connection closed in the middle of a response",
      failure(netrun.http.request { url = "http://127.0.0.1:" .. cport .. "/" }))
    garbage:close():sync()
    cut:close():sync()
  end)

  it("fails a request whose header cannot be sent, at once and with the reason", function()
    local server, port = http_server(servers, "badhdr", function() return { status = 200 } end)
    local t0 = socket.gettime()
    local err = failure(netrun.http.request { url = "http://127.0.0.1:" .. port .. "/",
      headers = { ["x-a"] = "one\r\nInjected: yes" }, timeout = 5 })
    assert.matches("the value of header 'x%-a' contains a control character", err)
    assert.is_true(socket.gettime() - t0 < 2)
    server:close():sync()
  end)

  it("sends an idempotent request again when a reused connection closes before answering", function()
    local conns = 0
    local server, port = raw_server(servers, function(s)
      conns = conns + 1
      read_head(s)
      s:send("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst")
      read_head(s)                        -- the second request on it: no answer
    end)
    local c = netrun.http.client {}
    local r = on_loop(group:next(), function(c, port)
      local u = "http://127.0.0.1:" .. port .. "/"
      local a = c:request { url = u }:await().body
      local b = c:request { url = u }:await().body                  -- retried on a new connection
      local ok, err = pcall(function() return c:request { url = u, method = "POST", body = "x" }:await() end)
      return { a, b, ok, tostring(err) }
    end, c, port)
    assert.same({ "first", "first", false }, { r[1], r[2], r[3] })
    assert.matches("POST .*closed before a response", r[4])      -- not idempotent: not sent again
    server:close():sync()
  end)

  -- A server answering /slow never, other paths with their path.
  local function slow_server(name)
    return http_server(servers, name, function(req)
      if req.path ~= "/slow" then return { status = 200, body = req.path } end
    end)
  end

  it("times out requests at the client's timeout (one pool timer), each at its own deadline", function()
    local server, port = slow_server("deadlines")
    local c = netrun.http.client { pool = 8, timeout = 0.4 }
    local r = on_loop(group:next(), function(c, port)
      local netrun = require "netrun"
      local base = "http://127.0.0.1:" .. port
      local track, got, all = tracker(5)
      c:request({ url = base .. "/slow" }, track("slow1"))
      c:request({ url = base .. "/fast1" }, track("fast1"))
      c:request({ url = base .. "/slow", timeout = 0.25 }, track("own"))   -- a timer of its own
      netrun.sleep(0.2)
      c:request({ url = base .. "/slow" }, track("slow2"))
      c:request({ url = base .. "/fast2" }, track("fast2"))
      all:await()
      local after = netrun.promise()          -- the pool still serves
      c:request({ url = base .. "/fast3" }, function(res, err) after:try_success(res and res.body or err) end)
      got.fast3 = after:await()
      return got
    end, c, port)
    assert.equal("/fast1", r.fast1.res)
    assert.equal("/fast2", r.fast2.res)
    assert.equal("/fast3", r.fast3)
    assert.matches("GET http://127%.0%.0%.1:%d+/slow: timeout after 0%.4 s", r.slow1.res)
    assert.matches("GET http://127%.0%.0%.1:%d+/slow: timeout after 0%.4 s", r.slow2.res)
    assert.matches("timeout after 0%.25 s", r.own.res)
    for _, k in ipairs { "slow1", "fast1", "own", "slow2", "fast2" } do assert.equal(1, r[k].calls) end
    assert.is_true(r.own.at >= 0.2 and r.own.at < 0.39, "own timeout at " .. r.own.at)
    assert.is_true(r.slow1.at >= 0.35 and r.slow1.at < 0.55, "slow1 at " .. r.slow1.at)
    assert.is_true(r.slow2.at >= 0.55 and r.slow2.at < 1.5, "slow2 at " .. r.slow2.at)
    server:close():sync()
  end)

  it("times out a request waiting for a connection, and one made as another timed out, each at its deadline", function()
    local server, port = slow_server("deadlines-wait")
    local c = netrun.http.client { pool = 1, timeout = 0.4 }
    local r = on_loop(group:next(), function(c, port)
      local netrun = require "netrun"
      local base = "http://127.0.0.1:" .. port
      local track, got, all = tracker(3)
      -- a, on the one connection, times out at 0.4; its callback makes c
      -- (0.8); b waits for the connection from 0.1 and times out at 0.5
      c:request({ url = base .. "/slow" }, track("a", function()
        c:request({ url = base .. "/slow" }, track("c"))
      end))
      netrun.sleep(0.1)
      c:request({ url = base .. "/slow" }, track("b"))
      all:await()
      local after = netrun.promise()          -- the pool still serves
      c:request({ url = base .. "/fast" }, function(res, err) after:try_success(res and res.body or err) end)
      got.fast = after:await()
      return got
    end, c, port)
    for _, k in ipairs { "a", "b", "c" } do
      assert.equal(1, r[k].calls)
      assert.matches("GET http://127%.0%.0%.1:%d+/slow: timeout after 0%.4 s", r[k].res)
    end
    assert.equal("/fast", r.fast)
    assert.is_true(r.a.at >= 0.35 and r.a.at < 0.5, "a at " .. r.a.at)
    assert.is_true(r.b.at >= 0.45 and r.b.at < 0.7, "b at " .. r.b.at)
    assert.is_true(r.c.at >= 0.75 and r.c.at < 1.5, "c at " .. r.c.at)
    server:close():sync()
  end)

  it("raw = true hands up a prepared response without hop-by-hop fields, which a server writes", function()
    local backend, bport = raw_server(servers, function(s)
      while true do
        local l = s:receive("*l")
        if l == nil then return end
        if l == "" then
          s:send("HTTP/1.1 201 Created\r\nConnection: keep-alive, x-drop\r\nKeep-Alive: timeout=5\r\n" ..
            "X-End: to-end\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nTransfer-Encoding: chunked\r\n" ..
            "Trailer: x-t\r\n\r\n3\r\nhel\r\n2\r\nlo\r\n0\r\nx-t: 1\r\n\r\n")
        end
      end
    end)
    local front, s = raw_front(servers, function(c, ctx, req)
      c:request({ url = "http://127.0.0.1:" .. bport .. "/" }, function(res, err)
        if not res then return ctx:write_and_flush { status = 500, body = err } end
        if req.path == "/shape" then
          return ctx:write_and_flush { status = 200, body = table.concat({ res.status,
            tostring(res.keep_alive), type(res.headers), type(res.body),
            tostring(res.response):match("^netrun%.http%.raw_response") or "?",
            tostring(res.response == res) }, " ") }
        end
        ctx:write_and_flush(res.response)
      end)
    end)
    s:send("GET /shape HTTP/1.1\r\nHost: x\r\n\r\n")
    local status, _, body = H.read_response(s)
    assert.equal(200, status)
    assert.equal("201 true nil nil netrun.http.raw_response true", body)
    for _ = 1, 2 do                        -- the backend connection is reused
      s:send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
      local st, h, b = H.read_response(s)
      assert.equal(201, st)
      assert.equal("hello", b)
      assert.equal("5", h["content-length"])
      assert.equal("to-end", h["x-end"])
      assert.is_nil(h["keep-alive"])
      assert.is_nil(h["transfer-encoding"])
      assert.is_nil(h["trailer"])
      assert.is_nil(h["connection"])
    end
    s:send("HEAD / HTTP/1.0\r\n\r\n")     -- the server codec frames it for its client
    local raw = s:receive("*a")
    assert.matches("^HTTP/1%.1 201 Created\r\n", raw)
    assert.matches("\r\nSet%-Cookie: a=1\r\nSet%-Cookie: b=2\r\n", raw)
    assert.matches("\r\nConnection: close\r\n", raw)
    assert.matches("\r\n\r\n$", raw)       -- no body for HEAD
    s:close()
    assert.has_error(function() netrun.http.client { raw = "yes" } end,
      'netrun.http.client: raw must be a boolean, got "yes"')
    front:close():sync()
    backend:close():sync()
  end)

  it("forward = req sends a server request on as it came, less hop-by-hop fields, with what the handler changed", function()
    -- the backend answers each request with its head (lines joined by
    -- "\n") and body, as it read them
    local backend, bport = raw_server(servers, function(s)
      while true do
        local head, len = {}, 0
        repeat
          local l = s:receive("*l")
          if l == nil then return end
          head[#head + 1] = l
          local n = l:lower():match("^content%-length: *(%d+)")
          if n then len = tonumber(n) end
        until l == ""
        local echo = table.concat(head, "\n") .. (len > 0 and s:receive(len) or "")
        local close = head[1]:find("^GET /close ")
        s:send("HTTP/1.1 200 OK\r\nContent-Length: " .. #echo .. "\r\n" ..
          (close and "Connection: close\r\n" or "") .. "\r\n" .. echo)
        if close then return s:close() end
      end
    end)
    local base = "http://127.0.0.1:" .. bport
    local front, s = raw_front(servers, function(c, ctx, req)
      local opts = { url = base, forward = req, headers = { ["x-forwarded-for"] = "1.2.3.4" } }
      if req.path == "/assigned" then
        req.method, req.path, req.query, req.body = "PUT", "/elsewhere", "z=9", "new body"
        req.headers["x-added"] = "yes"
        req.headers["x-drop-me"] = nil
      elseif req.path == "/badpath" then
        req.path = {}
      elseif req.path == "/withpath" then
        opts.url = base .. "/x"
      elseif req.path == "/both" or req.path == "/bothbody" then
        if req.path == "/both" then opts.method = "GET" else opts.body = "b" end
        local ok, err = pcall(c.request, c, opts, print)
        return ctx:write_and_flush { status = 400, body = tostring(ok) .. " " .. err }
      end
      c:request(opts, function(res, err)
        if not res then return ctx:write_and_flush { status = 502, body = err } end
        if req.path == "/close" then    -- a response after which the backend closes
          return ctx:write_and_flush { status = 200, body = table.concat({ type(res),
            tostring(res.keep_alive), tostring(res.status),
            tostring(res.response):match("^netrun%.http%.raw_response") or "?" }, " ") }
        end
        ctx:write_and_flush(res.response)
      end)
    end)
    local function ask(bytes)
      s:send(bytes)
      local status, _, body = H.read_response(s)
      return status, body
    end
    -- a chunked upload: decoded, sent with a length; hop-by-hop fields and
    -- Expect stay behind; the given x-forwarded-for replaces the client's
    local status, echo = ask("POST /p/q?x=1 HTTP/1.1\r\nHost: front.example\r\n" ..
      "Connection: keep-alive\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\n" ..
      "X-Forwarded-For: 9.9.9.9\r\nX-Case: Kept\r\nProxy-Authorization: secret\r\n" ..
      "Expect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nbody\r\n0\r\n\r\n")
    assert.equal(200, status)
    assert.equal("POST /p/q?x=1 HTTP/1.1\nx-forwarded-for: 1.2.3.4\nHost: front.example\n" ..
      "X-Case: Kept\nContent-Length: 4\nbody", echo)
    -- fields the handler assigned win; the headers table it changed is
    -- what is sent, still without the hop-by-hop fields
    status, echo = ask("GET /assigned?old=1 HTTP/1.1\r\nHost: h\r\nConnection: keep-alive\r\n" ..
      "X-Drop-Me: 1\r\n\r\n")
    assert.equal(200, status)
    assert.matches("^PUT /elsewhere%?z=9 HTTP/1%.1\n", echo)
    assert.matches("\nx%-added: yes\n", echo)
    assert.matches("\nhost: h\n", echo)
    assert.matches("\nContent%-Length: 8\nnew body$", echo)
    assert.is_nil(echo:lower():find("x-drop-me", 1, true))
    assert.is_nil(echo:lower():find("connection", 1, true))
    -- what cannot be sent fails the request, with the reason
    status, echo = ask("GET /badpath HTTP/1.1\r\nHost: h\r\n\r\n")
    assert.equal(502, status)
    assert.matches("the forwarded request's path cannot be sent", echo)
    status, echo = ask("GET /withpath HTTP/1.1\r\nHost: h\r\n\r\n")
    assert.equal(502, status)
    assert.matches("bad URL: a forwarded request's URL names only the origin", echo)
    status, echo = ask("GET /both HTTP/1.1\r\nHost: h\r\n\r\n")
    assert.equal(400, status)
    assert.matches("^false .*forward takes the request's method and body: give neither", echo)
    status, echo = ask("GET /bothbody HTTP/1.1\r\nHost: h\r\n\r\n")
    assert.equal(400, status)
    assert.matches("^false .*forward takes the request's method and body: give neither", echo)
    -- a response after which the backend closes comes as a table
    status, echo = ask("GET /close HTTP/1.1\r\nHost: h\r\n\r\n")
    assert.equal(200, status)
    assert.equal("table false 200 netrun.http.raw_response", echo)
    -- an HTTP/1.0 request without Host gets the URL's
    status, echo = ask("GET /old HTTP/1.0\r\n\r\n")
    assert.equal(200, status)
    assert.equal("GET /old HTTP/1.1\nx-forwarded-for: 1.2.3.4\nhost: 127.0.0.1:" .. bport .. "\n", echo)
    s:close()
    assert.has_error(function() netrun.http.request { url = base, forward = "GET /" } end,
      'netrun.http.request: forward must be a request of netrun.codec.http_server, got "GET /"')
    front:close():sync()
    backend:close():sync()
  end)

  it("a request takes nothing from the one before it on its connection; a bad field keeps the connection", function()
    local backend, bport = http_server(servers, "reuse", function(req)
      return { status = 200, body = req.method .. " " .. req.path .. " " .. #(req.body or "") ..
        " " .. tostring(req.headers["x-a"]) }
    end)
    local base = "http://127.0.0.1:" .. bport
    local function each(base) return function(ch)     -- the front's init
      local netrun = require "netrun"
      local c = netrun.http.client { pool = 1 }
      ch:pipeline():add_last("http", netrun.codec.http_server {})
      ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
        -- forwarded, then plain ones (a body, a bad field, none) on the
        -- pool's one connection: each is sent as given
        local out = {}
        local asks = {
          { url = base .. "/last" },
          { url = base, forward = req, headers = { ["x-a"] = "fwd" } },
          { url = base .. "/last" },
          { url = base .. "/plain", method = "POST", body = "abc" },
          { url = base .. "/bad", headers = { ["bad name"] = "x" } },
          { url = base .. "/last" },
        }
        local function ask(i)
          if i > #asks then
            local st = require("netrun.http").stats()[c.id][base]
            out[#out + 1] = st.total .. " " .. st.idle
            return ctx:write_and_flush { status = 200, body = table.concat(out, "\n") }
          end
          c:request(asks[i], function(r, e)     -- (the next after this one ends)
            out[#out + 1] = r and r.body or tostring(r) .. " " .. e
            netrun.current():execute(function() ask(i + 1) end)
          end)
        end
        ask(1)
      end })
    end end
    local front = netrun.server { group = servers, host = "127.0.0.1", port = 0, init = each(base) }:sync()
    local s = H.client(select(2, front:local_address()))
    s:send("PUT /fwd HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nxy")
    local status, _, b = H.read_response(s)
    assert.equal(200, status)
    local bodies = {}
    for l in b:gmatch("[^\n]+") do bodies[#bodies + 1] = l end
    assert.same({ "GET /last 0 nil", "PUT /fwd 2 fwd", "GET /last 0 nil", "POST /plain 3 nil",
      "nil netrun.http: GET " .. base .. "/bad: http_client request: header name 'bad name' is not a token",
      "GET /last 0 nil", "1 1" }, bodies)          -- one connection, idle again
    assert.equal(1, counters:get("reuse"))      -- the bad field did not cost it
    s:close()
    front:close():sync()
    backend:close():sync()
  end)

  it("a small pool against a backend that misbehaves in every way: each request ends once, the pool ends clean", function()
    -- per path: /ok answers, /close answers and closes, /drop closes
    -- without answering, /slow answers past the timeout, /trunc cuts its
    -- body short, /junk is not HTTP
    local backend, bport = raw_server(servers, function(s)
      local netrun = require "netrun"
      while true do
        local line = s:receive("*l")
        if line == nil then return end
        repeat local l = s:receive("*l") until l == nil or l == ""
        local path = line:match("^%u+ (%S+)")
        if path == "/drop" then return s:close() end
        if path == "/slow" then netrun.sleep(1) end
        if path == "/trunc" then
          s:send("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort")
          return s:close()
        end
        if path == "/junk" then s:send("junk\r\n\r\n"); return s:close() end
        local close = path == "/close"
        s:send("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" ..
          (close and "Connection: close\r\n" or "") .. "\r\nok")
        if close then return s:close() end
      end
    end)
    local c = netrun.http.client { pool = 3, timeout = 0.5 }
    local r = on_loop(group:next(), function(c, port)
      local netrun = require "netrun"
      local base = "http://127.0.0.1:" .. port
      local paths = { "/ok", "/close", "/drop", "/slow", "/trunc", "/junk", "/ok", "/ok" }
      -- in rounds of 16 (two of them /slow), so that no other waits for a
      -- connection past the timeout
      local n, calls, kinds, done = 80, {}, {}, nil
      local left
      local function finish(i, res, err)
        calls[i] = (calls[i] or 0) + 1
        local k = paths[i % #paths + 1] .. " " ..
          (res and res.body or (err:match("timeout after") and "timeout") or "error")
        kinds[k] = (kinds[k] or 0) + 1
        left = left - 1
        if left == 0 then done:try_success(true) end
      end
      for round = 0, n // 16 - 1 do
        done, left = netrun.promise(), 16
        for i = round * 16 + 1, round * 16 + 16 do
          local opts = { url = base .. paths[i % #paths + 1] }
          if i % 2 == 0 then
            c:request(opts, function(res, err) finish(i, res, err) end)
          else
            c:request(opts):add_listener(function(f)
              if f:is_success() then finish(i, f:result()) else finish(i, nil, tostring(f:cause())) end
            end)
          end
        end
        done:await()
      end
      local once = 0
      for i = 1, n do if calls[i] == 1 then once = once + 1 end end
      local after = netrun.promise()       -- the pool still serves
      c:request({ url = base .. "/ok" }, function(res, err) after:try_success(res and res.body or err) end)
      local last = after:await()
      local st = require("netrun.http").stats()[c.id]["http://127.0.0.1:" .. port]
      return { once, kinds, last, st.total, st.idle, st.waiting }
    end, c, bport)
    assert.equal(80, r[1])                   -- every request ended, once
    assert.same({ ["/ok ok"] = 30, ["/close ok"] = 10, ["/drop error"] = 10, ["/slow timeout"] = 10,
                  ["/trunc error"] = 10, ["/junk error"] = 10 }, r[2])
    assert.equal("ok", r[3])
    assert.equal(r[4], r[5])                 -- every connection left is idle
    assert.equal(0, r[6])
    backend:close():sync()
  end)

  it("a pool of one whose connects fail fails every waiting request (none hangs)", function()
    local c = netrun.http.client { pool = 1, timeout = 10 }
    local port = H.free_port()
    local t0 = socket.gettime()
    local r = on_loop(group:next(), function(c, port)
      local netrun = require "netrun"
      local fs = {}
      for i = 1, 5 do fs[i] = c:request { url = "http://127.0.0.1:" .. port .. "/" .. i } end
      local n = 0
      for i = 1, 5 do
        if not pcall(fs[i].await, fs[i]) then n = n + 1 end
      end
      return n
    end, c, port)
    assert.equal(5, r)
    assert.is_true(socket.gettime() - t0 < 5)
  end)

  it("takes a callback instead of a future on a loop, and refuses one on the main thread", function()
    local server, port = http_server(servers, "callback", function(req) return { status = 200, body = req.path } end)
    local c = netrun.http.client {}
    local r = H.sync(group:next():submit(function(c, port, dead)
      local netrun = require "netrun"
      local p = netrun.promise()
      local got = {}
      c:request({ url = "http://127.0.0.1:" .. port .. "/cb" }, function(res, err)
        got[1] = res and res.body
        c:request({ url = "http://127.0.0.1:" .. dead .. "/" }, function(res2, err2)
          got[2] = tostring(res2) .. " " .. tostring(err2)
          c:request({ url = "nope" }, function(_, err3)
            got[3] = err3
            p:set_success(got)
          end)
        end)
      end)
      return p
    end, c, port, H.free_port()))
    r = H.sync(r)
    assert.equal("/cb", r[1])
    assert.matches("^nil netrun.http: GET .*connect: .*refused", r[2])
    assert.matches("bad URL: not an absolute", r[3])
    assert.has_error(function() c:request({ url = "http://127.0.0.1:1/" }, print) end,
      "netrun.http client: a callback runs on the caller's loop: call request with one on a " ..
      "loop (the main thread is not one: use the future)")
    server:close():sync()
  end)

  it("client:forwarder: a proxy's requests with their options checked once, its pool found again when emptied", function()
    local backend, bport = http_server(servers, "fwdr", function(req)
      return { status = 200, body = req.method .. " " .. req.path .. " " .. (req.body or "") .. " " ..
        tostring(req.headers["x-via"]) }
    end)
    local base = "http://127.0.0.1:" .. bport
    local function each(base) return function(ch)
      local netrun = require "netrun"
      local c = netrun.http.client { keepalive = 0.05 }
      local forward, errs = nil, {}
      ch:pipeline():add_last("http", netrun.codec.http_server {})
      ch:pipeline():add_last("app", { channel_read = function(_, ctx, req)
        if not forward then
          forward = c:forwarder { url = base, headers = { ["x-via"] = "front" } }
          for _, bad in ipairs {
            function() c:forwarder { url = base .. "/path" } end,
            function() c:forwarder { url = base, timeout = 1 } end,
            function() c:forwarder { url = "nope" } end,
            function() forward("GET /", print) end,
            function() forward(req, 5) end,
          } do
            local _, e = pcall(bad)
            errs[#errs + 1] = (tostring(e):gsub("^.-:%d+: ", ""))
          end
        end
        if req.path == "/errors" then
          return ctx:write_and_flush { status = 200, body = table.concat(errs, "\n") }
        end
        forward(req, function(res, err)
          local st = require("netrun.http").stats()[c.id]
          ctx:write_and_flush { status = 200, body = (res and res.body or err) .. " pools=" ..
            tostring(st and st[base] and st[base].total) }
        end)
      end })
    end end
    local front = netrun.server { group = servers, host = "127.0.0.1", port = 0, init = each(base) }:sync()
    local s = H.client(select(2, front:local_address()))
    local function ask(bytes)
      s:send(bytes)
      local status, _, b = H.read_response(s)
      assert.equal(200, status)
      return b
    end
    assert.equal("GET /a  front pools=1", ask("GET /a HTTP/1.1\r\nHost: h\r\n\r\n"))
    assert.equal("POST /b xyz front pools=1", ask("POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nxyz"))
    socket.sleep(0.3)                        -- the idle connection closes, the pool empties
    assert.equal("GET /c  front pools=1", ask("GET /c HTTP/1.1\r\nHost: h\r\n\r\n"))
    assert.equal(2, counters:get("fwdr"))    -- a new connection, of a new pool
    assert.equal(table.concat({
      "netrun.http client:forwarder: the URL names only the origin (no path)",
      "netrun.http client:forwarder: unknown option 'timeout'",
      "netrun.http client:forwarder: bad URL: not an absolute http(s) URL",
      "netrun.http forwarder: forward(req, callback): req must be a request of netrun.codec.http_server, got string",
      "netrun.http forwarder: the callback must be a function, got number" }, "\n"),
      ask("GET /errors HTTP/1.1\r\nHost: h\r\n\r\n"))
    s:close()
    front:close():sync()
    backend:close():sync()
  end)

  it("fails a request at once past max_waiting requests waiting for a connection", function()
    local server, port = http_server(servers, "waiting", function(req, ctx)
      local netrun = require "netrun"
      netrun.current():schedule(0.2, function() ctx:write_and_flush { status = 200, body = req.path } end)
    end)
    local c = netrun.http.client { pool = 1, max_waiting = 2, timeout = 5 }
    local r = on_loop(group:next(), function(c, port)
      local netrun = require "netrun"
      local base = "http://127.0.0.1:" .. port
      local track, got, all = tracker(5)
      for i = 1, 5 do c:request({ url = base .. "/" .. i }, track(i)) end   -- 1 sent, 2 wait
      all:await()
      local after = netrun.promise()          -- the line has room again
      c:request({ url = base .. "/6" }, function(res, err) after:try_success(res and res.body or err) end)
      got.after = after:await()
      return got
    end, c, port)
    assert.equal("/1", r[1].res)
    assert.equal("/2", r[2].res)
    assert.equal("/3", r[3].res)
    for i = 4, 5 do
      assert.matches("GET http://127%.0%.0%.1:%d+/" .. i .. ": no connection free and 2 requests waiting %(max_waiting%)", r[i].res)
      assert.is_true(r[i].at < 0.15, "failed at " .. r[i].at)   -- at once, not after a wait
    end
    assert.equal("/6", r.after)
    -- max_waiting = 0: no line at all, but a connection may still be opened
    local c0 = netrun.http.client { pool = 1, max_waiting = 0 }
    local r0 = on_loop(group:next(), function(c, port)
      local base = "http://127.0.0.1:" .. port
      local track, got, all = tracker(2)
      for i = 1, 2 do c:request({ url = base .. "/" .. i }, track(i)) end
      all:await()
      return { got[1].res, got[2].res }
    end, c0, port)
    assert.equal("/1", r0[1])
    assert.matches("no connection free and 0 requests waiting", r0[2])
    -- requests waiting behind a busy connection that cannot be sent fail
    -- one after another as it frees, and the next good one takes it
    local c1 = netrun.http.client { pool = 1 }
    local r1 = on_loop(group:next(), function(c, port)
      local base = "http://127.0.0.1:" .. port
      local track, got, all = tracker(5)
      c:request({ url = base .. "/first" }, track(1))
      for i = 2, 4 do c:request({ url = base .. "/bad", headers = { ["bad name"] = "x" } }, track(i)) end
      c:request({ url = base .. "/good" }, track(5))
      all:await()
      local st = require("netrun.http").stats()[c.id][base]
      return { got[1].res, got[2].res, got[3].res, got[4].res, got[5].res, st.total }
    end, c1, port)
    assert.equal("/first", r1[1])
    for i = 2, 4 do assert.matches("http_client request: header name 'bad name' is not a token", r1[i]) end
    assert.equal("/good", r1[5])
    assert.equal(1, r1[6])
    assert.has_error(function() netrun.http.client { max_waiting = -1 } end,
      "netrun.http.client: max_waiting must be an integer >= 0, got -1")
    server:close():sync()
  end)

  it("takes forward = false as no forward (a kept options table clears it so)", function()
    local server, port = http_server(servers, "nofwd", function(req) return { status = 200, body = req.path } end)
    local res = H.sync(netrun.http.request { url = "http://127.0.0.1:" .. port .. "/p", forward = false })
    assert.equal("/p", res.body)
    local ok, err = pcall(netrun.http.request, { url = "http://127.0.0.1:" .. port .. "/p", forward = true })
    assert.is_false(ok)
    assert.matches("forward must be a request of netrun.codec.http_server, got true", err)
    server:close():sync()
  end)

  it("blames the caller's line for a bad request (client:request, netrun.http.request)", function()
    local c = netrun.http.client {}
    local calls = {
      function() c:request { url = "http://127.0.0.1:1/", bogus = 1 } end,
      function() netrun.http.request { url = "http://127.0.0.1:1/", timeout = -1 } end,
      function() c.request { url = "http://127.0.0.1:1/" } end,
      function() c:request({ url = "http://127.0.0.1:1/" }, 5) end,
    }
    local want = { "netrun.http.request: unknown option 'bogus'",
                   "netrun.http.request: timeout must be a number of seconds from 0 to 1e9, got %-1",
                   "netrun.http client: call it as client:request",
                   "netrun.http client: the callback must be a function, got number" }
    for i, f in ipairs(calls) do
      local ok, err = pcall(f)
      assert.is_false(ok)
      assert.matches("^[^:]*http_client_spec%.lua:%d+: " .. want[i], err)
    end
  end)

  it("examples/fetch.lua counts its requests and errors, with futures and with callbacks", function()
    local server, port = http_server(servers, "fetch", function() return { status = 200, body = "ok" } end)
    for _, api in ipairs { "future", "callback" } do
      local out, status = H.run(string.format("%s %s/examples/fetch.lua --url http://127.0.0.1:%d/ " ..
        "--requests 300 --concurrency 8 --api %s", H.BIN, H.root, port, api))
      assert.equal(0, status, out)
      assert.matches("requests=300 seconds=[%d.]+ errors=0 cpu=[%d.]+\n$", out)
    end
    assert.equal(2 * 8, counters:get("fetch"))     -- a pool of 8 per run
    local out = H.run(string.format("%s %s/examples/fetch.lua --url http://127.0.0.1:%d/ --requests 4",
      H.BIN, H.root, H.free_port()))
    assert.matches("requests=0 seconds=[%d.]+ errors=4", out)
    server:close():sync()
  end)

  it("does not follow redirects unless asked", function()
    local server, port = http_server(servers, "redirect", function(req)
      if req.path == "/old" then
        return { status = 302, headers = { location = "/new?x=1" }, body = "moved" }
      end
      return { status = 200, body = "here " .. req.method .. " " .. tostring(req.query) }
    end)
    local u = "http://127.0.0.1:" .. port .. "/old"
    assert.equal(302, H.sync(netrun.http.request { url = u }).status)
    local res = H.sync(netrun.http.request { url = u, follow = 2, method = "POST", body = "b" })
    assert.equal("here GET x=1", res.body)
    server:close():sync()
  end)

  it("leaves credentials and a given Host behind on a redirect to another origin, keeps them on the same", function()
    local seen = function(req)
      return string.format("%s %s auth=%s cookie=%s proxy=%s host=%s type=%s body=%s", req.method, req.path,
        tostring(req.headers.authorization), tostring(req.headers.cookie),
        tostring(req.headers["proxy-authorization"]), tostring(req.headers.host),
        tostring(req.headers["content-type"]), req.body)
    end
    local other, oport = http_server(servers, "redir-other", function(req)
      return { status = 200, body = seen(req) }
    end)
    local server, port = http_server(servers, "redir", function(req)
      local to = req.target:match("^/to/([^?]*)")
      if to then return { status = tonumber(req.query) or 302, headers = { location = to } } end
      return { status = 200, body = seen(req) }
    end)
    local secrets = { Authorization = "Bearer s3cret", cookie = "sid=42", ["Proxy-Authorization"] = "Basic eA==",
                      Host = "public.example", ["X-Kept"] = "1" }
    local function go(to, status, method)
      return H.sync(netrun.http.request { url = "http://127.0.0.1:" .. port .. "/to/" .. to .. "?" .. (status or 302),
        follow = 2, headers = secrets, method = method, body = method and "data" or nil }).body
    end
    -- another port: another origin
    assert.equal("GET /x auth=nil cookie=nil proxy=nil host=127.0.0.1:" .. oport .. " type=nil body=",
      go("http://127.0.0.1:" .. oport .. "/x"))
    -- another host for the same address: another origin too
    assert.equal("GET /y auth=nil cookie=nil proxy=nil host=localhost:" .. oport .. " type=nil body=",
      go("http://localhost:" .. oport .. "/y"))
    -- the same origin (relative, and absolute): everything kept
    assert.equal("GET /same auth=Bearer s3cret cookie=sid=42 proxy=Basic eA== host=public.example type=nil body=",
      go("/same"))
    assert.equal("GET /abs auth=Bearer s3cret cookie=sid=42 proxy=Basic eA== host=public.example type=nil body=",
      go("http://127.0.0.1:" .. port .. "/abs"))
    -- 307 keeps the method and body (and the fields of the body); 303 drops them
    secrets["Content-Type"] = "text/plain"
    assert.equal("POST /p auth=nil cookie=nil proxy=nil host=127.0.0.1:" .. oport .. " type=text/plain body=data",
      go("http://127.0.0.1:" .. oport .. "/p", 307, "POST"))
    assert.equal("GET /g auth=Bearer s3cret cookie=sid=42 proxy=Basic eA== host=public.example type=nil body=",
      go("/g", 303, "POST"))
    assert.equal("Bearer s3cret", secrets.Authorization)    -- the caller's table untouched
    server:close():sync()
    other:close():sync()
  end)

  it("runs 200 concurrent requests through a pool of 64, and a loop timer keeps firing", function()
    local server, port = http_server(servers, "many", function(req, ctx)
      -- answer after a short delay, so requests really wait together
      ctx:loop():schedule(0.05, function()
        if ctx.channel:is_open() then ctx:write_and_flush { status = 200, body = req.path } end
      end)
    end)
    local c = netrun.http.client { pool = 64 }
    local r = on_loop(group:next(), function(c, port)
      local netrun = require "netrun"
      local ticks = 0
      local timer = netrun.current():schedule_at_fixed_rate(0.01, 0.01, function() ticks = ticks + 1 end)
      local fs = {}
      for i = 1, 200 do fs[i] = c:request { url = "http://127.0.0.1:" .. port .. "/" .. i, timeout = 20 } end
      local all = netrun.all(fs):await()
      timer:cancel()
      local okc = 0
      for i = 1, 200 do if all[i].body == "/" .. i then okc = okc + 1 end end
      return { okc, ticks }
    end, c, port)
    assert.equal(200, r[1])
    assert.is_true(r[2] >= 5, "the timer fired " .. r[2] .. " times")
    assert.is_true(counters:get("many") <= 64, counters:get("many") .. " connections")
    server:close():sync()
  end)

  it("closes idle pooled connections after keepalive seconds", function()
    local server, port = http_server(servers, "idle", function() return { status = 200 } end)
    local c = netrun.http.client { keepalive = 0.2 }
    local loop = group:next()
    on_loop(loop, function(c, port) return c:request { url = "http://127.0.0.1:" .. port .. "/" }:await() end, c, port)
    local pool = function()
      return loop:submit(function(id, key)
        local p = (require("netrun.http").stats()[id] or {})[key]
        return p and p.idle + p.total * 100 or 0           -- gone once empty
      end, c.id, "http://127.0.0.1:" .. port):sync()
    end
    assert.equal(101, pool())
    assert.equal(0, H.eventually(function() return pool() == 0 and 0 end, 3))
    server:close():sync()
  end)

  it("https against the TLS example, verified against its certificate", function()
    local dir = H.tmpdir()
    assert(os.execute(string.format("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
      .. "-nodes -keyout %s/k.pem -out %s/c.pem -days 2 -subj /CN=localhost "
      .. "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 2>/dev/null", dir, dir)))
    local port = H.free_port()
    local pid = H.start(H.root .. "/examples/https_hello.lua", port,
      string.format("--cert %s/c.pem --key %s/k.pem", dir, dir))
    local tls = netrun.tls.client { ca = dir .. "/c.pem" }
    local c = netrun.http.client { tls = tls }
    local res = H.sync(c:request { url = "https://localhost:" .. port .. "/" })
    assert.equal(200, res.status)
    assert.equal("Hello, World!", res.body)
    local err = failure(netrun.http.request { url = "https://localhost:" .. port .. "/" })
    assert.matches("certificate", err)       -- the system store does not know it
    assert.is_true(H.stop(pid))
  end)

  -- localhost is ::1 then 127.0.0.1, the server listens on 127.0.0.1
  -- only: the request goes over the address that answered (before, TLS
  -- started on ::1's refused channel: "channel closed before the TLS
  -- handshake completed", and an ERROR "the pool of this connection is
  -- gone"); with nobody listening, the error is the connect's.
  it("https to localhost uses the address that answers; none: the connect error", function()
    local dir = H.tmpdir()
    assert(H.run("bash " .. H.root .. "/spec/fixtures/tls/make_certs.sh " .. dir))
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      tls = netrun.tls.server { cert = dir .. "/server.crt", key = dir .. "/server.key" },
      init = function(ch)
        ch:pipeline():add_last("http", netrun.codec.http_server {})
        ch:pipeline():add_last("hello", { channel_read = function(_, ctx, req)
          ctx:write_and_flush { status = 200, body = "over " .. ctx.channel:local_address() }
        end })
      end,
    }:sync()
    local _, port = server:local_address()
    local c = netrun.http.client { tls = netrun.tls.client { ca = dir .. "/ca.crt" } }
    local res = H.sync(c:request { url = "https://localhost:" .. port .. "/" })
    assert.equal(200, res.status)
    assert.equal("over 127.0.0.1", res.body)
    local free = H.free_port()
    local err = failure(c:request { url = "https://localhost:" .. free .. "/" })
    assert.matches("connect: localhost:" .. free .. ": ::1:" .. free .. ": ECONNREFUSED: " ..
      "connection refused; 127.0.0.1:" .. free .. ": ECONNREFUSED: connection refused", err, 1, true)
    assert.is_nil(err:find("TLS", 1, true), err)
    server:close():sync()
  end)
end)

-- Real servers of other makes.
describe("netrun.http client against nginx and Node", function()
  local group
  setup(function() group = netrun.group { threads = 1, name = "httpc2" } end)
  teardown(function() H.shutdown(group) end)

  local function have(cmd)
    return os.execute("command -v " .. cmd .. " >/dev/null 2>&1")
  end

  it("nginx: keep-alive reuse (nginx's $connection) and a 200 KiB file", function()
    local nginx = have("nginx") and "nginx" or (io.open("/usr/sbin/nginx") and "/usr/sbin/nginx")
    assert(nginx, "nginx is missing: bash scripts/deps.sh nginx")
    local dir, port = H.tmpdir(), H.free_port()
    local f = assert(io.open(dir .. "/big", "w")); f:write(string.rep("n", 200000)); f:close()
    f = assert(io.open(dir .. "/nginx.conf", "w"))
    f:write((([[
daemon off; worker_processes 1; error_log stderr error; pid DIR/nginx.pid;
events { worker_connections 256; }
http { access_log off; client_body_temp_path DIR; proxy_temp_path DIR; fastcgi_temp_path DIR;
  uwsgi_temp_path DIR; scgi_temp_path DIR;
  server { listen 127.0.0.1:PORT; root DIR;
    location = /conn { add_header X-Conn $connection; return 200 "c"; } } }
]]):gsub("DIR", dir):gsub("PORT", port)))
    f:close()
    local p = assert(io.popen(nginx .. " -p " .. dir .. " -c " .. dir .. "/nginx.conf > " .. dir .. "/log 2>&1 & echo $!"))
    local pid = tonumber(p:read("l")); p:close()
    local up = H.eventually(function()
      local s = socket.tcp(); s:settimeout(0.2)
      local ok = s:connect("127.0.0.1", port); s:close(); return ok
    end, 5)
    assert(up, "nginx did not start: " .. H.read_file(dir .. "/log"))
    local c = netrun.http.client {}
    local r = on_loop(group:next(), function(c, port)
      local conns = {}
      for i = 1, 10 do
        conns[c:request { url = "http://127.0.0.1:" .. port .. "/conn" }:await().headers["x-conn"]] = true
      end
      local n = 0
      for _ in pairs(conns) do n = n + 1 end
      local big = c:request { url = "http://127.0.0.1:" .. port .. "/big" }:await()
      return { n, #big.body, big.headers["content-length"] }
    end, c, port)
    os.execute("kill " .. pid)
    assert.equal(1, r[1])
    assert.equal(200000, r[2])
    assert.equal("200000", r[3])
  end)

  it("Node http: a chunked response, and keep-alive reuse counted by Node", function()
    assert(have("node"), "node is missing: bash scripts/deps.sh")
    local port = H.free_port()
    local js = os.tmpname()
    local f = assert(io.open(js, "w"))
    f:write((([[
const http = require('http'); let conns = 0;
const s = http.createServer((req, res) => {
  if (req.url === '/count') { res.end(String(conns)); return; }
  res.setHeader('X-Node', 'yes'); res.write('chunk one,'); setTimeout(() => res.end(' two'), 5);
});
s.on('connection', () => conns++);
s.listen(PORT, '127.0.0.1', () => console.log('listening'));
]]):gsub("PORT", port)))
    f:close()
    local p = assert(io.popen("node " .. js .. " > " .. js .. ".log 2>&1 & echo $!"))
    local pid = tonumber(p:read("l")); p:close()
    assert(H.eventually(function() return H.read_file(js .. ".log"):find("listening") end, 10),
      "node did not start: " .. H.read_file(js .. ".log"))
    local c = netrun.http.client {}
    local r = on_loop(group:next(), function(c, port)
      local bodies = {}
      for i = 1, 5 do
        local res = c:request { url = "http://127.0.0.1:" .. port .. "/x" }:await()
        bodies[i] = res.body .. "|" .. tostring(res.headers["transfer-encoding"]) .. "|" .. res.headers["x-node"]
      end
      return { bodies[5], c:request { url = "http://127.0.0.1:" .. port .. "/count" }:await().body }
    end, c, port)
    os.execute("kill " .. pid)
    assert.equal("chunk one, two|chunked|yes", r[1])
    assert.equal("1", r[2])
  end)

  it("a peer that resets in the middle of a body (Node, resetAndDestroy): a failed future", function()
    local port = H.free_port()
    local js = os.tmpname()
    local f = assert(io.open(js, "w"))
    f:write((([[
const net = require('net');
net.createServer(s => s.once('data', () => {
  s.write('HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n' + 'r'.repeat(3000));
  setTimeout(() => s.resetAndDestroy(), 50);
})).listen(PORT, '127.0.0.1', () => console.log('listening'));
]]):gsub("PORT", port)))
    f:close()
    local p = assert(io.popen("node " .. js .. " > " .. js .. ".log 2>&1 & echo $!"))
    local pid = tonumber(p:read("l")); p:close()
    assert(H.eventually(function() return H.read_file(js .. ".log"):find("listening") end, 10))
    local err = failure(netrun.http.request { url = "http://127.0.0.1:" .. port .. "/" })
    os.execute("kill " .. pid)
    assert.matches("GET http://127%.0%.0%.1:%d+/: .*reset", err)
  end)
end)

describe("netrun.codec.http_client on an embedded channel", function()
  local codec = netrun.codec

  it("encodes a request: request line, headers, Content-Length, body", function()
    local ch = netrun.embedded(codec.http_client {})
    ch:write_outbound { method = "POST", path = "/x?y=1", body = "abc",
                        headers = { host = "a.example", ["x-a"] = { "1", "2" }, ["x-n"] = 5 } }
    local out = ch:read_outbound()
    out = type(out) == "table" and table.concat(out) or out
    assert.matches("^POST /x%?y=1 HTTP/1%.1\r\n", out)
    assert.matches("\r\nhost: a%.example\r\n", out)
    assert.matches("\r\nx%-a: 1\r\nx%-a: 2\r\n", out)
    assert.matches("\r\nx%-n: 5\r\n", out)
    assert.matches("\r\nContent%-Length: 3\r\n\r\nabc$", out)
    assert.has_error(function() ch:write_outbound { method = "GET", path = "/a b" } end)
    ch:close()
  end)

  it("encodes numbers among a repeated header's values, and names a value it cannot send", function()
    local ch = netrun.embedded(codec.http_client {})
    ch:write_outbound { path = "/", headers = { host = "h", ["x-m"] = { 1, "two", 3.5 } } }
    local out = ch:read_outbound()
    out = type(out) == "table" and table.concat(out) or out
    assert.matches("\r\nx%-m: 1\r\nx%-m: two\r\nx%-m: 3%.5\r\n", out)
    local ok, err = pcall(ch.write_outbound, ch, { path = "/", headers = { ["x-m"] = { "a", {} } } })
    assert.is_false(ok)
    assert.matches("http_client request: header 'x%-m' value 2 is a table", tostring(err))
    ch:close()
  end)

  -- Three responses (a length, a chunked body with a trailer, a 204 after
  -- a 100) to three requests, cut at every byte boundary and byte by byte.
  local stream = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello" ..
    "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=1\r\nde\r\n0\r\nX-T: t\r\n\r\n" ..
    "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 204 No Content\r\nConnection: keep-alive\r\n\r\n"

  local function decode(chunks)
    local ch = netrun.embedded(codec.http_client {})
    for _ = 1, 3 do ch:write_outbound { path = "/" } end
    for _, c in ipairs(chunks) do ch:write_inbound(c) end
    local got = {}
    for _, r in ipairs(ch:read_all_inbound()) do
      got[#got + 1] = string.format("%d %s %s %s %s %s", r.status, r.body, tostring(r.headers["x-a"]),
        tostring(r.trailers and r.trailers["x-t"]), tostring(r.keep_alive), r.version)
    end
    ch:close()
    return got
  end

  it("decodes the same responses whatever the split", function()
    local expected = { "200 hello 1 nil true HTTP/1.1", "201 abcde nil t true HTTP/1.1",
                       "204  nil nil true HTTP/1.0" }
    assert.same(expected, decode { stream })
    for cut = 0, #stream do
      assert.same(expected, decode { stream:sub(1, cut), stream:sub(cut + 1) }, "split at " .. cut)
    end
    local bytes = {}
    for i = 1, #stream do bytes[i] = stream:sub(i, i) end
    assert.same(expected, decode(bytes), "byte by byte")
  end)

  it("reports a response to no request, and closes", function()
    local errors = {}
    local ch = netrun.embedded(codec.http_client {}, {
      exception_caught = function(_, _, err) errors[#errors + 1] = tostring(err) end,
    })
    ch:write_inbound("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    assert.same({ "http_client: malformed response: a response to no request" }, errors)
    assert.is_false(ch:channel():is_open())
  end)
end)
