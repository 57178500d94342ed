#!/usr/bin/env bash
# bench/run_redis.sh -- the RESP benchmark table (DESIGN.md §7): netrun
# examples/redis.lua (one worker loop) against redis-server (no
# persistence), both pinned to CPU 0, redis-benchmark pinned to CPU 1,
# 50 connections, without pipelining and with -P 16.
#
# For each server, mode and test (ping_inline, ping_mbulk, set, get) and
# each of RUNS runs: start the server, run a warm-up of about WARMUP s
# (its rate sizes the measured run), then a measured run of about DURATION
# s, reading the server's user+system CPU time from /proc/PID/stat (fields
# 14+15) before and after it. Prints a markdown table of medians:
# requests/s, p99, requests per server CPU-second, and the ratios of netrun
# to redis-server. Every redis-benchmark call is bounded by `timeout`.
#
# Usage: bench/run_redis.sh            (3 runs of 2 s + 10 s: about 12 minutes)
#        RUNS=1 DURATION=3 bench/run_redis.sh        (a quick look)
#        MODES=p16 TESTS="get" bench/run_redis.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${RUNS:-3}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
MODES=${MODES:-"p1 p16"}
TESTS=${TESTS:-"ping_inline ping_mbulk set get"}
SERVERS="redis netrun"
CONNS=${CONNS:-50}
build=$here/build/bench-resp

bash "$here/scripts/deps.sh" redis-server redis-tools util-linux procps >/dev/null
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNETRUN_BENCH=OFF \
  -DNETRUN_ASAN=OFF -DNETRUN_TSAN=OFF >/dev/null
cmake --build "$build" -j2 --target netrun_bin >/dev/null
tck=$(getconf CLK_TCK)

pipeline() { case $1 in p1) echo 1 ;; p16) echo 16 ;; *) echo "unknown mode $1" >&2; exit 2 ;; esac; }

spid=""
cleanup() { if [[ -n $spid ]]; then kill "$spid" 2>/dev/null || true; wait "$spid" 2>/dev/null || true; fi; }
trap cleanup EXIT

start_server() {   # $1 server, $2 port
  local log=/tmp/run_redis.$$.log
  case $1 in
    redis) taskset -c 0 redis-server --port "$2" --bind 127.0.0.1 --save '' \
             --appendonly no --daemonize no >"$log" 2>&1 & ;;
    netrun) taskset -c 0 "$build/bin/netrun" "$here/examples/redis.lua" --port "$2" \
              --threads 1 >"$log" 2>&1 & ;;
  esac
  spid=$!
  for _ in $(seq 100); do
    if timeout 2 redis-cli -p "$2" PING 2>/dev/null | grep -q PONG; then return; fi
    sleep 0.05
  done
  echo "run_redis: $1 did not start:" >&2; cat "$log" >&2; exit 1
}

stop_server() { kill -TERM "$spid"; wait "$spid" 2>/dev/null || true; spid=""; rm -f /tmp/run_redis.$$.log; }

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# redis-benchmark's CSV row for one test: prints "rps p99_ms".
bench() {   # $1 port, $2 test, $3 requests, $4 pipeline
  local out
  out=$(timeout 120 taskset -c 1 redis-benchmark -p "$1" -c "$CONNS" -t "$2" -n "$3" \
        -P "$4" --csv 2>/dev/null) || { echo "run_redis: redis-benchmark failed or timed out" >&2; exit 1; }
  echo "$out" | awk -F'"' 'NR == 2 { print $4, $14 }'
}

# One run: sets R_RATE, R_P99, R_PER.
run_one() {   # $1 server, $2 mode, $3 test
  local port=$((20000 + RANDOM % 12000)) p   # below the ephemeral range (32768-)
  p=$(pipeline "$2")
  start_server "$1" "$port"
  local wn=$((p == 1 ? 20000 : 200000)) rate
  read -r rate _ < <(bench "$port" "$3" "$wn" "$p")
  local n
  n=$(awk -v r="$rate" -v d="$DURATION" 'BEGIN { n = int(r * d); if (n < 1000) n = 1000; printf "%d", n }')
  # The warm-up's own length follows from its count; top it up to WARMUP s.
  local extra
  extra=$(awk -v r="$rate" -v w="$WARMUP" -v wn="$wn" 'BEGIN { e = int(r * w - wn); printf "%d", (e > 0 ? e : 0) }')
  if ((extra > 0)); then bench "$port" "$3" "$extra" "$p" >/dev/null; fi
  local c0 c1
  c0=$(cpu_ticks "$spid")
  read -r R_RATE R_P99 < <(bench "$port" "$3" "$n" "$p")
  c1=$(cpu_ticks "$spid")
  R_PER=$(awk -v n="$n" -v c=$((c1 - c0)) -v t="$tck" 'BEGIN { printf "%.0f", (c > 0 ? n / (c / t) : 0) }')
  stop_server
}

median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

echo "run_redis: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, RUNS=$RUNS WARMUP=${WARMUP}s DURATION=${DURATION}s, $CONNS connections"
echo "run_redis: $(redis-server --version | cut -d' ' -f1-3), redis-benchmark $(redis-benchmark --version | cut -d' ' -f2)"
echo "run_redis: load before: $(uptime | sed 's/.*load average/load average/')"
declare -A RATE P99 PER
for m in $MODES; do
  for t in $TESTS; do
    for s in $SERVERS; do
      rates=() p99s=() pers=()
      for _ in $(seq "$RUNS"); do
        run_one "$s" "$m" "$t"
        rates+=("$R_RATE") p99s+=("$R_P99") pers+=("$R_PER")
        echo "run_redis: $m $t $s: $R_RATE req/s, p99 $R_P99 ms, $R_PER req per server CPU-s" >&2
      done
      RATE[$m.$t.$s]=$(printf '%s\n' "${rates[@]}" | median)
      P99[$m.$t.$s]=$(printf '%s\n' "${p99s[@]}" | median)
      PER[$m.$t.$s]=$(printf '%s\n' "${pers[@]}" | median)
    done
  done
done
echo "run_redis: load after: $(uptime | sed 's/.*load average/load average/')"

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f%%", (b > 0 ? 100 * a / b : 0) }'; }
k() { awk -v a="$1" 'BEGIN { printf "%.1fk", a / 1000 }'; }

echo
echo "| mode | test | redis-server req/s | netrun req/s | ratio | redis-server req/CPU-s | netrun req/CPU-s | ratio | p99 redis / netrun (ms) |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
for m in $MODES; do
  for t in $TESTS; do
    r=${RATE[$m.$t.redis]} n=${RATE[$m.$t.netrun]}
    rc=${PER[$m.$t.redis]} nc=${PER[$m.$t.netrun]}
    label=$([[ $m == p1 ]] && echo "no pipelining" || echo "-P 16")
    echo "| $label | $t | $(k "$r") | $(k "$n") | $(ratio "$n" "$r") | $(k "$rc") | $(k "$nc") | $(ratio "$nc" "$rc") | ${P99[$m.$t.redis]} / ${P99[$m.$t.netrun]} |"
  done
done
