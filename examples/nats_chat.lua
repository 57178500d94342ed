-- nats_chat.lua -- a line chat whose rooms are NATS subjects: run as many
-- of these as you like (one host or many, all pointed at one NATS server
-- or cluster) and they make one chat. A line a client sends reaches every
-- client in its room, whichever process it is connected to.
--   netrun examples/nats_chat.lua [--port 7002] [--nats nats://127.0.0.1:4222]
--                                 [--name chat] [--threads 1]
-- Try it: nats-server & two of these on ports 7002 and 7003, then
-- `nc 127.0.0.1 7002` and `nc 127.0.0.1 7003`.
-- Lines: "/nick NAME", "/join ROOM" (rooms: letters, digits, - and _;
-- the first is "lobby"), "/quit"; anything else is said in the room.
--
-- Each loop keeps one NATS connection and one subscription per room that
-- has members on it (chat.<room>); a line is published to chat.<room>
-- with a header naming the connection it came from, which is skipped
-- when the message comes back. A member whose connection does not take
-- its lines (unwritable: a client that stopped reading) misses lines
-- instead of making the process hold them.
local netrun = require "netrun"

local option = netrun.option
local url = option("nats", "nats://127.0.0.1:4222")
local name = option("name", "chat")

-- This loop's state: its NATS connection (a future, made by the first
-- client) and its rooms (room -> { sub, members = { [id] = member } }).
local function state()
  local st = package.loaded["nats_chat.state"]
  if st == nil then
    st = { rooms = {} }
    package.loaded["nats_chat.state"] = st
  end
  return st
end

-- The loop's connection, in the caller's coroutine: nc, or nil, err. The
-- first caller connects; the others wait for its promise.
local function nats()
  local st = state()
  if st.nc == nil then
    local p = netrun.promise()
    st.nc = p
    local nc, err = netrun.nats.connect { url = url, name = name, max_reconnects = -1 }
    if nc then p:try_success(nc) else st.nc = nil; p:try_failure(err) end
    return nc, err
  end
  local ok, nc = pcall(st.nc.await, st.nc)
  if not ok then return nil, nc end
  return nc
end

local function deliver(room, m)
  local from = m.headers and m.headers["Chat-From"]
  for id, member in pairs(room.members) do
    if id ~= from and member.ch:is_writable() then
      member.ch:write_and_flush(m.data .. "\n")
    end
  end
end

-- Put member in room (subscribing when it is the room's first here);
-- returns once the server has the subscription.
local function join(nc, member, room_name)
  local rooms = state().rooms
  local room = rooms[room_name]
  if room == nil then
    room = { members = {} }
    rooms[room_name] = room
    room.sub = nc:subscribe("chat." .. room_name, function(m) deliver(room, m) end)
    nc:flush()
  end
  room.members[member.id] = member
  member.room = room_name
  nc:publish("chat." .. room_name, "* " .. member.nick .. " joined", nil,
             { ["Chat-From"] = member.id })
end

local function leave(nc, member)
  local rooms = state().rooms
  local room = rooms[member.room]
  if room == nil then return end
  room.members[member.id] = nil
  nc:publish("chat." .. member.room, "* " .. member.nick .. " left", nil,
             { ["Chat-From"] = member.id })
  if next(room.members) == nil then
    room.sub:unsubscribe()
    rooms[member.room] = nil
  end
end

local function serve(s)
  local nc, err = nats()
  if not nc then
    s:send("ERR no NATS server: " .. tostring(err) .. "\n")
    return
  end
  local ch = s:channel()
  local _, port = ch:remote_address()
  local member = { id = name .. "/" .. ch:id(), nick = "user" .. tostring(port), ch = ch }
  join(nc, member, "lobby")
  s:send("welcome, " .. member.nick .. ", to lobby on " .. name .. "\n")
  while true do
    local line = s:receive("*l")
    if line == nil or line == "/quit" then break end
    local cmd, arg = line:match("^/(%a+)%s*(.-)%s*$")
    if cmd == "nick" and arg:match("^[%w_-]+$") then
      member.nick = arg
      s:send("* you are " .. arg .. "\n")
    elseif cmd == "join" and arg:match("^[%w_-]+$") then
      leave(nc, member)
      join(nc, member, arg)
      s:send("* you are in " .. arg .. "\n")
    elseif cmd then
      s:send("* usage: /nick NAME | /join ROOM | /quit\n")
    elseif line ~= "" then
      local ok, perr = nc:publish("chat." .. member.room, member.nick .. ": " .. line, nil,
                                  { ["Chat-From"] = member.id })
      if not ok then s:send("* not sent: " .. perr .. "\n") end
    end
  end
  leave(nc, member)
end

local server = netrun.server {
  group = netrun.group { threads = option("threads", 1), name = "chat" },
  host = option("host", "127.0.0.1"), port = option("port", 7002),
  stream = serve,
}:sync()
local host, port = server:local_address()
netrun.log.info("%s: chat on %s:%d, rooms on %s", name, host, port, url)
