#!/usr/bin/env bash
# run_upstream.sh -- examples/proxy.lua in front of three backends (the C
# epoll baseline, bench/http_baseline.c, on three ports) under wrk load
# (issue 30): a third of the way in one backend is killed (its connections
# reset), two thirds of the way in it is started again on its port. The
# proxy runs with --health-path /health --health-interval $INTERVAL
# --retries 2. What must hold: wrk's socket errors and non-2xx answers are
# 0 (every GET that met the dead backend was retried on another), the
# proxy logs the dead one out within an interval of the kill and back
# within two of the restart. Prints wrk's summary and those times.
#   bash bench/run_upstream.sh [DURATION_S] [INTERVAL_S]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-10}
INTERVAL=${2:-0.5}
CONNS=32
bash scripts/deps.sh wrk >/dev/null

source bench/lib.sh
bench_init upstream

cmake -S . -B build/http-bench -DCMAKE_BUILD_TYPE=Release -DNETRUN_BENCH=OFF >/dev/null
cmake --build build/http-bench -j2 --target netrun_bin >/dev/null
cc -O2 -o "$work/http_baseline" bench/http_baseline.c

PORTS=(18291 18292 18293)
PROXY=18290
for p in "${PORTS[@]}"; do
  taskset -c 1 "$work/http_baseline" "$p" 2>/dev/null &
  pids+=($!)
done
victim=${pids[1]}
for p in "${PORTS[@]}"; do wait_port "$p"; done
taskset -c 0 build/http-bench/bin/netrun examples/proxy.lua --port $PROXY --threads 1 \
  --backend 127.0.0.1:${PORTS[0]} --backend 127.0.0.1:${PORTS[1]} --backend 127.0.0.1:${PORTS[2]} \
  --health-path /health --health-interval "$INTERVAL" --retries 2 --timeout 5 \
  >"$work/proxy.log" 2>&1 &
pids+=($!)
proxy=$!
wait_port $PROXY

ms() { date +%s%3N; }
t0=$(ticks $proxy)
taskset -c 1 wrk -t1 -c$CONNS -d"${DUR}"s "http://127.0.0.1:$PROXY/" >"$work/wrk.txt" &
wrk=$!
sleep "$(awk -v d="$DUR" 'BEGIN { print d / 3 }')"
killed=$(ms)
kill -KILL "$victim"
sleep "$(awk -v d="$DUR" 'BEGIN { print d / 3 }')"
taskset -c 1 "$work/http_baseline" "${PORTS[1]}" 2>/dev/null &
pids+=($!)
wait_port "${PORTS[1]}"
restarted=$(ms)
wait $wrk
t1=$(ticks $proxy)

# The proxy's log lines "... http://127.0.0.1:PORT down|up (probe: ...)",
# their ISO times in ms since the epoch.
at() {   # WORD: the first such line's time in ms, or empty
  local line
  line=$(grep -m1 "127.0.0.1:${PORTS[1]} $1 " "$work/proxy.log" || true)
  [[ -n $line ]] || return 0
  date -d "$(cut -d' ' -f1 <<<"$line")" +%s%3N
}
down=$(at down); up=$(at up)
echo
echo "examples/proxy.lua, 3 backends (one killed at $((DUR / 3)) s, back at $((2 * DUR / 3)) s)," \
     "health interval ${INTERVAL} s, retries 2; wrk -t1 -c$CONNS -d${DUR}s;" \
     "$(date -u '+%F %H:%M UTC'); commit $(git rev-parse --short HEAD)"
echo
sed 's/^/    /' "$work/wrk.txt"
echo
reqs=$(awk '/requests in/ { print $1 }' "$work/wrk.txt")
errors=$(awk '/Socket errors/ { print }' "$work/wrk.txt")
non2xx=$(awk '/Non-2xx/ { print $NF }' "$work/wrk.txt")
echo "- requests: $reqs; socket errors: ${errors:-none}; non-2xx: ${non2xx:-0}"
echo "- requests per proxy CPU-second: $(awk -v r="$reqs" -v t=$((t1 - t0)) -v hz="$hz" 'BEGIN { printf "%d", (t > 0 ? r / (t / hz) : 0) }')"
if [[ -n $down ]]; then
  echo "- the killed backend logged out $((down - killed)) ms after the kill"
  echo "  (the first failed request takes it out before any probe: that is the usual case)"
else
  echo "- the killed backend: no 'down' line in the proxy's log"
fi
if [[ -n $up ]]; then
  echo "- back $((up - restarted)) ms after it listened again (two intervals: $(awk -v i="$INTERVAL" 'BEGIN { print 2 * i * 1000 }') ms)"
else
  echo "- the restarted backend: no 'up' line in the proxy's log"
fi
