-- static_spec.lua -- netrun.handler.static (DESIGN.md §9.3) against curl
-- and raw sockets, on a temporary root: what it serves and how (RFC 9110:
-- validators, preconditions, ranges, precompressed siblings), what it
-- passes on to the next handler, the paths it refuses, and the attacks
-- (a client that reads nothing, a file truncated while it is sent, too
-- many ranges, huge numbers). The same over TLS: static_tls_spec.lua.
local H = require "spec.helper"
local netrun, socket = H.netrun, H.socket

local dir = H.tmpdir()
local root = dir .. "/root"
local function write(path, data)
  local f = assert(io.open(root .. "/" .. path, "wb"))
  f:write(data)
  f:close()
end
assert(os.execute("mkdir -p " .. root .. "/sub " .. root .. "/noindex "
  .. dir .. "/outside"))
write("a.txt", "hello\n")
write("page.HTML", "<p>x</p>")
write("data.xyz", "?")
write("sub/index.html", "<h1>index</h1>")
write("noindex/x.txt", "x")
write("app.js", "plain js")
write("app.js.gz", "gz js")
write("app.js.br", "br js")
write("only.css", "css")
write("only.css.gz", "gz css")
local big = {}
for i = 1, 40000 do big[i] = string.format("%07d\n", i) end   -- 320000 bytes
big = table.concat(big)
write("big.txt", big)
local f = io.open(dir .. "/outside/secret.txt", "w") f:write("secret") f:close()
assert(os.execute("ln -s " .. dir .. "/outside " .. root .. "/out"))
assert(os.execute("ln -s sub " .. root .. "/inside"))
assert(os.execute("truncate -s 64M " .. root .. "/sparse.bin"))

-- The next handler: says what reached it.
local App = {}
function App:channel_read(ctx, req)
  ctx:write { status = 404, body = "app " .. req.method .. " " .. req.path }
end
function App:channel_read_complete(ctx) ctx:flush() end

local function serve(opts)
  opts.root = opts.root or root
  local files = netrun.handler.static(opts)
  local group = netrun.group { threads = 1, name = "static" }
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0,
    init = function(ch)
      ch:pipeline():add_last("http", netrun.codec.http_server {})
        :add_last("files", files):add_last("app", App)
    end,
  }:sync()
  local _, port = server:local_address()
  return group, port
end

-- curl: status, headers (lower-case names), body.
local function curl(port, path, args)
  local out, st = H.run(string.format("curl -sS -i --max-time 10 %s 'http://127.0.0.1:%d%s'",
    args or "", port, path))
  assert(st == 0, "curl failed: " .. out)
  local head, body = out:match("^(.-)\r\n\r\n(.*)$")
  local status = tonumber(head:match("^HTTP/1%.1 (%d+)"))
  local hs = {}
  for k, v in head:gmatch("\r\n([^:\r\n]+):%s*([^\r\n]*)") do hs[k:lower()] = v end
  return status, hs, body
end

local function raw(port, text)
  local c = H.client(port)
  assert(c:send(text))
  return c
end

