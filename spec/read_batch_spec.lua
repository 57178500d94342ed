-- read_batch_spec.lua -- a Lua handler takes the messages of one read in
-- one protected call, at that read's channel_read_complete
-- (lpipeline_batch.c). What a handler sees must be what it saw when each
-- message was a call of its own: every message, in order; an error skips
-- only its own; a close stops the rest; a handler that leaves its pipeline
-- passes the rest on; interim and error answers of the HTTP codec keep
-- their place. Pipelined requests on raw connections make the batches.
local H = require "spec.helper"
local netrun = H.netrun

local read_response = H.read_response

local function pipelined(paths)
  local r = {}
  for i, p in ipairs(paths) do r[i] = "GET " .. p .. " HTTP/1.1\r\nHost: x\r\n\r\n" end
  return table.concat(r)
end

-- Serve `handlers` (name, table pairs, in order) behind the HTTP codec.
local function serve(group, ...)
  local hs = { ... }
  local server = netrun.server {
    group = group, host = "127.0.0.1", port = 0,
    init = function(ch)
      ch:pipeline():add_last("http", netrun.codec.http_server {})
      for i = 1, #hs, 2 do ch:pipeline():add_last(hs[i], hs[i + 1]) end
    end,
  }:sync()
  local _, port = server:local_address()
  return server, port
end

