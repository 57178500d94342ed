-- readme_spec.lua -- the README's code as a new user meets it: every
-- ```lua block of README.md and of docs/**/*.md compiles; the blocks
-- marked <!-- run --> run for real, each in a second netrun process (in a
-- network namespace of its own when the system allows one, so the fixed
-- ports the README shows collide with nothing), bounded in time, and
-- print what the README shows after them; the commands of README's first
-- code block and the examples it names exist.
--
-- Markers, an HTML comment on the line right before a block's fence
-- (invisible on the rendered page):
--   <!-- fragment -->     a piece shown alone (a table, `...` placeholders,
--                         a signature): not compiled
--   <!-- run -->          run as a script: it must exit 0 in time
--   <!-- run server -->   a server: run until the next ```sh block marked
--                         <!-- run client --> (run beside it, in the same
--                         namespace, retried until the server answers)
--                         has printed; then SIGTERM, and it must exit 0
--   <!-- output -->       the next block (any language) is what the run
--                         block or client before it prints on stdout
-- After `run` (or `run server`): `certs` runs it in a directory holding the
-- test certificates of spec/fixtures/tls/make_certs.sh; `flags: F` passes
-- F to netrun before the script, `args: A` after it (last in the comment).
-- Blocks run with the build's netrun first on PATH, as `netrun`.
local H = require "spec.helper"

local ROOT = H.root
local BIN = H.BIN
local SLOW = H.sanitized and 5 or 1      -- ASan/TSan run netrun 5-10x slower

-- ---- collecting the blocks ------------------------------------------------