describe("handler.static", function()
  local group, port
  setup(function() group, port = serve { cache = { valid = 0.3 } } end)
  teardown(function() H.shutdown(group) end)

  it("answers GET and HEAD with validators, type and length", function()
    local st, h, body = curl(port, "/a.txt")
    assert.equal(200, st)
    assert.equal("hello\n", body)
    assert.equal("text/plain", h["content-type"])
    assert.equal("6", h["content-length"])
    assert.equal("bytes", h["accept-ranges"])
    assert.equal("Accept-Encoding", h["vary"])
    assert.matches('^"[%x.]+%-6"$', h["etag"])
    assert.matches("^%a%a%a, %d%d %a%a%a %d%d%d%d %d%d:%d%d:%d%d GMT$", h["last-modified"])
    local st2, h2, body2 = curl(port, "/a.txt", "-I")
    assert.equal(200, st2)
    assert.equal("6", h2["content-length"])
    assert.equal(h["etag"], h2["etag"])
    assert.equal("", body2)
    assert.equal("text/html", (select(2, curl(port, "/page.HTML")))["content-type"])
    assert.equal("application/octet-stream", (select(2, curl(port, "/data.xyz")))["content-type"])
  end)

  it("passes on what it does not serve, and redirects a directory to its slash", function()
    local st, _, body = curl(port, "/nope.txt")
    assert.same({ 404, "app GET /nope.txt" }, { st, body })
    st, _, body = curl(port, "/a.txt", "-X POST -d x=1")
    assert.equal(404, st)
    assert.equal("app POST /a.txt", body)
    st, _, body = curl(port, "/noindex/")
    assert.equal("app GET /noindex/", body)         -- no listing
    st, _, body = curl(port, "/a.txt/")
    assert.equal("app GET /a.txt/", body)
    local h
    st, h = curl(port, "/sub?x=1")
    assert.equal(301, st)
    assert.equal("/sub/?x=1", h["location"])
    st, h, body = curl(port, "/sub/")
    assert.equal(200, st)
    assert.equal("<h1>index</h1>", body)
    assert.equal("text/html", h["content-type"])
  end)

  it("answers preconditions: 304 and 412", function()
    local _, h = curl(port, "/a.txt")
    local etag, lm = h["etag"], h["last-modified"]
    local st, h2, body = curl(port, "/a.txt", "-H 'If-None-Match: " .. etag .. "'")
    assert.equal(304, st)
    assert.equal("", body)
    assert.equal(etag, h2["etag"])
    assert.equal(304, (curl(port, "/a.txt", "-H 'If-None-Match: \"x\", W/" .. etag .. "'")))
    assert.equal(200, (curl(port, "/a.txt", "-H 'If-None-Match: \"other\"'")))
    assert.equal(304, (curl(port, "/a.txt", "-H 'If-Modified-Since: " .. lm .. "'")))
    assert.equal(200, (curl(port, "/a.txt", "-H 'If-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT'")))
    -- If-None-Match wins over If-Modified-Since (RFC 9110 13.2.2)
    assert.equal(200, (curl(port, "/a.txt", "-H 'If-None-Match: \"other\"' -H 'If-Modified-Since: " .. lm .. "'")))
    assert.equal(412, (curl(port, "/a.txt", "-H 'If-Match: \"other\"'")))
    assert.equal(412, (curl(port, "/a.txt", "-H 'If-Match: W/" .. etag .. "'")))   -- strong only
    assert.equal(200, (curl(port, "/a.txt", "-H 'If-Match: " .. etag .. "'")))
    assert.equal(200, (curl(port, "/a.txt", "-H 'If-Match: *'")))
    assert.equal(412, (curl(port, "/a.txt", "-H 'If-Unmodified-Since: Sun, 06 Nov 1994 08:49:37 GMT'")))
    assert.equal(304, (curl(port, "/a.txt", "-H 'If-Modified-Since: Sunday, 06-Nov-44 08:49:37 GMT'")))
  end)

  it("answers single and multiple ranges, 416, and If-Range", function()
    local st, h, body = curl(port, "/big.txt", "-r 8-15")
    assert.equal(206, st)
    assert.equal("0000002\n", body)
    assert.equal("bytes 8-15/320000", h["content-range"])
    st, _, body = curl(port, "/big.txt", "-r -8")
    assert.equal("0040000\n", body)
    st, h, body = curl(port, "/big.txt", "-r 0-7,319992-")
    assert.equal(206, st)
    local boundary = h["content-type"]:match("^multipart/byteranges; boundary=(.+)$")
    assert.truthy(boundary)
    assert.equal(#body, tonumber(h["content-length"]))
    assert.truthy(body:find("Content-Range: bytes 0-7/320000\r\n\r\n0000001\n\r\n--" .. boundary, 1, true))
    assert.truthy(body:find("Content-Range: bytes 319992-319999/320000\r\n\r\n0040000\n\r\n--"
      .. boundary .. "--\r\n", 1, true))
    -- a large multipart body is streamed (past the small-body size)
    st, h, body = curl(port, "/big.txt", "-r 0-99999,200000-299999")
    assert.equal(206, st)
    assert.equal(#body, tonumber(h["content-length"]))
    assert.truthy(body:find(big:sub(200001, 300000), 1, true))
    st, h = curl(port, "/big.txt", "-r 320000-")
    assert.equal(416, st)
    assert.equal("bytes */320000", h["content-range"])
    -- If-Range: the current ETag gives the range, another the whole file
    local etag = h["etag"] or (select(2, curl(port, "/big.txt", "-I")))["etag"]
    assert.equal(206, (curl(port, "/big.txt", "-r 0-1 -H 'If-Range: " .. etag .. "'")))
    st, _, body = curl(port, "/big.txt", "-r 0-1 -H 'If-Range: \"stale\"'")
    assert.equal(200, st)
    assert.equal(#big, #body)
    -- HEAD ignores Range
    assert.equal(200, (curl(port, "/big.txt", "-I -r 0-1")))
  end)

  it("bounds the ranges: too many, overlapping, huge numbers", function()
    local function ranges(n)
      local many = {}
      for i = 0, n - 1 do many[#many + 1] = (i * 10) .. "-" .. (i * 10 + 1) end
      local hdr = dir .. "/range.hdr"
      local hf = io.open(hdr, "w") hf:write("Range: bytes=" .. table.concat(many, ",") .. "\r\n") hf:close()
      return curl(port, "/big.txt", "-H @" .. hdr)
    end
    local st, _, body = ranges(65)
    assert.equal(200, st)                 -- more than max_ranges: the whole file
    assert.equal(#big, #body)
    st, _, body = ranges(64)
    assert.equal(206, st)
    assert.truthy(body:find("Content-Range: bytes 630-631/320000", 1, true))
    assert.equal(431, (ranges(10000)))    -- past the codec's max_header
    st, _, body = curl(port, "/a.txt", "-r 0-5,0-5,0-5")
    assert.equal(200, st)                 -- overlaps past the file's size
    assert.equal("hello\n", body)
    assert.equal(416, (curl(port, "/a.txt", "-H 'Range: bytes=99999999999999999999999-'")))
    st, _, body = curl(port, "/a.txt", "-H 'Range: bytes=1-99999999999999999999999'")
    assert.equal(206, st)
    assert.equal("ello\n", body)
    assert.equal(200, (curl(port, "/a.txt", "-H 'Range: bytes=5-1'")))     -- invalid: ignored
    assert.equal(200, (curl(port, "/a.txt", "-H 'Range: lines=1-2'")))
  end)

  it("chooses .br / .gz siblings by Accept-Encoding", function()
    local st, h, body = curl(port, "/app.js", "-H 'Accept-Encoding: gzip, br'")
    assert.equal("br js", body)
    assert.equal("br", h["content-encoding"])
    assert.equal("text/javascript", h["content-type"])
    assert.equal("Accept-Encoding", h["vary"])
    local br_tag = h["etag"]
    st, h, body = curl(port, "/app.js", "-H 'Accept-Encoding: gzip, br;q=0'")
    assert.equal("gz js", body)
    assert.equal("gzip", h["content-encoding"])
    assert.are_not.equal(br_tag, h["etag"])
    st, h, body = curl(port, "/app.js", "-H 'Accept-Encoding: gzip;q=0.5, br;q=0.4'")
    assert.equal("gz js", body)
    st, h, body = curl(port, "/app.js", "-H 'Accept-Encoding: identity'")
    assert.equal("plain js", body)
    assert.is_nil(h["content-encoding"])
    st, h, body = curl(port, "/only.css", "-H 'Accept-Encoding: *'")
    assert.equal("gz css", body)          -- "*" takes what there is
    assert.equal(200, st)
  end)

  it("refuses paths out of the root and passes them on", function()
    local function get(path)
      local c = raw(port, "GET " .. path .. " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
      local st, _, body = H.read_response(c)
      c:close()
      return st, body
    end
    assert.same({ 404, "app GET /sub%2Findex.html" }, { get("/sub%2Findex.html") })
    assert.same({ 404, "app GET /a.txt%5C" }, { get("/a.txt%5C") })
    assert.same({ 404, "app GET /out/secret.txt" }, { get("/out/secret.txt") })
    assert.same({ 200, "<h1>index</h1>" }, { get("/inside/index.html") })  -- stays inside
    assert.equal(400, (get("/%2e%2e/outside/secret.txt")))
    assert.equal(400, (get("/a.txt%00")))
    assert.equal(400, (get("/sub/..%2F..%2Foutside/secret.txt")))
    assert.same({ 200, "hello\n" }, { get("/sub/../a.txt") })   -- resolved first
    local g2, p2 = serve { follow_symlinks = true }
    local c = raw(p2, "GET /out/secret.txt HTTP/1.1\r\nHost: x\r\n\r\n")
    local st, _, body = H.read_response(c)
    c:close()
    H.shutdown(g2)
    assert.same({ 200, "secret" }, { st, body })
  end)

  it("answers pipelined requests in order, large and small", function()
    local c = raw(port, "GET /big.txt HTTP/1.1\r\nHost: x\r\n\r\nGET /a.txt HTTP/1.1\r\nHost: x\r\n\r\n"
      .. "GET /nope HTTP/1.1\r\nHost: x\r\n\r\nGET /big.txt HTTP/1.1\r\nHost: x\r\nRange: bytes=0-7\r\n\r\n")
    local st, _, body = H.read_response(c)
    assert.same({ 200, true }, { st, body == big })
    st, _, body = H.read_response(c)
    assert.same({ 200, "hello\n" }, { st, body })
    st, _, body = H.read_response(c)
    assert.same({ 404, "app GET /nope" }, { st, body })
    st, _, body = H.read_response(c)
    assert.same({ 206, "0000001\n" }, { st, body })
    c:close()
  end)

  it("sees a file replaced on disk once the cache entry expires", function()
    write("changing.txt", "one")
    assert.equal("one", select(3, curl(port, "/changing.txt")))
    os.remove(root .. "/changing.txt")
    write("changing.txt", "two!")
    assert.equal("two!", H.eventually(function()
      local _, _, b = curl(port, "/changing.txt")
      return b == "two!" and b
    end, 5, 0.1))
    os.remove(root .. "/changing.txt")
    assert.equal(404, H.eventually(function()
      local st = curl(port, "/changing.txt")
      return st == 404 and st
    end, 5, 0.1))
  end)
end)

describe("handler.static's open file cache", function()
  -- descriptors this process holds on files under the root
  local function open_files()
    local n = 0
    local st = io.open("/proc/self/stat")          -- (this process's, not ls's)
    local pid = st:read("a"):match("^(%d+)")
    st:close()
    local ls = io.popen("ls -l /proc/" .. pid .. "/fd/ 2>/dev/null")
    for line in ls:lines() do
      if line:find(root .. "/", 1, true) then n = n + 1 end
    end
    ls:close()
    return n
  end

  it("keeps at most cache.max files open, and closes them at shutdown", function()
    local group, port = serve { cache = { max = 2 }, precompressed = false }
    for _, name in ipairs { "a.txt", "page.HTML", "data.xyz", "app.js", "only.css" } do
      assert.equal(200, (curl(port, "/" .. name)))
    end
    assert.equal(2, open_files())
    H.shutdown(group)
    assert.equal(0, open_files())
  end)
end)

describe("handler.static under attack", function()
  for _, sendfile in ipairs { true, false } do
    local how = sendfile and "sendfile" or "pread"

    it("holds little for a client that reads nothing (" .. how .. ")", function()
      local group, port = serve { sendfile = sendfile, max_chunk = 65536 }
      local before = H.rss()
      local cs = {}
      for i = 1, 4 do cs[i] = raw(port, "GET /sparse.bin HTTP/1.1\r\nHost: x\r\n\r\n") end
      -- the server sends what the sockets take, then waits
      local c2 = raw(port, "GET /a.txt HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
      assert.equal(200, (H.read_response(c2)))
      c2:close()
      -- a window for the server to go on sending (it must not: the
      -- sockets are full and the channels unwritable)
      socket.select(nil, nil, 0.5)
      if not H.sanitized then
        assert.is_true(H.rss() - before < 16 * 1024, "grew " .. (H.rss() - before) .. " KiB")
      end
      -- one of them reads it all: the whole 64 MiB, then the connection stays
      local c = cs[1]
      local line = assert(c:receive("*l"))
      assert.equal("HTTP/1.1 200 OK", line)
      repeat line = assert(c:receive("*l")) until line == ""
      local got = 0
      c:settimeout(10)
      while got < 64 * 1024 * 1024 do
        local data, err, partial = c:receive(1 << 20)
        data = data or partial
        assert(data and #data > 0, err)
        got = got + #data
      end
      assert.equal(64 * 1024 * 1024, got)
      for _, x in ipairs(cs) do x:close() end
      H.shutdown(group)
    end)

    it("closes the connection when the file is truncated under it (" .. how .. ")", function()
      write("shrinks.bin", string.rep("z", 4 * 1024 * 1024))
      local group, port = serve { sendfile = sendfile, max_chunk = 65536, cache = { max = 0 } }
      local c = raw(port, "GET /shrinks.bin HTTP/1.1\r\nHost: x\r\n\r\n")
      local line = assert(c:receive("*l"))
      assert.equal("HTTP/1.1 200 OK", line)
      local len
      repeat
        line = assert(c:receive("*l"))
        len = len or tonumber(line:match("^Content%-Length: (%d+)"))
      until line == ""
      assert.equal(4 * 1024 * 1024, len)
      assert(c:receive(1000))
      assert(os.execute("truncate -s 100000 " .. root .. "/shrinks.bin"))
      local got, err = 1000, nil
      c:settimeout(10)
      while true do
        local data, e, partial = c:receive(65536)
        got = got + #(data or partial or "")
        if not data then err = e break end
      end
      assert.equal("closed", err)
      assert.is_true(got < len, "got " .. got)
      c:close()
      H.shutdown(group)
    end)
  end
end)

describe("examples/static.lua", function()
  it("serves a directory given by --root", function()
    local port = H.free_port()
    local pid = H.start("examples/static.lua", port, "--root " .. root)
    local st, h, body = curl(port, "/sub/")
    assert.equal(200, st)
    assert.equal("<h1>index</h1>", body)
    st, h, body = curl(port, "/big.txt", "-r 8-15")
    assert.same({ 206, "0000002\n" }, { st, body })
    st, h, body = curl(port, "/none")
    assert.same({ 404, "not found: /none\n" }, { st, body })
    assert.is_true(H.stop(pid))
    _ = h
  end)
end)
