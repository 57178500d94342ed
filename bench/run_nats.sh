#!/usr/bin/env bash
# run_nats.sh -- netrun.nats against Node's `nats` client (nats.js), per
# client CPU-second (DESIGN.md §9.8 with §7's method): nats-server (and,
# for requests, a netrun responder) pinned to CPU 0, the client pinned to
# CPU 1; each client reads its own utime+stime from /proc/self/stat around
# the measured part (bench/nats_bench.lua, bench/node/nats_bench.js: the
# same work in both). Workloads:
#   pub    publish SIZE-byte messages, 4096 then a flush, as fast as it goes
#   req1   request/reply, one request in flight
#   req64  request/reply, 64 in flight on one connection
# For each workload, RUNS rounds in which netrun and Node take turns;
# WARMUP s then DURATION s per run; medians by operations per client
# CPU-second, with raw rates and p99 latency (requests) beside them, then
# every run. Prints the load average before and after: the machine is
# shared, so read the ratios (measured side by side), not the absolutes.
#   bash bench/run_nats.sh                 (3 rounds of 2 s + 10 s: about 5 minutes)
#   RUNS=1 DURATION=3 WORKLOADS=pub bash bench/run_nats.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
SIZE=${SIZE:-16}
WORKLOADS=${WORKLOADS:-"pub req1 req64"}
PORT=${PORT:-19422}

source bench/lib.sh
bench_init nats

cmake -S . -B build/nats-bench -DCMAKE_BUILD_TYPE=Release -DNETRUN_BENCH=OFF >/dev/null
cmake --build build/nats-bench -j2 --target netrun_bin netrun_core >/dev/null
nr=build/nats-bench/bin/netrun
if [[ ! -d bench/node/node_modules/nats ]]; then
  npm ci --silent --no-audit --no-fund --prefix bench/node >/dev/null  # pinned by package-lock.json
fi
url="nats://127.0.0.1:$PORT"

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
taskset -c 0 nats-server -a 127.0.0.1 -p "$PORT" >"$work/server.log" 2>&1 &
pids+=($!)
wait_port "$PORT"
taskset -c 0 "$nr" bench/nats_bench.lua --mode serve --url "$url" >"$work/serve.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do grep -q serving "$work/serve.log" && break; sleep 0.05; done
grep -q serving "$work/serve.log" || { echo "the responder did not start" >&2; cat "$work/serve.log" >&2; exit 1; }

# one CLIENT WORKLOAD: prints "per_cpu_s ops_per_s p99_us".
one() {
  local client=$1 wl=$2 mode inflight out
  case $wl in
    pub) mode=pub; inflight=1 ;;
    req1) mode=req; inflight=1 ;;
    req64) mode=req; inflight=64 ;;
    *) echo "unknown workload $wl" >&2; exit 2 ;;
  esac
  if [[ $client == netrun ]]; then
    out=$(timeout $((WARMUP + DURATION + 30)) taskset -c 1 "$nr" bench/nats_bench.lua \
      --mode "$mode" --url "$url" --warmup "$WARMUP" --duration "$DURATION" --size "$SIZE" \
      --inflight "$inflight" | grep '^ops=')
  else
    out=$(HZ=$hz timeout $((WARMUP + DURATION + 30)) taskset -c 1 node \
      bench/node/nats_bench.js "$mode" "$url" "$WARMUP" "$DURATION" "$SIZE" "$inflight" |
      grep '^ops=')
  fi
  awk -v out="$out" 'BEGIN {
    n = split(out, f, /[ =]/)
    for (i = 1; i < n; i += 2) v[f[i]] = f[i + 1]
    cpu = v["ticks"] / v["hz"]
    printf "%d %d %s\n", (cpu > 0 ? v["ops"] / cpu : 0), v["ops"] / v["secs"],
      (v["p99_us"] > 0 ? v["p99_us"] : "--") }'
}

declare -A res
for wl in $WORKLOADS; do
  for r in $(seq "$RUNS"); do
    for c in netrun node; do
      res[$wl,$c,$r]=$(one "$c" "$wl")
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

median() {   # WORKLOAD CLIENT: the run with the median per-CPU-second figure
  for r in $(seq "$RUNS"); do echo "${res[$1,$2,$r]}"; done | sort -n |
    awk -v n="$RUNS" 'NR == int((n + 1) / 2)'
}

echo
echo "| workload ($SIZE B) | netrun per client CPU-s | Node nats per client CPU-s | netrun / Node | netrun ops/s | Node ops/s | p99 µs netrun / Node |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for wl in $WORKLOADS; do
  read -r np nr_rate np99 <<<"$(median "$wl" netrun)"
  read -r jp js_rate jp99 <<<"$(median "$wl" node)"
  ratio=$(awk -v a="$np" -v b="$jp" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
  echo "| $wl | $np | $jp | $ratio | $nr_rate | $js_rate | $np99 / $jp99 |"
done
echo
echo "every run (per client CPU-s, ops/s, p99 µs):"
for wl in $WORKLOADS; do
  for c in netrun node; do
    line="$wl $c:"
    for r in $(seq "$RUNS"); do line="$line  ${res[$wl,$c,$r]}"; done
    echo "$line"
  done
done
