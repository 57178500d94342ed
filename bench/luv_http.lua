-- luv_http.lua -- the naive luv (libuv + Lua) HTTP hello server of the
-- pipelined comparison (DESIGN.md §7, issue 17): no parser, it counts the
-- "\r\n\r\n" that end requests in what arrived (keeping an unfinished tail)
-- and writes the fixed response once per request, all of one read's
-- responses in one write. Date is refreshed once a second.
--   lua5.4 bench/luv_http.lua PORT      (Debian: lua-luv)
local uv = require "luv"

local port = tonumber(arg[1]) or 8080
local BODY = "Hello, World!"
local response, response_sec

local function refresh()
  local now = os.time()
  if now ~= response_sec then
    response_sec = now
    response = "HTTP/1.1 200 OK\r\nServer: luv\r\nDate: " ..
      os.date("!%a, %d %b %Y %H:%M:%S GMT", now) ..
      "\r\nContent-Type: text/plain\r\nContent-Length: " .. #BODY .. "\r\n\r\n" .. BODY
  end
end

local server = uv.new_tcp()
assert(server:bind("127.0.0.1", port))
assert(server:listen(1024, function(err)
  assert(not err, err)
  local client = uv.new_tcp()
  server:accept(client)
  client:nodelay(true)
  local tail = ""
  client:read_start(function(rerr, data)
    if rerr or not data then client:close() return end
    if #tail > 0 then data = tail .. data end
    local n, pos = 0, 1
    while true do
      local e = data:find("\r\n\r\n", pos, true)
      if not e then break end
      n, pos = n + 1, e + 4
    end
    tail = data:sub(pos)
    if n > 0 then
      refresh()
      client:write(response:rep(n))
    end
  end)
end))
io.stderr:write("luv_http listening on 127.0.0.1:" .. port .. "\n")
uv.run()
