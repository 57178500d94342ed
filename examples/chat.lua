-- chat.lua -- a line-based chat room: every line a client sends goes to
-- every other client. Try it with two `nc 127.0.0.1 7001` sessions.
--   netrun examples/chat.lua [--port N]     (or PORT=N)
-- The members live in a channel group, shared by every loop; a member
-- leaves it by itself when its connection closes.
local netrun = require "netrun"

local option = netrun.option

local members = netrun.channel_group()

-- Splits the byte stream into lines; one instance per channel (made in
-- init), since it keeps what is left of the last line.
local Lines = {}
Lines.__index = Lines
function Lines.new() return setmetatable({ rest = "" }, Lines) end
function Lines:channel_read(ctx, msg)
  local data = self.rest .. msg
  for line in data:gmatch("([^\n]*)\n") do
    ctx:fire_channel_read((line:gsub("\r$", "")))
  end
  self.rest = data:match("[^\n]*$")
  if #self.rest > 4096 then
    ctx:write_and_flush("line too long\n")
    ctx:close()
  end
end

local Chat = {}
function Chat:channel_active(ctx)
  local _, port = ctx.channel:remote_address()
  members:write_and_flush(string.format("* user %d joined\n", port))
  members:add(ctx.channel)
  ctx:write_and_flush(string.format("welcome, user %d; %d here\n", port, #members))
end
function Chat:channel_read(ctx, line)
  local _, port = ctx.channel:remote_address()
  members:write_and_flush(string.format("<user %d> %s\n", port, line))
end
function Chat:channel_inactive(ctx)
  members:write_and_flush("* a user left\n")
end
function Chat:exception_caught(ctx, err)
  -- a peer that resets its connection is routine, not a warning
  local reset = tostring(err):find("ECONNRESET") or tostring(err):find("EPIPE")
  netrun.log[reset and "debug" or "warn"]("%s", err)
  ctx:close()
end

local server = netrun.server {
  group = netrun.group { threads = option("threads", 2), name = "chat" },
  host = option("host", "127.0.0.1"), port = option("port", 7001),
  init = function(ch)
    ch:pipeline():add_last("lines", Lines.new())
    ch:pipeline():add_last("chat", Chat)
  end,
}:sync()
netrun.log.info("chat room on %s:%d", server:local_address())
