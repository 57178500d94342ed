#!/usr/bin/env bash
# run_proxy_body.sh -- 1 MiB bodies through a reverse proxy (issue 30, DESIGN.md
# §7's method): examples/proxy.lua (bodies streamed, the default; and
# --body whole) against nginx proxy_pass with its default buffering
# (proxy_buffering and proxy_request_buffering on, upstream keep-alive, one
# worker; its config below). The backend is another nginx (GET /1m: a
# 1 MiB file; POST /up: the body read and discarded, "ok"). Each proxy is
# pinned to CPU 0; wrk (-t1 -c16, keep-alive) and the backend share CPU 1.
# The figure is MiB of body per proxy CPU-second (utime+stime from
# /proc/PID/stat, nginx master+worker summed), median of RUNS after a 2 s
# warm-up, the proxies taking turns run by run.
#   bash bench/run_proxy_body.sh [DURATION_S] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-8}
RUNS=${2:-3}
bash scripts/deps.sh wrk nginx
source bench/lib.sh
bench_init proxy-body
cmake -S . -B build/http-bench -DCMAKE_BUILD_TYPE=Release -DNETRUN_BENCH=OFF >/dev/null
cmake --build build/http-bench -j2 --target netrun_bin >/dev/null
BACKEND=18390 NGINX=18391 STREAM=18392 WHOLE=18393
mkdir -p "$work/back/logs" "$work/back/www" "$work/front/logs"
head -c 1048576 /dev/urandom > "$work/back/www/1m"
chmod 755 "$work" "$work/back" "$work/back/www"; chmod 644 "$work/back/www/1m"   # (nginx's worker: nobody)
cat > "$work/back/nginx.conf" <<CONF
worker_processes 1; daemon off; error_log stderr error; pid nginx.pid;
events { worker_connections 4096; }
http {
  access_log off; keepalive_requests 100000000; client_max_body_size 0;
  server {
    listen 127.0.0.1:$BACKEND;
    location = /1m { root $work/back/www; }
    location = /up { client_body_buffer_size 2m; return 200 "ok\n"; }
  }
}
CONF
# the peer: proxy_pass with nginx's default buffering both ways
cat > "$work/front/nginx.conf" <<CONF
worker_processes 1; daemon off; error_log stderr error; pid nginx.pid;
events { worker_connections 4096; }
http {
  access_log off; keepalive_requests 100000000; client_max_body_size 0;
  upstream backend { server 127.0.0.1:$BACKEND; keepalive 64; keepalive_requests 100000000; }
  server {
    listen 127.0.0.1:$NGINX;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
CONF
cat > "$work/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = string.rep("x", 1048576)
wrk.headers["Content-Type"] = "application/octet-stream"
LUA
taskset -c 1 nginx -p "$work/back" -c nginx.conf 2>/dev/null &
pids+=($!)
taskset -c 0 nginx -p "$work/front" -c nginx.conf 2>/dev/null &
npid=$!; pids+=($npid)
taskset -c 0 build/http-bench/bin/netrun examples/proxy.lua --port $STREAM --threads 1 \
  --backend 127.0.0.1:$BACKEND --max-body 0 >/dev/null 2>&1 &
spid=$!; pids+=($spid)
taskset -c 0 build/http-bench/bin/netrun examples/proxy.lua --port $WHOLE --threads 1 \
  --backend 127.0.0.1:$BACKEND --body whole >/dev/null 2>&1 &
wpid=$!; pids+=($wpid)
for p in $BACKEND $NGINX $STREAM $WHOLE; do
  for _ in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null && break; sleep 0.05; done
done
npids() { echo "$npid $(pgrep -P "$npid" | head -1)"; }   # master + worker

one() {   # PORT PATH EXTRA_WRK_ARGS PIDS...: "MiB_per_cpu_s MiB_s"
  local port=$1 path=$2 extra=$3; shift 3
  local t0 t1 out
  t0=$(ticks "$@")
  out=$(taskset -c 1 wrk -t1 -c16 -d"${DUR}"s $extra "http://127.0.0.1:$port$path")
  t1=$(ticks "$@")
  awk -v t=$((t1 - t0)) -v hz="$hz" -v d="$DUR" '
    /requests in/ { r = $1 } /Non-2xx/ { bad = $NF }
    END { printf "%.0f %.0f %d\n", (t > 0 ? r / (t / hz) : 0), r / d, bad }' <<<"$out"
}
median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

declare -A res
for kind in download upload; do
  if [[ $kind == download ]]; then path=/1m extra=""; else path=/up extra="-s $work/post.lua"; fi
  for p in "nginx:$NGINX" "stream:$STREAM" "whole:$WHOLE"; do   # warm-up
    taskset -c 1 wrk -t1 -c16 -d2s $extra "http://127.0.0.1:${p#*:}$path" >/dev/null
  done
  for r in $(seq "$RUNS"); do
    res[$kind.nginx]+="$(one $NGINX $path "$extra" $(npids))"$'\n'
    res[$kind.stream]+="$(one $STREAM $path "$extra" $spid)"$'\n'
    res[$kind.whole]+="$(one $WHOLE $path "$extra" $wpid)"$'\n'
  done
done
echo "| 1 MiB bodies | proxy | MiB per proxy CPU-second | MiB/s | non-2xx |"
echo "|---|---|---:|---:|---:|"
for kind in download upload; do
  for p in nginx stream whole; do
    per=$(printf '%s' "${res[$kind.$p]}" | awk 'NF { print $1 }' | median)
    rate=$(printf '%s' "${res[$kind.$p]}" | awk 'NF { print $2 }' | median)
    bad=$(printf '%s' "${res[$kind.$p]}" | awk 'NF { s += $3 } END { print s + 0 }')
    name=$([[ $p == nginx ]] && echo "nginx proxy_pass (default buffering)" || echo "proxy.lua --body $p")
    echo "| $kind | $name | $per | $rate | $bad |"
  done
done
