#!/usr/bin/env bash
# run_proxy.sh -- the reverse proxy benchmark (DESIGN.md §8.6): netrun
# (examples/proxy.lua, one worker loop) against nginx proxy_pass with
# upstream keep-alive (1 worker), both in front of the same backend (the C
# epoll baseline, bench/http_baseline.c). Each proxy is pinned to CPU 0;
# wrk (-t1 -c64, keep-alive) and the backend share CPU 1. The figure is
# requests per proxy CPU-second (utime+stime from /proc/PID/stat, nginx
# master+worker summed), median of RUNS after a 2 s warm-up, the proxies
# taking turns run by run. Prints a markdown table.
#   bash bench/run_proxy.sh [DURATION_S] [RUNS]
#   PROXY_ARGS="--body whole" bash bench/run_proxy.sh ...   (proxy.lua's flags)
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-10}
RUNS=${2:-3}
CONNS=64
bash scripts/deps.sh wrk nginx

source bench/lib.sh
bench_init proxy

cmake -S . -B build/http-bench -DCMAKE_BUILD_TYPE=Release -DNETRUN_BENCH=OFF >/dev/null
cmake --build build/http-bench -j2 --target netrun_bin >/dev/null
cc -O2 -o "$work/http_baseline" bench/http_baseline.c

BACKEND=18190
nginx_proxy_conf "$work/nginx" 18192 $BACKEND

one() {   # PORT PIDS...: "per_cpu_s req_s p99"
  local port=$1; shift
  local t0 t1 out
  t0=$(ticks "$@")
  out=$(taskset -c 1 wrk -t1 -c$CONNS -d"${DUR}"s --latency "http://127.0.0.1:$port/")
  t1=$(ticks "$@")
  awk -v t=$((t1 - t0)) -v hz="$hz" '
    /requests in/ { r = $1 } /^Requests\/sec/ { rps = $2 } $1 == "99%" { p99 = $2 }
    END { printf "%d %s %s\n", (t > 0 ? r / (t / hz) : 0), rps, p99 }' <<<"$out"
}

taskset -c 1 "$work/http_baseline" $BACKEND 2>/dev/null &
pids+=($!)
wait_port $BACKEND
names=("netrun examples/proxy.lua" "nginx proxy_pass (upstream keepalive 64)")
ports=(18191 18192)
declare -A procs
taskset -c 0 build/http-bench/bin/netrun examples/proxy.lua --port 18191 --threads 1 \
  --backend 127.0.0.1:$BACKEND ${PROXY_ARGS:-} >/dev/null 2>&1 &
pids+=($!); procs[0]=$!
taskset -c 0 nginx -p "$work/nginx" -c nginx.conf 2>"$work/nginx/err.log" &
pids+=($!)
for p in "${ports[@]}"; do wait_port "$p"; done
procs[1]="${pids[-1]} $(pgrep -P "${pids[-1]}" | head -1)"

for p in "${ports[@]}"; do taskset -c 1 wrk -t1 -c$CONNS -d2s "http://127.0.0.1:$p/" >/dev/null; done
declare -A runs
for _ in $(seq "$RUNS"); do
  for i in "${!names[@]}"; do
    # shellcheck disable=SC2086
    runs[$i]+="$(one "${ports[$i]}" ${procs[$i]})"$'\n'
  done
done

echo
echo "HTTP reverse proxy, wrk -t1 -c$CONNS -d${DUR}s, median of $RUNS; $(date -u '+%F %H:%M UTC'); load: $(uptime | sed 's/.*load average: //')"
echo
echo "| proxy | req/s | p99 | req per proxy CPU-s | every run |"
echo "|---|---:|---:|---:|---|"
for i in "${!names[@]}"; do
  read -r per rps p99 <<<"$(printf '%s' "${runs[$i]}" | sort -n | sed -n "$(((RUNS + 1) / 2))p")"
  printf '| %s | %s | %s | %s | %s |\n' "${names[$i]}" "$rps" "$p99" "$per" \
    "$(printf '%s' "${runs[$i]}" | cut -d' ' -f1 | paste -sd' ')"
done
