#!/usr/bin/env bash
# bench/pipeline_rss.sh -- server memory per client that pipelines requests
# and never reads an answer (bench/pipeline_hold.c): RSS before, after
# SECONDS of sending and once the server has settled (its CPU time still),
# and its peak, divided by the connections.
#   bench/pipeline_rss.sh [netrun|nginx] [N=1000] [SECONDS=5]
#   NETRUN=path/to/netrun   (default build/bin/netrun)
# netrun runs examples/http_hello.lua (prepared response, one thread);
# nginx one worker process answering `return 200 "Hello, World!"`,
# master_process off so that its RSS is the worker's.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
server=${1:-netrun} n=${2:-1000} secs=${3:-5}
source "$here/bench/lib.sh"
bench_init pipeline-rss
cc -O2 -o "$work/pipeline_hold" "$here/bench/pipeline_hold.c"
ulimit -n "$(ulimit -Hn)"
port=$((20000 + RANDOM % 12000))
case $server in
  netrun)
    "${NETRUN:-$here/build/bin/netrun}" "$here/examples/http_hello.lua" \
      --port "$port" --threads 1 >"$work/server.log" 2>&1 &
    ;;
  nginx)
    mkdir -p "$work/nginx/logs"
    cat > "$work/nginx/nginx.conf" <<CONF
master_process off;
daemon off;
worker_processes 1;
worker_rlimit_nofile 65536;
error_log stderr error;
pid nginx.pid;
events { worker_connections 65536; }
http {
  access_log off;
  keepalive_requests 100000000;
  server {
    listen 127.0.0.1:$port;
    location / { default_type text/plain; return 200 "Hello, World!"; }
  }
}
CONF
    nginx -p "$work/nginx" -c nginx.conf 2>"$work/server.log" &
    ;;
  *) echo "pipeline_rss: netrun or nginx, not $server" >&2; exit 2 ;;
esac
pid=$!
pids+=("$pid")
wait_port "$port"
sleep 0.5
rss() { awk '/VmRSS/ {print $2}' "/proc/$pid/status"; }
before=$(rss)
coproc HOLD { "$work/pipeline_hold" "$port" "$n" "$secs"; }
pids+=("$HOLD_PID")
read -r line <&"${HOLD[0]}"
read -r sent <&"${HOLD[0]}"
# The kernel's socket buffers hold much of what was sent: the server
# answers it until they are full both ways. Settled: its CPU time did not
# move for two seconds (120 s at most).
last=-1 still=0
for _ in $(seq 120); do
  t=$(ticks "$pid")
  if [[ $t == "$last" ]]; then still=$((still + 1)); else still=0; fi
  ((still < 2)) || break
  last=$t
  sleep 1
done
after=$(rss) peak=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
open=$(ls "/proc/$pid/fd" | wc -l)
per() { echo $(( ($1 - before) / n )); }
echo "$server: $line, $sent; RSS ${before} KiB -> ${after} KiB settled" \
     "($(per "$after") KiB per connection), peak ${peak} KiB ($(per "$peak") KiB per connection);" \
     "$open descriptors open"
exec {HOLD[1]}>&-
