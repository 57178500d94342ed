-- diagnostics_spec.lua -- no silent failures: what a newcomer meets in
-- the first hour says what went wrong and what to do. Objects
-- with metatable methods work when copied; misspelled handler methods and
-- option keys are named; unwritable messages say what a channel takes;
-- a write nobody flushed is flushed; an undefined global on a loop says
-- why; a loop is taken wherever a group is; modules next to the script
-- are found from any directory.
local H = require "spec.helper"
local netrun, socket = H.netrun, H.socket

-- Run a Lua script with the netrun binary (from dir, with args); returns
-- its output (stderr included) and exit status.
local function run_script(src, dir, name)
  dir = dir or H.tmpdir()
  local path = dir .. "/" .. (name or "script.lua")
  local f = assert(io.open(path, "w"))
  f:write(src)
  f:close()
  local root = H.root:sub(1, 1) == "/" and H.root or (os.getenv("PWD") .. "/" .. H.root)
  local bin = H.BIN:sub(1, 1) == "/" and H.BIN or (os.getenv("PWD") .. "/" .. H.BIN)
  return H.run(string.format("cd / && LUA_PATH='%s/lua/?.lua;%s/lua/?/init.lua;;' timeout 30 %s %s",
    root, root, bin, path))
end

local function count(s, pat)
  local n = 0
  for _ in s:gmatch(pat) do n = n + 1 end
  return n
end

