#!/usr/bin/env bash
# run_h2_client.sh -- the HTTP/2 client benchmark of DESIGN.md §9.8:
# examples/fetch.lua --h2 yes (netrun.http.client, one loop, h2c by prior
# knowledge: its requests multiplexed on one connection) against Node's
# http2 client (one session, the same streams in flight), both fetching
# "Hello, World!" from the same local h2c server (bench/h2_baseline.c,
# nghttp2 and epoll, pinned to CPU 1) with the client pinned to CPU 0:
# REQUESTS requests, CONC in flight. The figure is requests per client
# CPU-second (each client reports its own process CPU time: os.clock in
# netrun, process.cpuUsage in Node), median of RUNS, the clients taking
# turns.
#   bash bench/run_h2_client.sh [REQUESTS] [RUNS] [CONC]
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS=${1:-200000}
RUNS=${2:-3}
CONC=${3:-64}

source bench/lib.sh
bench_init h2-client

cmake -S . -B build/http-bench -DCMAKE_BUILD_TYPE=Release -DNETRUN_BENCH=OFF >/dev/null
cmake --build build/http-bench -j2 --target netrun_bin >/dev/null
cc -O2 -o "$work/h2_baseline" bench/h2_baseline.c -lnghttp2

cat > "$work/node_h2_fetch.js" <<'JS'
// N requests, C streams in flight on one http2 session; prints what
// fetch.lua prints.
const http2 = require('http2');
const [url, total, conc] = [process.argv[2], +process.argv[3], +process.argv[4]];
const session = http2.connect(url);
let left = total, errors = 0, running = 0;
const t0 = process.hrtime.bigint(), c0 = process.cpuUsage();
function done() {
  const s = Number(process.hrtime.bigint() - t0) / 1e9, c = process.cpuUsage(c0);
  console.log(`requests=${total - errors} seconds=${s.toFixed(3)} errors=${errors} cpu=${((c.user + c.system) / 1e6).toFixed(3)}`);
  session.close();
}
function one() {
  if (left === 0) { if (--running === 0) done(); return; }
  left--;
  let over = false;
  const next = (failed) => { if (over) return; over = true; if (failed) errors++; one(); };
  const req = session.request({ ':path': '/' });
  req.on('data', () => {});
  req.on('end', () => next(false));
  req.on('error', () => next(true));
  req.end();
}
for (let i = 0; i < Math.min(conc, total); i++) { running++; one(); }
JS

PORT=18397
taskset -c 1 "$work/h2_baseline" $PORT 2>/dev/null &
pids+=($!)
wait_port $PORT
url="http://127.0.0.1:$PORT/"

names=("netrun examples/fetch.lua --h2 yes (futures)" "netrun examples/fetch.lua --h2 yes --api callback"
       "Node http2 client, one session")
run() {   # I: one run of client I; prints "per_cpu_s req_s errors"
  local out
  if [[ $1 == 0 || $1 == 1 ]]; then
    local api=future
    [[ $1 == 1 ]] && api=callback
    out=$(taskset -c 0 build/http-bench/bin/netrun examples/fetch.lua --url "$url" --h2 yes \
          --requests "$REQUESTS" --concurrency "$CONC" --api $api | tail -1)
  else
    out=$(taskset -c 0 node "$work/node_h2_fetch.js" "$url" "$REQUESTS" "$CONC")
  fi
  awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } }
       END { printf "%d %d %d\n", v["requests"] / v["cpu"], v["requests"] / v["seconds"], v["errors"] }' <<<"$out"
}
declare -A runs
for i in "${!names[@]}"; do run "$i" >/dev/null; done        # warm-up
for _ in $(seq "$RUNS"); do
  for i in "${!names[@]}"; do runs[$i]+="$(run "$i")"$'\n'; done
done

echo
echo "HTTP/2 client (h2c), $REQUESTS requests, $CONC in flight, median of $RUNS; $(date -u '+%F %H:%M UTC') at $(git rev-parse --short HEAD); load: $(uptime | sed 's/.*load average: //')"
echo
echo "| client | req/s | req per client CPU-s | errors | every run (per CPU-s) |"
echo "|---|---:|---:|---:|---|"
for i in "${!names[@]}"; do
  read -r per rps errs <<<"$(printf '%s' "${runs[$i]}" | sort -n | sed -n "$(((RUNS + 1) / 2))p")"
  printf '| %s | %s | %s | %s | %s |\n' "${names[$i]}" "$rps" "$per" "$errs" \
    "$(printf '%s' "${runs[$i]}" | cut -d' ' -f1 | paste -sd' ')"
done
