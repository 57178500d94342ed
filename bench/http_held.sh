#!/usr/bin/env bash
# bench/http_held.sh -- memory a netrun HTTP server spends on clients that
# pipeline requests behind a slow one and read nothing: the answers it
# holds until the slow one is answered (http_server.c, "answering in
# order"). CONNS raw clients each send GET /slow (answered after 30 s)
# and N GET /big (128 KiB answers, at once), then read nothing; the
# server's RSS growth per client is printed after 2 s.
#   bench/http_held.sh [N] [CONNS]      (defaults 400, 100)
#   NETRUN=path/to/netrun               (default build/bin/netrun)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
N=${1:-400} CONNS=${2:-100}
bin=${NETRUN:-$here/build/bin/netrun}
work=$(mktemp -d /tmp/netrun-held.XXXXXX)
pid=""
trap '[[ -z $pid ]] || kill $pid 2>/dev/null; rm -rf "$work"' EXIT
cat > "$work/app.lua" <<'LUA'
local netrun = require "netrun"
local App = {}
function App:channel_read(ctx, req)
  if req.path == "/slow" then
    ctx.channel:loop():schedule(30, function() ctx:write_and_flush { status = 200, body = "slow" } end)
  else
    ctx:write { status = 200, body = ("x"):rep(128 * 1024) }
  end
end
function App:channel_read_complete(ctx) ctx:flush() end
netrun.server { port = tonumber(netrun.option("port", "8099")), host = "127.0.0.1",
  init = function(ch)
    ch:pipeline():add_last("http", netrun.codec.http_server {})
    ch:pipeline():add_last("app", App)
  end }
LUA
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin" "$work/app.lua" --port "$port" --threads 1 >/dev/null 2>&1 & pid=$!
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
rss() { awk '/VmRSS/ {print $2}' /proc/$pid/status; }
r0=$(rss)
python3 - "$port" "$CONNS" "$N" <<'PY' &
import socket, sys, time
port, conns, n = map(int, sys.argv[1:4])
req = b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n" + b"GET /big HTTP/1.1\r\nHost: a\r\n\r\n" * n
socks = []
for _ in range(conns):
    s = socket.create_connection(("127.0.0.1", port)); s.setblocking(False)
    try: s.sendall(req)
    except BlockingIOError: pass
    socks.append(s)
time.sleep(4)
PY
cpid=$!
sleep 2.5
r1=$(rss)
echo "clients=$CONNS pipelined=$N rss_before=${r0}KiB rss_after=${r1}KiB per_client=$(( (r1 - r0) / CONNS ))KiB"
wait $cpid
