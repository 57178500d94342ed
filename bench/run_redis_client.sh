#!/usr/bin/env bash
# bench/run_redis_client.sh -- netrun.redis as a client (DESIGN.md §9.8):
# pipelined GET/SET, operations per CLIENT CPU-second, against the same
# redis-server for three clients run side by side:
#   - redis-benchmark -P 16 -c CONNS -t set,get (C, hiredis's reader),
#   - netrun bench/redis_client.lua: CLIENTS coroutines on one loop, each
#     sending pipelines of 16 (SET and GET in turn) over a client of POOL
#     connections (POOLS lists the pool sizes to run),
#   - ioredis (bench/node/ioredis_load.js): CLIENTS async loops on one
#     ioredis client (its one connection), pipelines of 16.
# §7's method: redis-server pinned to CPU 0, the client to CPU 1; the
# client's user+system CPU time over the measured part (/proc/PID/stat for
# netrun, process.cpuUsage for Node, GNU time for redis-benchmark, whose
# whole run is the measured part, after a warm-up run of its own); keys
# from a space of KEYS, 3-byte values. RUNS rounds, each running every
# client once, in turn; medians. The machine may be shared: the load
# average is printed before and after, and the ratios (measured side by
# side) are the figures to read.
#
# Usage: bench/run_redis_client.sh          (3 rounds of 2 s + 10 s)
#        RUNS=1 DURATION=3 bench/run_redis_client.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${RUNS:-3}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
CONNS=${CONNS:-50}
CLIENTS=${CLIENTS:-50}
POOLS=${POOLS:-"1 4"}
KEYS=${KEYS:-100000}
build=$here/build/bench-redis-client
source "$here/bench/lib.sh"
bench_init redis-client

bash "$here/scripts/deps.sh" redis-server redis-tools util-linux procps time nodejs >/dev/null
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNETRUN_BENCH=OFF \
  -DNETRUN_ASAN=OFF -DNETRUN_TSAN=OFF >/dev/null
cmake --build "$build" -j2 --target netrun_bin netrun_core >/dev/null
[[ -d $here/bench/node/node_modules/ioredis ]] || (cd "$here/bench/node" && npm install --silent >/dev/null)

port=$((20000 + RANDOM % 12000))
taskset -c 0 redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
  --daemonize no > "$work/redis.log" 2>&1 &
pids+=($!)
wait_port "$port"

# One run of redis-benchmark: prints "ops cpu_seconds seconds".
rb() {   # $1 requests per test
  local out
  /usr/bin/time -f "%U %S %e" -o "$work/time" timeout 300 taskset -c 1 \
    redis-benchmark -p "$port" -c "$CONNS" -P 16 -t set,get -n "$1" -r "$KEYS" -d 3 -q \
    > "$work/rb.out" 2>&1 || { cat "$work/rb.out" >&2; exit 1; }
  awk -v n="$1" '{ printf "%d %.2f %.2f\n", 2 * n, $1 + $2, $3 }' "$work/time"
}

# netrun or ioredis: prints "ops cpu_seconds seconds" for the measured part.
nr() {   # $1 pool
  taskset -c 1 "$build/bin/netrun" "$here/bench/redis_client.lua" --port "$port" \
    --clients "$CLIENTS" --pipeline 16 --pool "$1" --seconds "$DURATION" \
    --warmup "$WARMUP" --keys "$KEYS" |
    awk -v hz="$hz" '/^ops/ { printf "%d %.2f %.2f\n", $2, $6 / hz, $4 }'
}
io() {
  taskset -c 1 node "$here/bench/node/ioredis_load.js" "$port" "$CLIENTS" 16 "$DURATION" \
    "$WARMUP" "$KEYS" 3 | awk '/^ops/ { printf "%d %.2f %.2f\n", $2, $6 / 100, $4 }'
}

median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
per() { awk '{ printf "%.0f\n", ($2 > 0 ? $1 / $2 : 0) }'; }
rate() { awk '{ printf "%.0f\n", ($3 > 0 ? $1 / $3 : 0) }'; }

echo "run_redis_client: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, RUNS=$RUNS" \
  "WARMUP=${WARMUP}s DURATION=${DURATION}s, redis-benchmark -c $CONNS, $CLIENTS coroutines/loops"
echo "run_redis_client: $(redis-server --version | cut -d' ' -f1-3), node $(node --version)," \
  "ioredis $(node -p 'require(process.argv[1]).version' "$here/bench/node/node_modules/ioredis/package.json")"
echo "run_redis_client: load before: $(uptime | sed 's/.*load average/load average/')"

# Size redis-benchmark's runs from a first one (so they last about DURATION).
read -r ops cpu secs < <(rb 200000)
n=$(awk -v o="$ops" -v s="$secs" -v d="$DURATION" 'BEGIN { n = int(o / s * d / 2); print (n < 100000 ? 100000 : n) }')

declare -A PER RATE
names=("redis-benchmark" "ioredis")
for p in $POOLS; do names+=("netrun-pool$p"); done
for _ in $(seq "$RUNS"); do
  rb 100000 >/dev/null                       # redis-benchmark's warm-up
  line=$(rb "$n"); echo "run_redis_client: redis-benchmark: $line (ops cpu_s s)" >&2
  PER[redis-benchmark]+="$(echo "$line" | per) "; RATE[redis-benchmark]+="$(echo "$line" | rate) "
  line=$(io); echo "run_redis_client: ioredis: $line" >&2
  PER[ioredis]+="$(echo "$line" | per) "; RATE[ioredis]+="$(echo "$line" | rate) "
  for p in $POOLS; do
    line=$(nr "$p"); echo "run_redis_client: netrun pool=$p: $line" >&2
    PER[netrun-pool$p]+="$(echo "$line" | per) "; RATE[netrun-pool$p]+="$(echo "$line" | rate) "
  done
done
echo "run_redis_client: load after: $(uptime | sed 's/.*load average/load average/')"

k() { awk -v a="$1" 'BEGIN { printf "%.0fk", a / 1000 }'; }
base=$(printf '%s\n' ${PER[redis-benchmark]} | median)
echo
echo "| client | ops per client CPU-s (median) | vs redis-benchmark -P 16 | ops/s |"
echo "|---|---:|---:|---:|"
for c in "${names[@]}"; do
  m=$(printf '%s\n' ${PER[$c]} | median)
  r=$(printf '%s\n' ${RATE[$c]} | median)
  echo "| $c | $(k "$m") | $(awk -v a="$m" -v b="$base" 'BEGIN { printf "%.2fx", a / b }') | $(k "$r") |"
done