local function markdown_files()
  local files = { "README.md" }
  local f = assert(io.popen("cd " .. ROOT .. " && find docs -name '*.md' 2>/dev/null | sort"))
  for path in f:lines() do files[#files + 1] = path end
  f:close()
  return files
end

-- Every fenced block of a Markdown file: { file, line (of its first code
-- line), lang, code (its indentation taken off), marker (the comment on
-- the line before its fence, or nil) }.
local function blocks_of(file)
  local fh = assert(io.open(ROOT .. "/" .. file))
  local lines = {}
  for l in fh:lines() do lines[#lines + 1] = l end
  fh:close()
  local out, i = {}, 1
  while i <= #lines do
    local indent, fence, lang = lines[i]:match("^(%s*)(```+)%s*([%w_+-]*)%s*$")
    if indent then
      local start, body = i, {}
      i = i + 1
      while i <= #lines and not lines[i]:match("^%s*" .. fence .. "%s*$") do
        local l = lines[i]
        if l:sub(1, #indent) == indent then l = l:sub(#indent + 1) end
        body[#body + 1] = l
        i = i + 1
      end
      local prev = start > 1 and lines[start - 1] or ""
      out[#out + 1] = {
        file = file, line = start + 1, lang = lang, code = table.concat(body, "\n"),
        marker = prev:match("^%s*<!%-%-%s*(.-)%s*%-%->%s*$"),
      }
    end
    i = i + 1
  end
  return out
end

local ALL = {}
for _, file in ipairs(markdown_files()) do
  for _, b in ipairs(blocks_of(file)) do ALL[#ALL + 1] = b end
end

local function where(b) return b.file .. ":" .. b.line end

-- The block marked <!-- output --> right after block number i (the next
-- block), or nil.
local function output_after(i)
  local nb = ALL[i + 1]
  return nb and nb.marker == "output" and nb.code .. "\n" or nil
end

-- ---- running ----------------------------------------------------------------

-- Whether this system gives an unprivileged network namespace with a
-- loopback (unshare -rn, util-linux), where fixed ports are private.
local NETNS = os.execute("unshare -rn sh -c 'ip link set lo up' >/dev/null 2>&1") == true

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

local certs_dir
local function certs()
  if not certs_dir then
    certs_dir = H.tmpdir()
    assert(H.run("bash " .. ROOT .. "/spec/fixtures/tls/make_certs.sh " .. certs_dir))
  end
  return certs_dir
end

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- Run a shell script in a fresh directory (in its own network namespace
-- when there is one), bounded by `seconds`; returns stdout, stderr, status.
local function sandboxed(script, seconds, dir)
  dir = dir or H.tmpdir()
  write(dir .. "/run.sh", "set -u\ncd " .. shell_quote(dir) .. "\n" ..
    (NETNS and "ip link set lo up\n" or "") .. script)
  local cmd = string.format("timeout -k 2 %d %s sh %s/run.sh > %s/stdout 2> %s/stderr; echo $?",
    math.ceil(seconds * SLOW), NETNS and "unshare -rn" or "", dir, dir, dir)
  local f = assert(io.popen(cmd))
  local status = tonumber(f:read("a"))
  f:close()
  return H.read_file(dir .. "/stdout"), H.read_file(dir .. "/stderr"), status
end

local function script_dir(b)
  local dir = H.tmpdir()
  if b.marker and b.marker:find("certs", 1, true) then
    assert(os.execute(string.format("cp %s/* %s/", certs(), dir)))
  end
  write(dir .. "/block.lua", b.code .. "\n")
  return dir
end

local function realpath(path)
  local f = assert(io.popen("realpath " .. path))
  local abs = f:read("l")
  f:close()
  return assert(abs, path .. ": no such file")
end
local BINDIR = realpath(BIN:match("^(.*)/[^/]*$") or ".")
local ENV = "PATH=" .. shell_quote(BINDIR) .. ":$PATH; export PATH; NETRUN_LOG=warn NETRUN_SHUTDOWN_TIMEOUT=5 "

-- netrun [flags] block.lua [args], as the marker asks.
local function command(b)
  local m = b.marker
  local flags = m:match("flags:%s*(.-)%s*args:") or m:match("flags:%s*(.-)%s*$") or ""
  local args = m:match("args:%s*(.-)%s*$") or ""
  return "netrun " .. flags .. " block.lua " .. args
end

-- A script: it must end by itself with status 0.
local function run_script(b)
  local dir = script_dir(b)
  return sandboxed(ENV .. command(b) .. "\n", 10, dir)
end

-- A server and its client (an sh block): the client is retried (20 ms
-- apart, 5 s at most) until it exits 0, then the server is stopped.
local function run_server(b, client)
  local dir = script_dir(b)
  local script = "SLOW=" .. SLOW .. "\n" .. ENV .. command(b) .. " > server.out 2> server.err &\n" .. [[
pid=$!
i=0
until sh client.sh > client.out 2> client.err; do
  i=$((i + 1))
  if [ $i -ge $((250 * SLOW)) ] || ! kill -0 $pid 2>/dev/null; then echo "the client never succeeded" >&2; cat client.err server.err >&2; kill -KILL $pid; exit 1; fi
  sleep 0.02
done
kill -TERM $pid
wait $pid; st=$?
cat client.out
cat server.err >&2
exit $st
]]
  write(dir .. "/client.sh", "set -e\n" .. client.code .. "\n")
  return sandboxed(script, 15, dir)
end

-- ---- the specs -------------------------------------------------------------

describe("README and docs code", function()
  it("every lua block compiles (fragments are marked <!-- fragment -->)", function()
    local bad, compiled, fragments = {}, 0, 0
    for _, b in ipairs(ALL) do
      if b.lang == "lua" then
        if b.marker == "fragment" then
          fragments = fragments + 1
        else
          -- Padded so that an error names the file's own line.
          local ok, err = load(string.rep("\n", b.line - 1) .. b.code, "@" .. b.file, "t")
          if ok then compiled = compiled + 1
          else bad[#bad + 1] = where(b) .. " (block): " .. err end
        end
      end
    end
    assert.is_true(#bad == 0, "blocks that do not compile:\n" .. table.concat(bad, "\n"))
    assert.is_true(compiled >= 15, "only " .. compiled .. " blocks found")
    print(string.format("readme_spec: %d lua blocks compiled, %d fragments", compiled, fragments))
  end)

  it("markers name what the spec knows", function()
    for i, b in ipairs(ALL) do
      local m = b.marker
      if m and (m == "fragment" or m == "output" or m:match("^run")) then
        if m:match("^run") and m ~= "run client" then
          assert.equal("lua", b.lang, where(b) .. ": a run block is lua")
        end
        if m == "run client" then
          assert.matches("^run server", ALL[i - 1] and ALL[i - 1].marker or "", nil, nil, where(b) ..
            ": a client follows a server block")
        end
      end
    end
  end)

  local ran = 0
  for i, b in ipairs(ALL) do
    local m = b.marker or ""
    if b.lang == "lua" and m:match("^run") then
      local server = m:find("server", 1, true)
      it("runs " .. where(b) .. (server and " (a server, with its client)" or ""), function()
        local expected, out, err, status
        if server then
          local client = ALL[i + 1]
          assert(client and client.marker == "run client", where(b) .. ": no <!-- run client --> block after it")
          expected = output_after(i + 1)
          out, err, status = run_server(b, client)
        else
          expected = output_after(i)
          out, err, status = run_script(b)
        end
        assert.equal(0, status, where(b) .. " exited " .. tostring(status) .. ":\n" .. err .. out)
        if expected then
          assert.equal(expected, out, where(b) .. ": output differs from the README's")
        end
        ran = ran + 1
      end)
    end
  end
  it("ran the blocks marked to run", function()
    print(string.format("readme_spec: %d blocks run%s", ran, NETNS and " (in network namespaces)" or ""))
    assert.is_true(ran >= 8, ran .. " blocks run")
  end)

  it("the commands of README's first code block and the examples README and docs/guide name exist", function()
    local first
    for _, b in ipairs(ALL) do
      if b.file == "README.md" then first = b break end
    end
    assert.equal("sh", first.lang)
    local n = 0
    for cmd in (first.code:gsub("&&", "\n") .. "\n"):gmatch("%s*([^\n]-)%s*\n") do
      if cmd ~= "" and not cmd:match("^#") then
        local words = {}
        for w in cmd:gmatch("%S+") do words[#words + 1] = w end
        local prog = words[1]
        if prog:match("^build/") then          -- made by the build: this build's
          assert.is_true(io.open(BINDIR .. "/" .. prog:match("[^/]+$")) ~= nil, prog)
        elseif prog:find("/", 1, true) then
          assert.is_true(io.open(ROOT .. "/" .. prog) ~= nil, prog .. " is missing")
        else
          assert.is_true(os.execute("command -v " .. prog .. " > /dev/null"), prog .. " is not installed")
        end
        for i = 2, #words do                   -- files of the tree it names
          local w = words[i]
          if w:match("^[%w_.-]+/[%w_./-]+%.%w+$") then
            assert.is_true(io.open(ROOT .. "/" .. w) ~= nil, cmd .. ": " .. w .. " is missing")
          end
        end
        n = n + 1
      end
    end
    assert.is_true(n >= 5, n .. " commands")
    -- The examples README.md and the guide (docs/guide/) name.
    local parts = {}
    for _, file in ipairs(markdown_files()) do
      if file == "README.md" or file:match("^docs/guide/") then
        local fh = assert(io.open(ROOT .. "/" .. file))
        parts[#parts + 1] = fh:read("a")
        fh:close()
      end
    end
    local text = table.concat(parts, "\n")
    local seen, n = {}, 0
    for path in text:gmatch("examples/([%w_]+%.lua)") do
      if not seen[path] then
        seen[path], n = true, n + 1
        assert.is_true(io.open(ROOT .. "/examples/" .. path) ~= nil, "README or docs/guide names examples/" .. path .. ", missing")
      end
    end
    assert.is_true(n >= 10, n .. " examples named")
  end)
end)
