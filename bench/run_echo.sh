#!/usr/bin/env bash
# bench/run_echo.sh -- the echo benchmark table (DESIGN.md §7).
#
# Builds build/bench (RelWithDebInfo, NETRUN_BENCH=ON), then for each server
#   epoll   bench/epoll_echo        the C epoll baseline
#   nr_c    bench/nr_echo           netrun, C echo handler, one loop
#   nr_lua  netrun examples/echo.lua   netrun, Lua echo handler, one worker loop
# and each workload
#   pp64     64 B ping-pong, 64 connections
#   pp256    the same with 256 connections
#   p16x64   64 B, 16 messages in flight per connection, 64 connections
#   p16x256  the same with 256 connections
# pins the server to CPU 0 and bench/echo_load to CPU 1, runs WARMUP s of
# warm-up and DURATION s measured, reads the server's CPU time from
# /proc/PID/stat over the measured window (echo_load -p), repeats RUNS
# times and prints a markdown table of medians: msgs/s, p99, msgs per
# server CPU-second, and the ratio to the baseline per CPU-second.
#
# Usage: bench/run_echo.sh            (27 runs of 2 s + 10 s: about 8 minutes)
#        RUNS=1 DURATION=3 bench/run_echo.sh      (a quick look)
#        SERVERS="epoll nr_c" WORKLOADS=pp64 bench/run_echo.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${RUNS:-3}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
SERVERS=${SERVERS:-"epoll nr_c nr_lua"}
WORKLOADS=${WORKLOADS:-"pp64 pp256 p16x64 p16x256"}
build=$here/build/bench

bash "$here/scripts/deps.sh" util-linux procps >/dev/null   # taskset, uptime
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNETRUN_BENCH=ON \
  -DNETRUN_ASAN=OFF -DNETRUN_TSAN=OFF >/dev/null
cmake --build "$build" -j2 --target epoll_echo echo_load nr_echo netrun_bin >/dev/null

server_cmd() {   # $1 server, $2 port
  case $1 in
    epoll) echo "$build/bench/epoll_echo $2" ;;
    nr_c) echo "$build/bench/nr_echo $2" ;;
    nr_lua) echo "$build/bin/netrun $here/examples/echo.lua --port $2 --threads 1" ;;
    *) echo "unknown server $1" >&2; exit 2 ;;
  esac
}

load_args() {
  case $1 in
    pp64) echo "-c 64 -k 1 -s 64" ;;
    pp256) echo "-c 256 -k 1 -s 64" ;;
    p16x64) echo "-c 64 -k 16 -s 64" ;;
    p16x256) echo "-c 256 -k 16 -s 64" ;;
    *) echo "unknown workload $1" >&2; exit 2 ;;
  esac
}

describe() {
  case $1 in
    pp64) echo "64 B ping-pong, 64 conns" ;;
    pp256) echo "64 B ping-pong, 256 conns" ;;
    p16x64) echo "64 B, 16 in flight, 64 conns" ;;
    p16x256) echo "64 B, 16 in flight, 256 conns" ;;
  esac
}

spid=""
# SIGTERM (netrun shuts down gracefully), SIGKILL after 5 s at most.
stop_server() {
  [[ -n $spid ]] || return 0
  kill -TERM "$spid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$spid" 2>/dev/null || true
  wait "$spid" 2>/dev/null || true
  spid=""
}
trap stop_server EXIT

# One run, in this shell (so the EXIT trap can always kill the server):
# sets R_RATE, R_P99, R_PER.
start_server() {   # $1 server; sets spid and port, or returns 1
  port=$((20000 + RANDOM % 20000))
  # A port someone listens on would answer the probe for the wrong server.
  [[ -z $(ss -Hltn "sport = :$port") ]] || return 1
  # shellcheck disable=SC2046
  taskset -c 0 $(server_cmd "$1" "$port") >/tmp/run_echo.$$.log 2>&1 &
  spid=$!
  for _ in $(seq 100); do
    kill -0 "$spid" 2>/dev/null || return 1        # died: bind failed?
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  return 1
}

run_one() {   # $1 server, $2 workload
  local port up=""
  for _ in 1 2 3 4 5; do
    if start_server "$1"; then up=1; break; fi
    stop_server
  done
  if [[ -z $up ]]; then
    echo "run_echo: $1 did not start:" >&2; cat /tmp/run_echo.$$.log >&2; exit 1
  fi
  local out
  # shellcheck disable=SC2046
  out=$(taskset -c 1 "$build/bench/echo_load" -P "$port" $(load_args "$2") \
        -w "$WARMUP" -d "$DURATION" -p "$spid")
  stop_server
  rm -f /tmp/run_echo.$$.log
  read -r R_RATE R_P99 R_PER < <(echo "$out" | awk '/^RESULT/ {
      for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      print v["rate"], v["p99_us"], v["per_cpu_s"] }')
  if [[ -z ${R_PER:-} ]]; then echo "run_echo: no result from echo_load: $out" >&2; exit 1; fi
}

median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

echo "run_echo: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, RUNS=$RUNS WARMUP=${WARMUP}s DURATION=${DURATION}s"
echo "run_echo: load before: $(uptime | sed 's/.*load average/load average/')"
declare -A RATE P99 PER
# The servers take turns run by run, so a slow spell of this shared VM (its
# speed drifts by 10-20 % over minutes) falls on all of them alike.
declare -A RATES P99S PERS
for w in $WORKLOADS; do
  for _ in $(seq "$RUNS"); do
    for s in $SERVERS; do
      run_one "$s" "$w"
      RATES[$w.$s]+="$R_RATE " P99S[$w.$s]+="$R_P99 " PERS[$w.$s]+="$R_PER "
      echo "run_echo: $w $s: $R_RATE msgs/s, p99 $R_P99 us, $R_PER msgs per server CPU-s" >&2
    done
  done
  for s in $SERVERS; do
    RATE[$w.$s]=$(printf '%s\n' ${RATES[$w.$s]} | median)
    P99[$w.$s]=$(printf '%s\n' ${P99S[$w.$s]} | median)
    PER[$w.$s]=$(printf '%s\n' ${PERS[$w.$s]} | median)
  done
done
echo "run_echo: load after: $(uptime | sed 's/.*load average/load average/')"

name() {
  case $1 in
    epoll) echo "C epoll baseline" ;;
    nr_c) echo "netrun, C handlers (nr_echo)" ;;
    nr_lua) echo "netrun, Lua handler (echo.lua)" ;;
  esac
}
echo
echo "| workload | server | msgs/s | p99 (µs) | msgs per server CPU-s | vs baseline |"
echo "|---|---|---:|---:|---:|---:|"
for w in $WORKLOADS; do
  for s in $SERVERS; do
    base=${PER[$w.epoll]:-}
    ratio="—"
    if [[ -n $base && $base != 0 ]]; then
      ratio=$(awk -v a="${PER[$w.$s]}" -v b="$base" 'BEGIN { printf "%.0f%%", 100 * a / b }')
    fi
    printf '| %s | %s | %.0f | %s | %.0f | %s |\n' "$(describe "$w")" "$(name "$s")" \
      "${RATE[$w.$s]}" "${P99[$w.$s]}" "${PER[$w.$s]}" "$ratio"
  done
done
