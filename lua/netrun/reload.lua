-- netrun.reload -- hot reload (DESIGN.md §8.5): SIGHUP, `netrun reload
-- CONSOLE_PATH` and :reload in the REPL re-require the changed Lua modules
-- in the main state and in every loop's state.
--
-- Which modules: those this state loaded from a Lua file through
-- package.path (the netrun.* modules excepted), whose file changed since
-- -- its mtime, size or inode differ from when the state loaded it. Each
-- state watches its own loads (watch(), from require "netrun"), so a
-- module that only loop states required is found there.
--
-- All or nothing, in two phases run as tasks on every state: stage loads
-- each changed module into a table of this reload's (package.loaded keeps
-- the old values, except that while staging, a changed module that
-- requires another one sees the new one); if any state failed -- a syntax
-- error, an error raised while loading -- every state drops what it
-- staged and the old code keeps serving; else every state swaps its
-- package.loaded entries and forgets its cached copies of server inits
-- and module names, so new channels resolve the new modules. Live
-- channels keep their pipelines, and the handler tables in them: their
-- old code serves them until they close.
local core = require "netrun.core"

local M = {}

local loaded_from = {}   -- module name -> { file = path, stamp = ... }
local order = {}         -- module names, in the order they were loaded
local staged = {}        -- reload id -> the modules staged for it

local function ours(name)
  return name == "netrun" or name:sub(1, 7) == "netrun."
end

function M._loaded(name, file, stamp, ...)
  if not loaded_from[name] then order[#order + 1] = name end
  loaded_from[name] = { file = file, stamp = stamp }
  return ...
end

-- Wrap the Lua file searcher of this state: a module loaded through it is
-- remembered with its file's stamp as it was before loading.
function M.watch()
  if M.watching then return end
  M.watching = true
  local searcher = package.searchers[2]
  package.searchers[2] = function(name)
    local loader, file = searcher(name)
    if type(loader) ~= "function" or ours(name) then return loader, file end
    local stamp = core.file_stamp(file)
    return function(...)
      return M._loaded(name, file, stamp, loader(...))
    end, file
  end
end

local function state_name()
  local loop = core.current()
  return loop and loop:name() or "main"
end

local function changed()
  local list = {}
  for _, name in ipairs(order) do
    local rec = loaded_from[name]
    if package.loaded[name] ~= nil then
      local stamp = core.file_stamp(rec.file)
      if stamp ~= rec.stamp then
        list[#list + 1] = { name = name, file = rec.file, stamp = stamp }
      end
    end
  end
  return list
end

-- Phase one, in this state: load the changed modules aside. Returns
-- { ok = true, modules = { names } } or { ok = false, state, error = why }.
function M.stage(id)
  local list, saved, err = changed(), {}, nil
  for _, m in ipairs(list) do
    local chunk, e = loadfile(m.file)
    if not chunk then
      err = e
      break
    end
    local ok, v = pcall(chunk, m.name, m.file)
    if not ok then
      err = "module '" .. m.name .. "': " .. tostring(v)
      break
    end
    if v == nil then v = true end            -- what require stores
    saved[#saved + 1] = { name = m.name, old = package.loaded[m.name] }
    package.loaded[m.name] = v
    m.value = v
  end
  for i = #saved, 1, -1 do package.loaded[saved[i].name] = saved[i].old end
  if err then
    return { ok = false, state = state_name(), error = err }
  end
  staged[id] = list
  local names = {}
  for i, m in ipairs(list) do names[i] = m.name end
  return { ok = true, modules = names }
end

-- Phase two: swap in what was staged (commit) or drop it.
function M.finish(id, commit)
  local list = staged[id]
  staged[id] = nil
  if not commit or not list or #list == 0 then return 0 end
  for _, m in ipairs(list) do
    package.loaded[m.name] = m.value
    loaded_from[m.name] = { file = m.file, stamp = m.stamp }
  end
  core.forget_caches()
  return #list
end

local function stage_task(id) return require("netrun.reload").stage(id) end
local function finish_task(id, commit) return require("netrun.reload").finish(id, commit) end

-- Every state to reload: the main state and each started loop.
local function targets()
  local list = { core.main_loop() }
  for _, g in ipairs(core.groups()) do
    for _, l in ipairs(g:loops()) do
      if l:stats().state == "started" then list[#list + 1] = l end
    end
  end
  return list
end

local function submit_all(list, fn, ...)
  local futures = {}
  for _, t in ipairs(list) do
    local ok, f = pcall(t.submit, t, fn, ...)
    if ok then futures[#futures + 1] = f end  -- a loop ending meanwhile
  end
  return futures
end

local serial = 0

-- Reload now, from any state. Returns a future: its result is
-- { modules = { names reloaded, sorted }, states = n }; it fails with the
-- reasons when a module did not load (then nothing changed anywhere).
-- Logs the outcome either way.
function M.reload()
  local netrun = require "netrun"
  local done = netrun.promise()
  serial = serial + 1
  local id = string.format("%s/%d/%.6f", state_name(), serial, core.now())
  local list = targets()
  netrun.all(submit_all(list, stage_task, id)):add_listener(function(all)
    local errors, names, where = {}, {}, {}
    if not all:is_success() then
      errors[1] = tostring(all:cause())
    else
      for _, r in ipairs(all:result()) do
        if r.ok then
          for _, n in ipairs(r.modules) do names[n] = true end
        elseif where[r.error] then     -- the same failure in several states
          table.insert(where[r.error], r.state)
        else
          errors[#errors + 1] = r.error
          where[r.error] = { r.state }
        end
      end
      for i, e in ipairs(errors) do
        errors[i] = e .. " (in " .. table.concat(where[e], ", ") .. ")"
      end
    end
    local commit = #errors == 0
    netrun.all(submit_all(list, finish_task, id, commit)):add_listener(function()
      if not commit then
        local why = table.concat(errors, "\n")
        netrun.log.error("reload failed, the old code keeps serving: %s", why)
        done:try_failure(why)
        return
      end
      local sorted = {}
      for n in pairs(names) do sorted[#sorted + 1] = n end
      table.sort(sorted)
      netrun.log.info("reload: %s", #sorted == 0 and "no module changed"
        or ("reloaded " .. table.concat(sorted, ", ") .. " in " .. #list .. " states"))
      done:try_success({ modules = sorted, states = #list })
    end)
  end)
  return done
end

-- SIGHUP (bin/netrun.c, on the main thread): reload, logging the outcome.
function M.on_signal()
  M.reload()
end

-- The text :reload answers with: "reload ok: ..." or "reload failed: ...".
function M.describe(f)
  if not f:is_success() then return "reload failed: " .. tostring(f:cause()) end
  local r = f:result()
  if #r.modules == 0 then return "reload ok: no module changed" end
  return "reload ok: " .. table.concat(r.modules, ", ")
end

return M
