-- channel_spec.lua -- DESIGN.md §4 "Servers, clients, channels", against
-- LuaSocket on 127.0.0.1: addresses, writes from any thread, options,
-- attributes, close futures, channel groups and connect failures.
local H = require "spec.helper"
local netrun, socket = H.netrun, H.socket

-- A server whose init hands each accepted channel to the main thread
-- through `accepted` (a promise per connection, in order).
local function accepting_server(group, opts)
  local accepted = {}
  for i = 1, 8 do accepted[i] = netrun.promise() end
  local o = {
    group = group, host = "127.0.0.1", port = 0,
    init = function(ch)
      for _, p in ipairs(accepted) do
        if p:try_success(ch) then return end
      end
    end,
  }
  for k, v in pairs(opts or {}) do o[k] = v end
  local server = netrun.server(o):sync()
  local _, port = server:local_address()
  return server, port, accepted
end

describe("channels", function()
  local group
  setup(function() group = netrun.group { threads = 2, name = "chan" } end)
  teardown(function() H.shutdown(group) end)

  it("binds port 0 to an ephemeral port and reports both addresses", function()
    local server, port, accepted = accepting_server(group)
    local host
    host, port = server:local_address()
    assert.equal("127.0.0.1", host)
    assert.equal("integer", math.type(port))
    assert.is_true(port > 0)
    assert.is_true(server:is_open())
    assert.is_true(server:is_active())
    local c = H.client(port)
    local ch = accepted[1]:sync()
    local lh, lp = ch:local_address()
    local rh, rp = ch:remote_address()
    local ch_, cp = c:getsockname()
    assert.same({ "127.0.0.1", port }, { lh, lp })
    assert.same({ ch_, tonumber(cp) }, { rh, rp })
    assert.is_true(ch:is_open()); assert.is_true(ch:is_active()); assert.is_true(ch:is_writable())
    assert.equal("integer", math.type(ch:id()))
    assert.is_truthy(ch:loop():name():match("^chan%-%d$"))
    c:close()
    ch:close_future():sync()
    assert.is_false(ch:is_open()); assert.is_false(ch:is_active())
    server:close():sync()
    assert.is_false(server:is_open())
    assert.is_nil((socket.connect("127.0.0.1", port)))
  end)

  it("writes from another thread: write, flush, write_and_flush, arrays of strings", function()
    local server, port, accepted = accepting_server(group)
    local c = H.client(port)
    local ch = accepted[1]:sync()
    local w = ch:write("one,")
    ch:flush()
    assert.equal("one,", H.recv(c, 4))
    w:sync()
    assert.is_true(w:is_success())
    ch:write_and_flush({ "a", "bb", "ccc" }):sync()
    assert.equal("abbccc", H.recv(c, 6))
    local f1, f2 = ch:write("x"), ch:write("y")
    ch:write_and_flush(""):sync()
    assert.is_true(f1:is_success() and f2:is_success())
    assert.equal("xy", H.recv(c, 2))
    assert.has_error(function() ch:write({ "a", 1 }) end,
      "write: element 2 of the array is a number, not a string")
    -- and from another loop's thread
    local other
    for _, l in ipairs(group:loops()) do if l ~= ch:loop() then other = l end end
    local done = netrun.promise()
    other:execute(function(c2, d)
      c2:write_and_flush("from a loop"):add_listener(function(f) d:set_success(f:is_success()) end)
    end, ch, done)
    assert.equal("from a loop", H.recv(c, 11))
    assert.is_true(done:sync())
    -- close from another thread, then writes fail their future
    ch:close():sync()
    local data, err = c:receive(1)
    assert.is_nil(data); assert.equal("closed", err)
    local late = ch:write_and_flush("late")
    local ok, msg = pcall(late.sync, late)
    assert.is_false(ok)
    assert.matches("closed", msg)
    c:close()
    server:close():sync()
  end)

  it("writes on its own loop, from a handler", function()
    local server, port = H.echo_server(group, {
      channel_active = function(self, ctx)
        local f = ctx.channel:write_and_flush({ "hello ", "there\n" })
        f:add_listener(function(done) ctx.channel:attr("greeted", done:is_success()) end)
      end,
      channel_read = function(self, ctx, msg)
        ctx.channel:write_and_flush(tostring(ctx.channel:attr("greeted")) .. ":" .. msg)
      end,
    })
    local c = H.client(port)
    assert.equal("hello there", c:receive("*l"))
    c:send("q")                  -- one byte: one read, whatever the socket does
    assert.equal("true:q", H.recv(c, 6))
    c:close()
    server:close():sync()
  end)

  it("read() requests one read when auto_read is false", function()
    local server, port, accepted = accepting_server(group, { child_options = { auto_read = false } })
    local c = H.client(port)
    local ch = accepted[1]:sync()
    local seen = netrun.promise()
    ch:loop():submit(function(chan, s)
      assert(chan:option("auto_read") == false)
      local buf = ""                 -- a read may bring part of "data":
      chan:pipeline():add_last("r", {  -- the handler asks for the rest
        channel_read = function(self, ctx, msg)
          buf = buf .. msg
          if #buf < 4 then ctx:read() else s:try_success(buf) end
        end,
      })
    end, ch, seen):sync()
    c:send("data")
    ch:loop():submit(function() end):sync()
    assert.is_false(seen:is_done())
    ch:read()
    assert.equal("data", seen:sync())
    c:close()
    server:close():sync()
  end)

  it("gets and sets options on its loop, and names unknown ones", function()
    local server, port, accepted = accepting_server(group,
      { child_options = { tcp_nodelay = true, write_buffer_low = 1024, write_buffer_high = 4096 } })
    local c = H.client(port)
    local ch = accepted[1]:sync()
    local r = ch:loop():submit(function(chan)
      local before = chan:option("tcp_nodelay")
      chan:option("tcp_nodelay", false)
      local ok, err = pcall(chan.option, chan, "no_such_option")
      return { before, chan:option("tcp_nodelay"), chan:option("write_buffer_low"),
               chan:option("write_buffer_high"), chan:option("auto_read"), ok, err }
    end, ch):sync()
    assert.same({ true, false, 1024, 4096, true, false }, { table.unpack(r, 1, 6) })
    assert.matches("unknown channel option 'no_such_option'", r[7])
    assert.has_error(function() ch:option("tcp_nodelay") end)   -- not on its loop
    assert.has_error(function()
      netrun.server { group = group, port = 0, child_options = { write_buffer_low = 10, write_buffer_high = 5 } }
    end, "netrun.server: child_options.write_buffer_low (10) is above child_options.write_buffer_high (5)")
    assert.has_error(function() netrun.server { group = group, port = 70000 } end,
      "netrun.server: port must be an integer from 0 to 65535, got 70000")
    c:close()
    server:close():sync()
  end)

  it("turns unwritable above write_buffer_high and back below write_buffer_low", function()
    local changes = { netrun.promise(), netrun.promise() }
    local server, port, accepted = accepting_server(group, {
      child_options = { write_buffer_low = 16384, write_buffer_high = 65536, sndbuf = 4096 },
    })
    local c = H.client(port)
    local ch = accepted[1]:sync()
    ch:loop():submit(function(chan, cs)
      chan:pipeline():add_last("w", {
        channel_writability_changed = function(self, ctx)
          for _, p in ipairs(cs) do
            if p:try_success(ctx.channel:is_writable()) then return end
          end
        end,
      })
    end, ch, changes):sync()
    local chunk = string.rep("x", 65536)
    local total = 0
    for _ = 1, 32 do                         -- at most 2 MiB, the peer not reading
      ch:write(chunk)
      total = total + #chunk
    end
    local last = ch:write_and_flush("end")
    total = total + 3
    assert.is_false(H.sync(changes[1], 5))   -- unwritable while the peer does not read
    assert.is_false(ch:is_writable())
    H.recv(c, total)                          -- the peer reads it all
    assert.is_true(H.sync(changes[2], 5))
    last:sync()
    assert.is_true(ch:is_writable())
    c:close()
    server:close():sync()
  end)

  it("keeps per-channel attributes in the loop state until the channel closes", function()
    local server, port, accepted = accepting_server(group)
    local c = H.client(port)
    local ch = accepted[1]:sync()
    local r = ch:loop():submit(function(chan)
      local none = chan:attr("k")
      chan:attr("k", { n = 1 })
      chan:attr("k").n = 2
      chan:attr(1, "by integer")
      return { none, chan:attr("k").n, chan:attr(1) }
    end, ch):sync()
    assert.same({ nil, 2, "by integer" }, { r[1], r[2], r[3] })
    assert.has_error(function() ch:attr("k") end)               -- not on its loop
    c:close()
    ch:close_future():sync()
    assert.is_nil(ch:loop():submit(function(chan) return chan:attr("k") end, ch):sync())
  end)

  -- A server on g whose channels each get make() as their only handler;
  -- returns it and its port.
  local function serving(g, make)
    local server = netrun.server {
      group = g, host = "127.0.0.1", port = 0,
      init = function(ch) ch:pipeline():add_last("h", make()) end,
    }:sync()
    return server, select(2, server:local_address())
  end

  -- The chat room's "* alice left": what channel_read set is still there
  -- when the channel goes, in every event of its close, whoever closes it.
  -- The bytes of a line, gathered in an attribute too (a read may bring
  -- part of one); the line, when it ends.
  local function line_of(ctx, msg)
    local got = (ctx.channel:attr("got") or "") .. msg
    ctx.channel:attr("got", got)
    return got:match("^(.*)\n$")
  end

  local Nick = {}
  function Nick:channel_read(ctx, msg)
    local line = line_of(ctx, msg)
    if not line then return end
    ctx.channel:attr("nick", line:match("^(%w+)"))
    ctx:write_and_flush("ok\n")
    if line:match("bye") then ctx:close() end
  end
  function Nick:channel_inactive(ctx)
    self.seen.inactive = ctx.channel:attr("nick")
    ctx:fire_channel_inactive()
  end
  function Nick:channel_unregistered(ctx)
    self.seen.unregistered = ctx.channel:attr("nick")
  end
  function Nick:handler_removed(ctx)
    self.seen.removed = ctx.channel:attr("nick")
    local ch, done = ctx.channel, self.done
    ctx:loop():execute(function()        -- after the close: dropped
      self.seen.after = ch:attr("nick") or "dropped"
      done:set_success(self.seen)
    end)
  end

  for _, who in ipairs { "peer", "handler" } do
    it("keeps attributes readable through channel_inactive, channel_unregistered and handler_removed, "
      .. "then drops them (closed by the " .. who .. ")", function()
      local done = netrun.promise()
      local server, port = serving(group, function()
        return setmetatable({ seen = {}, done = done }, { __index = Nick })
      end)
      local c = H.client(port)
      c:send(who == "peer" and "alice\n" or "alice says bye\n")
      assert.equal("ok", c:receive("*l"))
      if who == "peer" then c:close() end
      assert.same({ inactive = "alice", unregistered = "alice", removed = "alice", after = "dropped" },
        H.sync(done))
      c:close()
      server:close():sync()
    end)
  end

  it("drops the attributes of a channel whose channel_inactive raises", function()
    local done = netrun.promise()
    local server, port = serving(group, function() return {
      channel_read = function(_, ctx, msg)
        local line = line_of(ctx, msg)
        if not line then return end
        ctx.channel:attr("nick", line)
        ctx:write_and_flush("ok\n")
      end,
      channel_inactive = function(_, ctx)
        local nick, chan = ctx.channel:attr("nick"), ctx.channel
        ctx:loop():execute(function() done:set_success { nick, chan:attr("nick") or "dropped" } end)
        error("inactive raised for " .. nick)
      end,
    } end)
    local c = H.client(port)
    c:send("carol\n")
    assert.equal("ok", c:receive("*l"))
    c:close()
    assert.same({ "carol", "dropped" }, H.sync(done))
    server:close():sync()
  end)

  it("holds no attributes of closed channels: a state's memory comes back", function()
    local g = netrun.group { threads = 1, name = "attrs" }
    local server, port = serving(g, function() return {
      channel_read = function(_, ctx, msg)
        ctx.channel:attr("nick", msg .. string.rep("x", 1000))
        ctx.channel:attr("n", { msg })
        ctx:write_and_flush("ok")
      end,
    } end)
    local loop = g:loops()[1]
    local function memory()
      return loop:submit(function() collectgarbage() collectgarbage() return collectgarbage("count") end):sync()
    end
    local function round(n)
      for i = 1, n do
        local c = H.client(port)
        c:send("user" .. i)
        assert.equal("ok", H.recv(c, 2))
        c:close()
      end
      H.eventually(function() return loop:stats().channels == 1 end)  -- the server's
    end
    round(50)
    local before = memory()
    round(500)
    local after = memory()
    assert.is_true(after - before < 64, string.format("%.0f KiB more after 500 connections", after - before))
    server:close():sync()
    H.shutdown(g)
  end)

  it("close_future completes when the peer closes; close is idempotent", function()
    local server, port, accepted = accepting_server(group)
    local c = H.client(port)
    local ch = accepted[1]:sync()
    local cf = ch:close_future()
    assert.is_false(cf:is_done())
    c:close()
    cf:sync()
    assert.is_true(cf:is_done())
    ch:close():sync()                -- closing a closed channel is fine
    server:close():sync()
    server:close():sync()
  end)

  it("connects to a netrun server, with init on the client's loop", function()
    local server, port = H.echo_server(group)
    local got = netrun.promise()
    local ch = netrun.connect {
      group = group, host = "127.0.0.1", port = port, timeout = 5,
      init = function(c)
        local buf = ""               -- a stream: "ping" may come in pieces
        c:pipeline():add_last("client", {
          channel_read = function(self, ctx, msg)
            buf = buf .. msg
            if #buf >= 4 then got:try_success(buf) end
          end,
        })
      end,
    }:sync()
    assert.is_true(ch:is_active())
    local _, rp = ch:remote_address()
    assert.equal(port, rp)
    ch:write_and_flush("ping"):sync()
    assert.equal("ping", got:sync())
    ch:close():sync()
    server:close():sync()
  end)

  it("fails connect to a closed port naming ECONNREFUSED", function()
    local s = assert(socket.bind("127.0.0.1", 0))
    local _, port = s:getsockname()
    s:close()
    local f = netrun.connect { group = group, host = "127.0.0.1", port = tonumber(port), timeout = 5 }
    local ok, err = pcall(f.sync, f)
    assert.is_false(ok)
    assert.matches("ECONNREFUSED", err)
    assert.matches("ECONNREFUSED", f:cause())
  end)

  it("times out a connect to a listener whose accept queue is full", function()
    -- A LuaSocket listener with backlog 1 that never accepts: once its
    -- queue is full the kernel drops further SYNs, so a connect hangs.
    local l = assert(socket.tcp())
    assert(l:bind("127.0.0.1", 0))
    assert(l:listen(1))
    local _, port = l:getsockname()
    port = tonumber(port)
    local fillers = {}
    local timed_out
    for i = 1, 8 do      -- bounded: the queue holds backlog + 1 on Linux
      local f = netrun.connect { group = group, host = "127.0.0.1", port = port, timeout = 0.3 }
      local ok, err = pcall(f.sync, f)
      if ok then
        fillers[#fillers + 1] = err
      else
        timed_out = err
        break
      end
      assert.is_true(i < 8, "the accept queue never filled")
    end
    assert.is_string(timed_out)
    assert.matches("connect timed out after 0.3 s", timed_out)
    for _, ch in ipairs(fillers) do ch:close():sync() end
    l:close()
  end)

  it("serves and connects over a unix socket", function()
    local dir = H.tmpdir()
    local path = dir .. "/s.sock"
    local server = netrun.server {
      group = group, unix = path,
      init = function(ch)
        ch:pipeline():add_last("echo", {
          channel_read = function(self, ctx, msg) ctx:write_and_flush(msg:upper()) end,
        })
      end,
    }:sync()
    local got = netrun.promise()
    local ch = netrun.connect {
      group = group, unix = path,
      init = function(c)
        local buf = ""                 -- a stream: "HI" may come in pieces
        c:pipeline():add_last("r", { channel_read = function(self, ctx, msg)
          buf = buf .. msg
          if #buf >= 2 then got:try_success(buf) end
        end })
      end,
    }:sync()
    ch:write_and_flush("hi")
    assert.equal("HI", got:sync())
    ch:close():sync()
    server:close():sync()
    os.remove(path)
    os.remove(dir)
  end)

  it("replaces only a stale socket at a unix path, and unlinks only its own", function()
    local dir = H.tmpdir()
    local path = dir .. "/s.sock"
    local function slurp(p)
      local f = io.open(p)
      if not f then return nil end
      local s = f:read("a")
      f:close()
      return s
    end
    local function serve()
      return pcall(function()
        return netrun.server { group = group, unix = path, init = function() end }:sync()
      end)
    end
    -- a regular file: connect(2) to it fails with ECONNREFUSED, as to a
    -- stale socket, but it is nobody's socket: left alone, the bind fails
    local f = assert(io.open(path, "w")); f:write("precious"); f:close()
    local ok, err = serve()
    assert.is_false(ok)
    assert.matches("s.sock: exists and is not a socket; not replaced", tostring(err))
    assert.equal("precious", slurp(path))
    os.remove(path)
    -- a stale socket (its listener closed without unlinking) is replaced
    local unix = require "socket.unix"
    local stale = assert(unix())
    assert(stale:bind(path))
    stale:close()
    assert.equal("socket\n", H.run("stat -c %F " .. path))
    local server
    ok, server = serve()
    assert.is_true(ok, tostring(server))
    -- a live one is not: the second server fails, the first still serves
    local ok2, err2 = serve()
    assert.is_false(ok2)
    assert.matches("EADDRINUSE", tostring(err2))
    local c = assert(unix())
    assert(c:connect(path))
    c:close()
    -- whatever replaced the socket file by close time is not ours to unlink
    f = assert(io.open(dir .. "/other", "w")); f:write("mine"); f:close()
    assert(os.rename(dir .. "/other", path))
    server:close():sync()
    assert.equal("mine", slurp(path))
    os.execute("rm -rf " .. dir)
  end)

  it("creates a unix socket with the mode asked for", function()
    local dir = H.tmpdir()
    local path = dir .. "/m.sock"
    local server = netrun.server { group = group, unix = path, mode = tonumber("600", 8),
                                   init = function() end }:sync()
    assert.equal("600\n", (H.run("stat -c %a " .. path)))   -- less the umask
    server:close():sync()
    assert.is_nil(io.open(path))                 -- its own socket is unlinked at close
    assert.has_error(function() netrun.server { group = group, unix = path, mode = -1 } end,
      'netrun.server: mode must be a file mode from 0 to 0777 (e.g. tonumber("600", 8)), got -1')
    os.execute("rm -rf " .. dir)
  end)

  it("sends and receives datagrams", function()
    local got = netrun.promise()
    local udp = netrun.udp {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("dgram", {
          channel_read = function(self, ctx, d)
            got:try_success({ d.data, d.host, math.type(d.port) })
            ctx:write_and_flush({ data = "pong:" .. d.data, host = d.host, port = d.port })
          end,
        })
      end,
    }:sync()
    local host, port = udp:local_address()
    assert.equal("127.0.0.1", host)
    local u = assert(socket.udp())
    u:settimeout(5)
    assert(u:setsockname("127.0.0.1", 0))
    assert(u:sendto("ping", "127.0.0.1", port))
    assert.same({ "ping", "127.0.0.1", "integer" }, got:sync())
    assert.equal("pong:ping", (u:receivefrom()))
    -- and from another thread, a datagram to the LuaSocket peer
    local _, uport = u:getsockname()
    udp:write_and_flush({ data = "from main", host = "127.0.0.1", port = tonumber(uport) }):sync()
    assert.equal("from main", (u:receivefrom()))
    u:close()
    udp:close():sync()
  end)
end)

describe("channel groups", function()
  local group
  setup(function() group = netrun.group { threads = 2, name = "cg" } end)
  teardown(function() H.shutdown(group) end)

  it("add, remove, #, write_and_flush, close, and closed channels leave", function()
    local server, port, accepted = accepting_server(group)
    local members = netrun.channel_group()
    assert.equal(0, #members)
    local clients, chans = {}, {}
    for i = 1, 3 do
      clients[i] = H.client(port)
      chans[i] = accepted[i]:sync()
      assert.is_true(members:add(chans[i]))
    end
    assert.is_false(members:add(chans[1]))       -- already a member
    assert.equal(3, #members)
    assert.matches("netrun.channel_group%(3 channels%)", tostring(members))
    members:write_and_flush({ "al", "l\n" }):sync()
    assert.has_error(function() members:write_and_flush({ "x", {} }) end,
      "write_and_flush: element 2 of the array is a table, not a string")
    for i = 1, 3 do assert.equal("all", clients[i]:receive("*l")) end
    assert.is_true(members:remove(chans[3]))
    assert.is_false(members:remove(chans[3]))
    assert.equal(2, #members)
    members:write_and_flush("two\n"):sync()
    assert.equal("two", clients[1]:receive("*l"))
    assert.equal("two", clients[2]:receive("*l"))
    clients[3]:settimeout(0.05)
    assert.is_nil((clients[3]:receive("*l")))
    -- a channel whose peer closes leaves by itself
    clients[2]:close()
    chans[2]:close_future():sync()
    local deadline = socket.gettime() + 5
    while #members ~= 1 and socket.gettime() < deadline do
      group:loops()[1]:submit(function() end):sync()
    end
    assert.equal(1, #members)
    -- the group can be used from a loop too (it is a handle)
    assert.equal(1, group:submit(function(m) return #m end, members):sync())
    members:close():sync()
    assert.equal(0, #members)
    local data, err = clients[1]:receive("*l")
    assert.is_nil(data); assert.equal("closed", err)
    clients[1]:close(); clients[3]:close()
    server:close():sync()
  end)
end)
