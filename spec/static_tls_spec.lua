-- static_tls_spec.lua -- netrun.handler.static behind TLS (bodies read
-- into buffers, never file regions) with curl over HTTPS: HTTP/1.1 and
-- HTTP/2 (ALPN h2), whole files, ranges, HEAD, 304, several streams of
-- one HTTP/2 connection at once, and a file truncated while it is sent.
local H = require "spec.helper"
local netrun = H.netrun

local dir = H.tmpdir()
assert(H.run("bash " .. H.root .. "/spec/fixtures/tls/make_certs.sh " .. dir .. "/certs"))
local root = dir .. "/root"
assert(os.execute("mkdir -p " .. root .. "/sub"))
local function write(path, data)
  local f = assert(io.open(root .. "/" .. path, "wb"))
  f:write(data)
  f:close()
end
local big = {}
for i = 1, 250000 do big[i] = string.format("%07d\n", i) end   -- 2 MB
big = table.concat(big)
write("big.txt", big)
write("a.txt", "hello\n")
write("sub/index.html", "<h1>tls</h1>")

local function serve(opts)
  opts.root = root
  local files = netrun.handler.static(opts)
  local tls = netrun.tls.server { cert = dir .. "/certs/server.crt", key = dir .. "/certs/server.key",
                                  alpn = { "h2", "http/1.1" } }
  local group = netrun.group { threads = 1, name = "static-tls" }
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0, tls = tls,
    init = function(ch)
      ch:pipeline():add_last("http", netrun.codec.http_server {}):add_last("files", files)
        :add_last("app", {
          channel_read = function(_, ctx, req) ctx:write { status = 404, body = "app " .. req.path } end,
          channel_read_complete = function(_, ctx) ctx:flush() end,
        })
    end,
  }:sync()
  local _, port = server:local_address()
  return group, port
end

local function curl(port, path, args)
  local out, st = H.run(string.format(
    "curl -sS -i --max-time 10 --cacert %s/certs/ca.crt %s 'https://127.0.0.1:%d%s'",
    dir, args or "", port, path))
  assert(st == 0, "curl failed: " .. out)
  local head, body = out:match("^(.-)\r\n\r\n(.*)$")
  local version, status = head:match("^HTTP/([%d.]+) (%d+)")
  local hs = {}
  for k, v in head:gmatch("\r\n([^:\r\n]+):%s*([^\r\n]*)") do hs[k:lower()] = v end
  return tonumber(status), hs, body, version
end

describe("handler.static over TLS", function()
  local group, port
  setup(function() group, port = serve { max_chunk = 65536 } end)
  teardown(function() H.shutdown(group) end)

  for _, proto in ipairs { "--http1.1", "--http2" } do
    it("serves files, ranges, HEAD and 304 (" .. proto .. ")", function()
      local st, h, body, version = curl(port, "/big.txt", proto)
      assert.equal(proto == "--http2" and "2" or "1.1", version)
      assert.equal(200, st)
      assert.equal(#big, tonumber(h["content-length"]))
      assert.is_true(body == big, "body differs")
      st, h, body = curl(port, "/big.txt", proto .. " -r 8-15,1999992-")
      assert.equal(206, st)
      assert.truthy(body:find("\r\n\r\n0000002\n\r\n", 1, true))
      assert.truthy(body:find("\r\n\r\n0250000\n\r\n", 1, true))
      st, h, body = curl(port, "/big.txt", proto .. " -r 100000-1999999")
      assert.equal(206, st)
      assert.is_true(body == big:sub(100001, 2000000), "range differs")
      st, h, body = curl(port, "/a.txt", proto .. " -I")
      assert.same({ 200, "6", "" }, { st, h["content-length"], body })
      st = curl(port, "/a.txt", proto .. " -H 'If-None-Match: " .. h["etag"] .. "'")
      assert.equal(304, st)
      st, h, body = curl(port, "/sub/", proto)
      assert.same({ 200, "<h1>tls</h1>" }, { st, body })
      st, h, body = curl(port, "/nope", proto)
      assert.same({ 404, "app /nope" }, { st, body })
    end)
  end

  it("answers several HTTP/2 streams of one connection at once", function()
    local out = dir .. "/out"
    assert(os.execute("mkdir -p " .. out))
    local urls = {}
    for i = 1, 4 do
      urls[#urls + 1] = string.format("-o %s/%d 'https://127.0.0.1:%d/%s'", out, i, port,
        i % 2 == 0 and "big.txt" or "a.txt")
    end
    local text, st = H.run(string.format("curl -sS -Z --http2 --max-time 10 --cacert %s/certs/ca.crt %s",
      dir, table.concat(urls, " ")))
    assert.equal(0, st, text)
    for i = 1, 4 do
      assert.is_true(H.read_file(out .. "/" .. i) == (i % 2 == 0 and big or "hello\n"), "file " .. i)
    end
  end)
end)