describe("diagnostics: no silent failures", function()
  local group
  setup(function() group = netrun.group { threads = 2, name = "nc" } end)
  teardown(function() H.shutdown(group) end)

  it("relays through a handler object whose methods come from its metatable, copied to the loop", function()
    local Base = {}
    Base.__index = Base
    function Base:channel_read(ctx, m) ctx:write(self.tag .. m) end
    function Base:channel_read_complete(ctx) ctx:flush() end
    local obj = setmetatable({ tag = "copied:" }, Base)
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch) ch:pipeline():add_last("h", obj) end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    c:send("x")
    assert.equal("copied:x", H.recv(c, 8))
    c:close()
    server:close():sync()
    -- and the copy keeps its class across a plain transfer too
    local back = group:next():submit(function(o) return getmetatable(o) ~= nil and o.channel_read ~= nil end, obj):sync()
    assert.is_true(back)
  end)

  it("warns once about a misspelled handler method, naming the closest event", function()
    local out, st = run_script([[
local netrun = require "netrun"
local socket = require "socket"
local g = netrun.group { threads = 1, name = "w" }
local Base = {}; Base.__index = Base
function Base:channel_raed(ctx, m) end
function Base:channel_read(ctx, m) ctx:write_and_flush(m) end
function Base:send_reply(ctx) end
function Base:reset() end
function Base:writer() end
local s = netrun.server { group = g, host = "127.0.0.1", port = 0,
  init = function(ch) ch:pipeline():add_last("echo", setmetatable({}, Base)) end }:sync()
local _, port = s:local_address()
for i = 1, 3 do
  local c = socket.tcp(); c:settimeout(5); assert(c:connect("127.0.0.1", port))
  c:send("hi\n"); assert(c:receive("*l") == "hi"); c:close()
end
g:shutdown_gracefully(0, 5):sync()
]])
    assert.equal(0, st, out)
    assert.equal(1, count(out, "WARN"), out)
    assert.truthy(out:find("handler 'echo': method 'channel_raed' is not a netrun event", 1, true), out)
    assert.truthy(out:find("did you mean channel_read?", 1, true), out)
  end)

  it("scans a shared handler table once, and again once it is given a class", function()
    -- One table serves every connection: scanned when first added, not per
    -- connection. Given a metatable later, the class its __index leads to
    -- is scanned when the table is next added.
    local out, st = run_script([[
local netrun = require "netrun"
local socket = require "socket"
local g = netrun.group { threads = 1, name = "w" }
local Base = {}; Base.__index = Base
function Base:exception_cuaght(ctx, e) end
local Echo = {}
function Echo:channel_read(ctx, m) ctx:write_and_flush(m) end
function Echo:channel_actvie(ctx) end
local seen = { n = 0 }      -- the loop's copies of Echo, Base and seen persist
local s = netrun.server { group = g, host = "127.0.0.1", port = 0,
  init = function(ch)
    seen.n = seen.n + 1
    if seen.n == 3 then setmetatable(Echo, Base) end
    ch:pipeline():add_last("echo", Echo)
  end }:sync()
local _, port = s:local_address()
for i = 1, 4 do
  local c = socket.tcp(); c:settimeout(5); assert(c:connect("127.0.0.1", port))
  c:send("hi\n"); assert(c:receive("*l") == "hi"); c:close()
end
g:shutdown_gracefully(0, 5):sync()
]])
    assert.equal(0, st, out)
    assert.equal(2, count(out, "WARN"), out)
    assert.truthy(out:find("method 'channel_actvie' is not a netrun event", 1, true), out)
    assert.truthy(out:find("method 'exception_cuaght' is not a netrun event", 1, true), out)
  end)

  it("says what was written and what a channel takes when no handler encoded it", function()
    local got = netrun.promise()
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("h", {
          errs = {},
          channel_read = function(self, ctx)
            ctx:write(42); ctx:write(true); ctx:write({ a = 1 })
            ctx:write(netrun.codec.http_response { body = "hi" })   -- a codec's message
            got:try_success(self.errs)
          end,
          exception_caught = function(self, ctx, e) table.insert(self.errs, e) end,
        })
      end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    c:send("x")
    local errs = H.sync(got)
    assert.equal(4, #errs)
    assert.truthy(errs[1]:find("cannot write a number (42) to a stream channel: it takes a string or an array of strings", 1, true), errs[1])
    assert.truthy(errs[2]:find("a boolean (true)", 1, true), errs[2])
    assert.truthy(errs[3]:find("a table that is not an array of strings", 1, true), errs[3])
    assert.truthy(errs[4]:find("cannot write a message of type http_prepared to a stream channel", 1, true), errs[4])
    c:close()
    server:close():sync()
    -- a string on a datagram channel reaches exception_caught
    local caught = netrun.promise()
    local udp = netrun.udp {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("u", {
          channel_read = function(self, ctx, d) ctx:write_and_flush("reply") end,
          exception_caught = function(self, ctx, e) caught:try_success(e) end,
        })
      end,
    }:sync()
    local _, uport = udp:local_address()
    local u = socket.udp()
    u:setpeername("127.0.0.1", uport)
    u:send("ping")
    local e = H.sync(caught)
    assert.truthy(e:find("cannot write a string to a datagram channel: it takes { data = ..., host = ..., port = ... }", 1, true), e)
    local ok, err = pcall(function() return udp:write_and_flush("x"):sync() end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("datagram channel", 1, true))
    u:close()
    udp:close():sync()
  end)

  it("names the Lua line that wrote a value no handler encoded, at the tail and to exception_caught", function()
    local out, st = run_script([[
local netrun = require "netrun"
local g = netrun.group { threads = 1, name = "w" }
local caught = netrun.promise()
local Writer = {}
function Writer:channel_active(ctx)
  ctx:write(42)
  netrun.spawn(function()
    ctx:write(true)
  end)
end
local Catcher = {}
function Catcher:channel_active(ctx)
  ctx:fire_channel_active()
  ctx.channel:pipeline():write({ a = 1 }):add_listener(function(f) caught:try_success(f:cause()) end)
end
local s = netrun.server { group = g, host = "127.0.0.1", port = 0, init = function(ch)
  ch:pipeline():add_last("c", Catcher):add_last("w", Writer)
end }:sync()
local _, port = s:local_address()
local c = netrun.connect { group = g, host = "127.0.0.1", port = port }:sync()
print("future: " .. tostring(caught:sync()))
c:close():sync()
g:shutdown_gracefully(0, 1):sync()
]], nil, "writer.lua")
    assert.equal(0, st, out)
    assert.truthy(out:find("tail of the pipeline: /.-/writer%.lua:6: cannot write a number %(42%) to a stream channel"), out)
    assert.truthy(out:find("tail of the pipeline: /.-/writer%.lua:8: cannot write a boolean %(true%)"), out)
    assert.truthy(out:find("future: /.-/writer%.lua:14: cannot write a table that is not an array of strings"), out)
  end)

  it("flushes what a handler without channel_read_complete wrote, at the end of the read", function()
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("echo", { channel_read = function(self, ctx, m) ctx:write(m) end })
      end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    c:settimeout(2)
    c:send("unflushed\n")
    assert.equal("unflushed", c:receive("*l"))
    c:close()
    -- behind the HTTP codec too
    local http = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("http", netrun.codec.http_server {})
        ch:pipeline():add_last("app", { channel_read = function(self, ctx, req)
          ctx:write { status = 200, body = "hi" }
        end })
      end,
    }:sync()
    local _, hport = http:local_address()
    c = H.client(hport)
    c:settimeout(2)
    c:send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    local status, _, body = H.read_response(c)
    assert.equal(200, status)
    assert.equal("hi", body)
    c:close()
    server:close():sync()
    http:close():sync()
  end)

  it("names a misspelled option and a badly typed one", function()
    local cases = {
      { function() netrun.server { group = group, port = 0, chlid_options = {} } end,
        "netrun.server: unknown option 'chlid_options' (did you mean 'child_options'?)" },
      { function() netrun.group { thread = 2 } end,
        "netrun.group: unknown option 'thread' (did you mean 'threads'?)" },
      { function() netrun.executor_group { thraeds = 2 } end,
        "netrun.executor_group: unknown option 'thraeds' (did you mean 'threads'?)" },
      { function() netrun.connect { group = group, port = 1, timout = 1 } end,
        "netrun.connect: unknown option 'timout' (did you mean 'timeout'?)" },
      { function() netrun.udp { group = group, port = 0, hots = "127.0.0.1" } end,
        "netrun.udp: unknown option 'hots' (did you mean 'host'?)" },
      { function() netrun.server { group = group, port = 0, child_options = { tcp_nodelya = true } } end,
        "netrun.server: unknown option 'child_options.tcp_nodelya' (did you mean 'child_options.tcp_nodelay'?)" },
      { function() netrun.server { group = group, port = "http" } end,
        'netrun.server: port must be an integer from 0 to 65535, got "http"' },
      { function() netrun.server { group = group, port = 0, backlog = "many" } end,
        "netrun.server: backlog must be an integer" },
    }
    for _, c in ipairs(cases) do
      local ok, err = pcall(c[1])
      assert.is_false(ok)
      assert.truthy(tostring(err):find(c[2], 1, true), tostring(err))
    end
  end)

  it("takes a loop wherever a group is taken: an outbound connection on the caller's loop", function()
    local server = netrun.server {
      group = group:next(), host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("echo", { channel_read = function(_, ctx, m) ctx:write_and_flush(m) end })
      end,
    }:sync()
    local _, port = server:local_address()
    local loop = group:loops()[2]
    local got = loop:submit(function(p)
      local nr = require "netrun"
      local here = nr.current()
      local answer = nr.promise()
      nr.connect {
        group = here, host = "127.0.0.1", port = p,
        init = function(ch)
          ch:pipeline():add_last("c", { channel_read = function(_, ctx, m)
            answer:try_success(m .. " " .. tostring(ctx:loop() == here))
          end })
        end,
      }:add_listener(function(f) f:result():write_and_flush("ping") end)
      return answer
    end, port):sync()
    assert.equal("ping true", H.sync(got))
    -- a handler on a loop given instead of an executor group
    local server2 = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last(loop, "echo", { channel_read = function(_, ctx, m)
          ctx:write_and_flush(m .. "@" .. require("netrun").current():name())
        end })
      end,
    }:sync()
    local _, port2 = server2:local_address()
    local c = H.client(port2)
    c:send("x")
    assert.equal("x@" .. loop:name(), H.recv(c, 2 + #loop:name()))
    c:close()
    server:close():sync()
    server2:close():sync()
  end)

  it("explains a nil global on a loop state: loop states do not see the main script's globals", function()
    _G.NEWCOMER_PREFIX = "> "
    local ok, err = pcall(function()
      return group:next():submit(function(x) return NEWCOMER_PREFIX .. x end, "y"):sync()
    end)
    _G.NEWCOMER_PREFIX = nil
    assert.is_false(ok)
    err = tostring(err)
    assert.truthy(err:find("attempt to concatenate a nil value (global 'NEWCOMER_PREFIX')", 1, true), err)
    assert.truthy(err:find("global 'NEWCOMER_PREFIX' is not defined in this loop's Lua state (nc-", 1, true), err)
    assert.truthy(err:find("pass values as upvalues or arguments, or use netrun.shared / require", 1, true), err)
    -- reading an undefined global stays legal
    assert.equal("no jit", group:next():submit(function() return jit and "jit" or "no jit" end):sync())
  end)

  it("runs a task given to the caller's own loop as the same closure, so it may capture ctx", function()
    local loops = group:loops()
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("h", { channel_read = function(self, ctx, m)
          local other = ctx:loop() == loops[1] and loops[2] or loops[1]
          if m:find("own") then
            ctx:loop():schedule(0.01, function() ctx:write_and_flush("late\n") end)
          else
            local ok, e = pcall(other.execute, other, function() ctx:write_and_flush("x") end)
            ctx:write_and_flush(tostring(e):gsub("\n", " ") .. "\n")
          end
        end })
      end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    c:send("own\n")
    assert.equal("late", c:receive("*l"))
    c:send("other\n")
    local e = c:receive("*l")
    assert.truthy(e:find("cannot transfer a netrun.ctx (upvalue 'ctx' of the function given to execute): "
      .. "it cannot be copied to another loop; schedule on ctx:loop() to keep it, or pass plain values", 1, true), e)
    c:close()
    server:close():sync()
  end)

  it("finds a module next to the script when run from another directory, on every state", function()
    local dir = H.tmpdir()
    local f = assert(io.open(dir .. "/nc_helper.lua", "w"))
    f:write("return { greet = function(x) return 'hello ' .. x end }\n")
    f:close()
    local out, st = run_script([[
local netrun = require "netrun"
local helper = require "nc_helper"
print(helper.greet("main"))
local g = netrun.group { threads = 1, name = "w" }
print(g:submit(function() return require("nc_helper").greet("loop") end):sync())
g:shutdown_gracefully(0, 5):sync()
]], dir, "main.lua")
    assert.equal(0, st, out)
    assert.equal("hello main\nhello loop\n", out)
  end)

  it("decodes query arguments into req.args, and offers netrun.http.unescape", function()
    assert.equal("a b!c%2", netrun.http.unescape("a+b%21c%2"))
    assert.equal("A%zz%", netrun.http.unescape("%41%zz%"))
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("http", netrun.codec.http_server {})
        ch:pipeline():add_last("app", { channel_read = function(self, ctx, req)
          local a = req.args
          ctx:write_and_flush { status = 200, body = table.concat({ a.q, type(a.t), a.t[1], a.t[2],
            tostring(a.flag), tostring(req.args == a) }, "|") }
        end })
      end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    c:send("GET /x?q=hello+world%21&t=1&t=%32&flag&&=z HTTP/1.1\r\nHost: x\r\n\r\n")
    local status, _, body = H.read_response(c)
    assert.equal(200, status)
    assert.equal("hello world!|table|1|2|true|true", body)
    c:close()
    server:close():sync()
  end)
end)
