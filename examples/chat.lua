-- chat.lua -- a line-based chat room: every line a client sends goes to
-- every other client. Try it with two `nc 127.0.0.1 7001` sessions.
--   netrun examples/chat.lua [--port N]     (or PORT=N)
-- The members live in a channel group, shared by every loop; a member
-- leaves it by itself when its connection closes. "/nick NAME" renames.
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

-- Each member's name is a channel attribute: "user PORT" until it says
-- "/nick NAME". Attributes stay readable through channel_inactive, so the
-- room hears who left.
local Chat = {}
function Chat:channel_active(ctx)
  local _, port = ctx.channel:remote_address()
  local nick = "user " .. port
  ctx.channel:attr("nick", nick)
  members:write_and_flush(string.format("* %s joined\n", nick))
  members:add(ctx.channel)
  ctx:write_and_flush(string.format("welcome, %s; %d here (/nick NAME to rename)\n", nick, #members))
end
function Chat:channel_read(ctx, line)
  local nick = ctx.channel:attr("nick")
  local new = line:match("^/nick%s+(%S+)%s*$")
  if new then
    ctx.channel:attr("nick", new:sub(1, 32))
    members:write_and_flush(string.format("* %s is now %s\n", nick, new:sub(1, 32)))
  else
    members:write_and_flush(string.format("<%s> %s\n", nick, line))
  end
end
function Chat:channel_inactive(ctx)
  members:write_and_flush(string.format("* %s left\n", ctx.channel:attr("nick")))
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