describe("read batches", function()
  local group
  setup(function() group = netrun.group { threads = 1, name = "batch" } end)
  teardown(function() H.shutdown(group) end)

  it("answer every pipelined request in order, more than a batch holds", function()
    local _, port = serve(group, "app", {
      channel_read = function(self, ctx, req) ctx:write { status = 200, body = req.path } end,
      channel_read_complete = function(self, ctx) ctx:flush() end,
    })
    local c = H.client(port)
    local paths = {}
    for i = 1, 70 do paths[i] = "/r" .. i end
    assert(c:send(pipelined(paths)))
    for i = 1, 70 do
      local status, _, body = read_response(c)
      assert.equal(200, status)
      assert.equal("/r" .. i, body)
    end
    c:close()
  end)

  it("skip only the request whose channel_read raised; it reaches exception_caught", function()
    local _, port = serve(group, "app", {
      channel_read = function(self, ctx, req)
        if req.path == "/boom" then error("boom at " .. req.path) end
        ctx:write { status = 200, body = req.path }
      end,
      channel_read_complete = function(self, ctx) ctx:flush() end,
      exception_caught = function(self, ctx, err)
        ctx:write { status = 500, body = (tostring(err):match("boom at %S+")) }
      end,
    })
    local c = H.client(port)
    assert(c:send(pipelined { "/a", "/boom", "/b", "/boom", "/c" }))
    local want = { { 200, "/a" }, { 500, "boom at /boom" }, { 200, "/b" },
                   { 500, "boom at /boom" }, { 200, "/c" } }
    for _, w in ipairs(want) do
      local status, _, body = read_response(c)
      assert.same(w, { status, body })
    end
    c:close()
  end)

  it("take pipelined RESP commands too: each answered in order, an error skipping only its own", function()
    local server = netrun.server {
      group = group, host = "127.0.0.1", port = 0,
      init = function(ch)
        ch:pipeline():add_last("resp", netrun.codec.resp {})
        ch:pipeline():add_last("app", {
          channel_read = function(self, ctx, cmd)
            if cmd[2] == "boom" then error("boom") end
            ctx:write("+" .. cmd[2] .. "\r\n")
          end,
          channel_read_complete = function(self, ctx) ctx:flush() end,
          exception_caught = function(self, ctx, err)
            ctx:write("-ERR " .. tostring(err):match("boom") .. "\r\n")
          end,
        })
      end,
    }:sync()
    local _, port = server:local_address()
    local c = H.client(port)
    local cmds, want = {}, {}
    for i = 1, 70 do                 -- more than a batch holds (32)
      local arg = i % 30 == 0 and "boom" or ("r" .. i)
      cmds[i] = "*2\r\n$4\r\nECHO\r\n$" .. #arg .. "\r\n" .. arg .. "\r\n"
      want[i] = arg == "boom" and "-ERR boom" or ("+" .. arg)
    end
    assert(c:send(table.concat(cmds)))
    for i = 1, 70 do assert.equal(want[i], c:receive("*l")) end
    c:close()
    server:close():sync()
  end)

  -- pending under the fault shim: pipelined behind a close (see H.faults)
  it("stop at a close: no channel_read after the response that closed", function()
    local d = netrun.shared.dict("read_batch_close")
    d:flush_all()
    local _, port = serve(group, "app", {
      channel_read = function(self, ctx, req)
        netrun.shared.dict("read_batch_close"):incr("reads", 1, 0)
        local close = req.path == "/last" and "close" or nil
        ctx:write { status = 200, body = req.path, headers = { connection = close } }
      end,
      channel_read_complete = function(self, ctx) ctx:flush() end,
      channel_inactive = function(self, ctx)
        netrun.shared.dict("read_batch_close"):set("inactive", true)
      end,
    })
    local c = H.client(port)
    assert(c:send(pipelined { "/1", "/last", "/3", "/4", "/5" }))
    assert.equal("/1", select(3, read_response(c)))
    local _, headers, body = read_response(c)
    assert.equal("/last", body)
    assert.equal("close", headers.connection)
    local rest, _, partial = c:receive("*a")   -- to the close
    assert.equal("", rest or partial)
    c:close()
    H.eventually(function() return d:get("inactive") end)
    assert.equal(2, d:get("reads"))
  end)

  it("pass the rest on when the handler leaves its pipeline mid-batch", function()
    local _, port = serve(group,
      "first", {
        channel_read = function(self, ctx, req)
          ctx:write { status = 200, body = "first " .. req.path }
          ctx.pipeline:remove("first")
        end,
        channel_read_complete = function(self, ctx) ctx:flush() end,
      },
      "second", {
        channel_read = function(self, ctx, req)
          ctx:write { status = 200, body = "second " .. req.path }
        end,
        channel_read_complete = function(self, ctx) ctx:flush() end,
      })
    local c = H.client(port)
    assert(c:send(pipelined { "/1", "/2", "/3" }))
    for _, want in ipairs { "first /1", "second /2", "second /3" } do
      assert.equal(want, select(3, read_response(c)))
    end
    c:close()
  end)

  it("send 100 Continue only after the responses owed before it", function()
    local _, port = serve(group, "app", {
      channel_read = function(self, ctx, req)
        ctx:write { status = 200, body = req.method .. " " .. req.path .. " " .. req.body }
      end,
      channel_read_complete = function(self, ctx) ctx:flush() end,
    })
    local c = H.client(port)
    assert(c:send("GET /first HTTP/1.1\r\nHost: x\r\n\r\n"
      .. "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"))
    assert.equal("GET /first ", select(3, read_response(c)))
    assert.equal("HTTP/1.1 100 Continue", c:receive("*l"))
    assert.equal("", c:receive("*l"))
    assert(c:send("hello"))
    assert.equal("POST /up hello", select(3, read_response(c)))
    c:close()
  end)

  it("reach a handler behind native ones, which see every event in order", function()
    local d = netrun.shared.dict("read_batch_idle")
    d:flush_all()
    local _, port = serve(group,
      "idle", netrun.handler.idle_state { reader = 30 },
      "app", {
        channel_read = function(self, ctx, req)
          netrun.shared.dict("read_batch_idle"):incr("reads", 1, 0)
          ctx:write { status = 200, body = req.path }
        end,
        channel_read_complete = function(self, ctx)
          netrun.shared.dict("read_batch_idle"):incr("completes", 1, 0)
          ctx:flush()
        end,
      })
    local c = H.client(port)
    assert(c:send(pipelined { "/1", "/2", "/3", "/4" }))
    for i = 1, 4 do assert.equal("/" .. i, select(3, read_response(c))) end
    c:close()
    assert.equal(4, d:get("reads"))
    assert.is_true(d:get("completes") >= 1)
  end)

  it("call channel_read_complete after the read's messages, its error to exception_caught", function()
    local d = netrun.shared.dict("read_batch_complete")
    d:flush_all()
    local server, port = H.echo_server(group, {
      channel_read = function(self, ctx, msg)
        local dict = netrun.shared.dict("read_batch_complete")
        dict:set("log", (dict:get("log") or "") .. "read;")
        ctx:write(msg)
      end,
      channel_read_complete = function(self, ctx)
        local dict = netrun.shared.dict("read_batch_complete")
        dict:set("log", (dict:get("log") or "") .. "complete;")
        ctx:flush()
        error("after the flush")
      end,
      exception_caught = function(self, ctx, err)
        local dict = netrun.shared.dict("read_batch_complete")
        dict:set("log", (dict:get("log") or "") .. "caught " .. tostring(err):match("after the flush") .. ";")
      end,
    })
    local c = H.client(port)
    assert(c:send("p"))             -- one byte: one read, however TCP splits
    assert.equal("p", H.recv(c, 1))
    H.eventually(function() return (d:get("log") or ""):find("caught") end)
    assert.equal("read;complete;caught after the flush;", d:get("log"))
    c:close()
    server:close():sync()
  end)

  it("stop answering when the channel turns unwritable mid-batch, then answer the rest in order", function()
    local N, BIG = 64, string.rep("x", 1 << 20)    -- 64 answers of 1 MiB to one read
    local server, port = serve(group, "app", {
      channel_read = function(self, ctx, req)
        _G.unread_ch = ctx.channel
        _G.unread_n = (_G.unread_n or 0) + 1
        ctx:write { status = 200, headers = { ["x-n"] = req.path:sub(2) }, body = BIG }
      end,
      channel_read_complete = function(self, ctx) ctx:flush() end,
    })
    local loop = group:next()
    loop:submit(function() _G.unread_n = 0 end):sync()
    local paths = {}
    for i = 1, N do paths[i] = "/" .. i end
    local c = H.client(port)
    assert(c:send(pipelined(paths)))
    -- Once the kernel's buffers are full, the channel stays unwritable
    -- and no more is answered: a few MiB, not a batch of 32 (or 64).
    local n = H.stalled(loop, function()
      local ch = _G.unread_ch
      if ch and not ch:is_writable() then return _G.unread_n end
    end)
    assert.is_truthy(n)
    assert.is_true(n < 16, "answered " .. n .. " of " .. N .. " to a client that reads nothing")
    -- reading drains it: the held requests are answered, every one in order
    for i = 1, N do
      local status, headers, body = read_response(c)
      assert.equal(200, status)
      assert.equal(tostring(i), headers["x-n"])
      assert.equal(#BIG, #body)
    end
    assert.equal(N, loop:submit(function() return _G.unread_n end):sync())
    c:close()
    server:close():sync()
  end)
end)
