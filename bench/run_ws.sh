#!/usr/bin/env bash
# run_ws.sh -- the WebSocket echo benchmark (DESIGN.md §8.6): 64 B text
# messages, one in flight per connection (ping-pong), 64 connections, from
# bench/ws_load.c pinned to CPU 1, against netrun examples/ws_echo.lua (one
# worker loop) and Node's `ws` (bench/node/ws_echo.js, npm-installed into
# bench/node/node_modules here), each pinned to CPU 0; a 2 s warm-up, then
# DURATION s runs, median of RUNS by messages per server CPU-second
# (utime+stime from /proc/PID/stat), the servers taking turns run by run.
# Prints a markdown table.
#   bash bench/run_ws.sh [DURATION_S] [RUNS] [CONNS]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-10}
RUNS=${2:-3}
CONNS=${3:-64}

source bench/lib.sh
bench_init ws

cmake -S . -B build/ws-bench -DCMAKE_BUILD_TYPE=Release -DNETRUN_BENCH=OFF >/dev/null
cmake --build build/ws-bench -j2 --target netrun_bin >/dev/null
cc -O2 -o "$work/ws_load" bench/ws_load.c
if [[ ! -d bench/node/node_modules/ws ]]; then
  npm ci --silent --no-audit --no-fund --prefix bench/node >/dev/null  # ws pinned by bench/node/package-lock.json
fi

# one PORT PID SECONDS: prints "per_cpu_s msgs_s p99_us".
one() {
  local port=$1 pid=$2 secs=$3 t0 t1 out
  t0=$(ticks "$pid")
  out=$(taskset -c 1 "$work/ws_load" "$port" "$CONNS" "$secs" 64)
  t1=$(ticks "$pid")
  awk -v t=$((t1 - t0)) -v hz="$hz" -v out="$out" 'BEGIN {
    split(out, f, /[ =]/); m = f[2]; rate = f[6]; p99 = f[8]
    printf "%d %s %s\n", (t > 0 ? m / (t / hz) : 0), rate, p99 }'
}

names=("netrun ws_echo.lua" "Node ws")
ports=(19281 19282)
taskset -c 0 build/ws-bench/bin/netrun examples/ws_echo.lua --port 19281 --threads 1 \
  >/dev/null 2>&1 &
pids+=($!)
taskset -c 0 node bench/node/ws_echo.js 19282 >/dev/null 2>&1 &
pids+=($!)
for i in 0 1; do wait_port "${ports[$i]}"; done
for i in 0 1; do one "${ports[$i]}" "${pids[$i]}" 2 >/dev/null; done   # warm-up

declare -A res
for r in $(seq "$RUNS"); do
  for i in 0 1; do
    res[$i,$r]=$(one "${ports[$i]}" "${pids[$i]}" "$DUR")
  done
done

echo "| server (64 B text echo, $CONNS conns, ping-pong) | msgs per server CPU-s | msgs/s | p99 µs |"
echo "|---|---:|---:|---:|"
for i in 0 1; do
  median=$(for r in $(seq "$RUNS"); do echo "${res[$i,$r]}"; done | sort -n | awk -v n="$RUNS" 'NR == int((n + 1) / 2)')
  read -r per rate p99 <<<"$median"
  echo "| ${names[$i]} | $per | $rate | $p99 |"
done
