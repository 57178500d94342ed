#!/usr/bin/env bash
# bench/run_accept.sh -- new connections per second, with and without
# reuseport (DESIGN.md §8.5), and how evenly they spread over the loops.
#
# Builds build/bench, then for each mode
#   boss       a boss loop accepts and hands each channel to a worker loop
#   reuseport  every worker loop accepts on a listener of its own
# runs bench/accept_server.lua (THREADS worker loops, pinned to CPUS_SERVER)
# against bench/accept_load (CONNS connections at a time, each: connect,
# one byte echoed, close with RST; pinned to CPU_LOAD), WARMUP s of warm-up
# and DURATION s measured, RUNS times, and prints a markdown table of
# medians: connections/s, connections per server CPU-second, and the
# spread (each loop's share of the connections, and max/min).
#
# Usage: bench/run_accept.sh                    (2 modes x 3 runs of 1 + 10 s)
#        RUNS=1 WARMUP=0.5 DURATION=2 bench/run_accept.sh   (a smoke run)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${RUNS:-3}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-1}
THREADS=${THREADS:-2}
CONNS=${CONNS:-64}
CPUS_SERVER=${CPUS_SERVER:-0}
CPU_LOAD=${CPU_LOAD:-1}
MODES=${MODES:-"boss reuseport"}
build=$here/build/bench

bash "$here/scripts/deps.sh" util-linux procps >/dev/null   # taskset, uptime
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNETRUN_BENCH=ON \
  -DNETRUN_ASAN=OFF -DNETRUN_TSAN=OFF >/dev/null
cmake --build "$build" -j2 --target accept_load netrun_bin >/dev/null

spid=""
counts=/tmp/run_accept.$$.counts
stop_server() {
  [[ -n $spid ]] || return 0
  kill -TERM "$spid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$spid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$spid" 2>/dev/null || true
  wait "$spid" 2>/dev/null || true
  spid=""
}
trap 'stop_server; rm -f $counts /tmp/run_accept.$$.log' EXIT

start_server() {   # $1 mode; sets spid and port, or returns 1
  port=$((20000 + RANDOM % 20000))
  [[ -z $(ss -Hltn "sport = :$port") ]] || return 1
  local rp=no
  [[ $1 == reuseport ]] && rp=yes
  rm -f "$counts"
  taskset -c "$CPUS_SERVER" "$build/bin/netrun" "$here/bench/accept_server.lua" \
    --port "$port" --threads "$THREADS" --reuseport "$rp" --counts "$counts" \
    >/tmp/run_accept.$$.log 2>&1 &
  spid=$!
  for _ in $(seq 100); do
    kill -0 "$spid" 2>/dev/null || return 1
    grep -q ":$port" /tmp/run_accept.$$.log 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}

# The spread: "share1/share2/... max/min" from the counts file.
spread() {
  sleep 0.6                               # the counts file is rewritten every 0.5 s
  awk '{ n[NR] = $2; t += $2 } END {
    s = ""; mx = 0; mn = -1
    for (i = 1; i <= NR; i++) {
      s = s (i > 1 ? "/" : "") sprintf("%.0f%%", t ? 100 * n[i] / t : 0)
      if (n[i] > mx) mx = n[i]; if (mn < 0 || n[i] < mn) mn = n[i]
    }
    printf "%s %s\n", s, (mn > 0 ? sprintf("%.2f", mx / mn) : "inf") }' "$counts"
}

run_one() {   # $1 mode: sets R_RATE R_PER R_SPREAD R_RATIO
  local up=""
  for _ in 1 2 3 4 5; do
    if start_server "$1"; then up=1; break; fi
    stop_server
  done
  if [[ -z $up ]]; then
    echo "run_accept: $1 did not start:" >&2; cat /tmp/run_accept.$$.log >&2; exit 1
  fi
  local out
  out=$(taskset -c "$CPU_LOAD" "$build/bench/accept_load" -P "$port" -c "$CONNS" \
        -w "$WARMUP" -d "$DURATION" -p "$spid")
  read -r R_SPREAD R_RATIO < <(spread)
  stop_server
  read -r R_RATE R_PER R_ERR < <(echo "$out" | awk '/^RESULT/ {
      for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      print v["rate"], v["per_cpu_s"], v["errors"] }')
  if [[ -z ${R_PER:-} ]]; then echo "run_accept: no result from accept_load: $out" >&2; exit 1; fi
}

median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

echo "run_accept: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, RUNS=$RUNS WARMUP=${WARMUP}s DURATION=${DURATION}s THREADS=$THREADS CONNS=$CONNS"
declare -A RATES PERS SPREAD RATIO
for _ in $(seq "$RUNS"); do
  for m in $MODES; do
    run_one "$m"
    RATES[$m]+="$R_RATE " PERS[$m]+="$R_PER "
    SPREAD[$m]=$R_SPREAD RATIO[$m]=$R_RATIO
    echo "run_accept: $m: $R_RATE conns/s, $R_PER per server CPU-s, spread $R_SPREAD (max/min $R_RATIO), $R_ERR errors" >&2
  done
done
echo
echo "| mode | new conns/s | conns per server CPU-s | spread over loops (last run) | max/min |"
echo "|---|---:|---:|---|---:|"
for m in $MODES; do
  printf '| %s | %.0f | %.0f | %s | %s |\n' "$m" "$(printf '%s\n' ${RATES[$m]} | median)" \
    "$(printf '%s\n' ${PERS[$m]} | median)" "${SPREAD[$m]}" "${RATIO[$m]}"
done
