#!/usr/bin/env bash
# run_http.sh -- the HTTP hello benchmark (DESIGN.md §7): netrun
# (examples/http_hello.lua, one worker loop, Lua handler behind the native
# codec; also with --response table and --response dynamic), nginx + Lua
# (1 worker, content_by_lua_block), the C epoll baseline
# (bench/http_baseline.c) and a naive luv server (bench/luv_http.lua:
# counts request ends, writes a fixed response), each pinned to CPU 0, under
# `taskset -c 1 wrk -t1 -c64 -d10s --latency` after a 2 s warm-up, keep-alive
# and 16 pipelined requests per write; median of 3 runs by requests per
# server CPU-second (utime+stime from /proc/PID/stat, nginx master+worker
# summed), the servers taking turns run by run. Prints a markdown table.
#   bash bench/run_http.sh [DURATION_S] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-10}
RUNS=${2:-3}
CONNS=64
bash scripts/deps.sh wrk nginx libnginx-mod-http-lua lua-luv

source bench/lib.sh
bench_init http

# Builds: netrun optimised in its own directory, the baseline with cc -O2.
cmake -S . -B build/http-bench -DCMAKE_BUILD_TYPE=Release -DNETRUN_BENCH=OFF >/dev/null
cmake --build build/http-bench -j2 --target netrun_bin >/dev/null
cc -O2 -o "$work/http_baseline" bench/http_baseline.c

cat > "$work/pipeline.lua" <<'EOF'
-- 16 requests per write; wrk counts each response.
init = function(args)
  local r = {}
  for i = 1, 16 do r[i] = wrk.format(nil, "/") end
  req = table.concat(r)
end
request = function() return req end
EOF

mkdir -p "$work/nginx/logs"
cat > "$work/nginx/nginx.conf" <<'EOF'
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
worker_processes 1;
daemon off;
error_log stderr error;
pid nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  lua_code_cache on;
  keepalive_requests 100000000;
  server {
    listen 127.0.0.1:PORT reuseport;
    location / {
      default_type text/plain;
      content_by_lua_block { ngx.print("Hello, World!") }
    }
  }
}
EOF

# one MODE PORT PIDS...: one run; prints "per_cpu_s req_s p99".
one() {
  local mode=$1 port=$2; shift 2
  local script=() t0 t1 out reqs rps p99
  [[ $mode == pipelined ]] && script=(-s "$work/pipeline.lua")
  t0=$(ticks "$@")
  out=$(taskset -c 1 wrk -t1 -c$CONNS -d${DUR}s --latency "${script[@]}" "http://127.0.0.1:$port/")
  t1=$(ticks "$@")
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
  awk -v r="$reqs" -v t=$((t1 - t0)) -v hz="$hz" -v rps="$rps" -v p99="$p99" \
    'BEGIN { printf "%d %s %s\n", (t > 0 ? r / (t / hz) : 0), rps, p99 }'
}

warm() {   # MODE PORT
  local script=()
  [[ $1 == pipelined ]] && script=(-s "$work/pipeline.lua")
  taskset -c 1 wrk -t1 -c$CONNS -d2s "${script[@]}" "http://127.0.0.1:$2/" >/dev/null
}

# Every server runs at once, idle but for the one under load; the runs go
# round by round through the servers, so a slow spell of this shared VM
# (its speed drifts by 10-20 % over minutes) falls on all of them alike.
names=("C epoll baseline" "netrun http_hello.lua" "netrun http_hello.lua --response table"
       "nginx + Lua" "luv (naive)" "netrun http_hello.lua --response dynamic")
ports=(18181 18182 18184 18183 18185 18186)
declare -A procs
taskset -c 0 "$work/http_baseline" 18181 2>/dev/null &
pids+=($!); procs[0]=$!
taskset -c 0 build/http-bench/bin/netrun examples/http_hello.lua --port 18182 --threads 1 \
  >/dev/null 2>&1 &
pids+=($!); procs[1]=$!
taskset -c 0 build/http-bench/bin/netrun examples/http_hello.lua --port 18184 --threads 1 \
  --response table >/dev/null 2>&1 &
pids+=($!); procs[2]=$!
taskset -c 0 build/http-bench/bin/netrun examples/http_hello.lua --port 18186 --threads 1 \
  --response dynamic >/dev/null 2>&1 &
pids+=($!); procs[5]=$!      # (started before nginx: its pids are looked up below)
sed -i "s/PORT/18183/" "$work/nginx/nginx.conf"
taskset -c 0 nginx -p "$work/nginx" -c nginx.conf 2>"$work/nginx/err.log" &
pids+=($!)
taskset -c 0 lua5.4 bench/luv_http.lua 18185 2>/dev/null &
pids+=($!); procs[4]=$!
for p in "${ports[@]}"; do wait_port "$p"; done
procs[3]="${pids[-2]} $(pgrep -P "${pids[-2]}" | head -1)"   # master and worker

declare -A row runs every
for mode in keepalive pipelined; do
  for i in "${!names[@]}"; do warm "$mode" "${ports[$i]}"; done
  for _ in $(seq "$RUNS"); do
    for i in "${!names[@]}"; do
      # shellcheck disable=SC2086
      runs[$i]+="$(one "$mode" "${ports[$i]}" ${procs[$i]})"$'\n'
    done
  done
  for i in "${!names[@]}"; do
    row[${names[$i]},$mode]=$(printf '%s' "${runs[$i]}" | sort -n | sed -n "$(((RUNS + 1) / 2))p")
    every[${names[$i]},$mode]=$(printf '%s' "${runs[$i]}" | cut -d' ' -f1 | paste -sd' ')
    runs[$i]=""
  done
done

base_ka=$(cut -d' ' -f1 <<<"${row[C epoll baseline,keepalive]}")
base_pl=$(cut -d' ' -f1 <<<"${row[C epoll baseline,pipelined]}")
echo
echo "HTTP hello, wrk -t1 -c$CONNS -d${DUR}s, median of $RUNS; $(date -u '+%F %H:%M UTC'); load: $(uptime | sed 's/.*load average: //')"
echo
echo "| server | workload | req/s | p99 | req per server CPU-s | vs C baseline |"
echo "|---|---|---:|---:|---:|---:|"
for name in "${names[@]}"; do
  for mode in keepalive pipelined; do
    read -r per rps p99 <<<"${row[$name,$mode]}"
    base=$base_ka; [[ $mode == pipelined ]] && base=$base_pl
    label="keep-alive"; [[ $mode == pipelined ]] && label="16 pipelined"
    printf '| %s | %s | %s | %s | %s | %s |\n' "$name" "$label" "$rps" "$p99" "$per" \
      "$(awk -v a="$per" -v b="$base" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')"
  done
done
echo
echo "Every run, requests per server CPU-second, in order:"
for name in "${names[@]}"; do
  for mode in keepalive pipelined; do
    echo "- $name, $mode: ${every[$name,$mode]}"
  done
done
