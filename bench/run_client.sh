#!/usr/bin/env bash
# run_client.sh -- the HTTP client benchmark (DESIGN.md §8.6):
# examples/fetch.lua (netrun.http.client, one loop) against Node's http
# client with a keep-alive agent, both fetching from the same local server
# (the C epoll baseline, bench/http_baseline.c, pinned to CPU 1) with the
# client pinned to CPU 0: REQUESTS requests, CONC in flight, over CONC
# keep-alive connections. The figure is requests per client CPU-second
# (each client reports its own process CPU time: os.clock in netrun,
# process.cpuUsage in Node), median of RUNS, the clients taking turns.
#   bash bench/run_client.sh [REQUESTS] [RUNS] [CONC]
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS=${1:-200000}
RUNS=${2:-3}
CONC=${3:-64}
bash scripts/deps.sh nodejs

source bench/lib.sh
bench_init client

cmake -S . -B build/http-bench -DCMAKE_BUILD_TYPE=Release -DNETRUN_BENCH=OFF >/dev/null
cmake --build build/http-bench -j2 --target netrun_bin >/dev/null
cc -O2 -o "$work/http_baseline" bench/http_baseline.c

cat > "$work/node_fetch.js" <<'JS'
// N requests, C in flight, keep-alive agent; prints what fetch.lua prints.
const http = require('http');
const [url, total, conc] = [process.argv[2], +process.argv[3], +process.argv[4]];
const agent = new http.Agent({ keepAlive: true, maxSockets: conc });
let left = total, errors = 0, running = 0;
const t0 = process.hrtime.bigint(), c0 = process.cpuUsage();
function done() {
  const s = Number(process.hrtime.bigint() - t0) / 1e9, c = process.cpuUsage(c0);
  console.log(`requests=${total - errors} seconds=${s.toFixed(3)} errors=${errors} cpu=${((c.user + c.system) / 1e6).toFixed(3)}`);
  agent.destroy();
}
function one() {
  if (left === 0) { if (--running === 0) done(); return; }
  left--;
  http.get(url, { agent }, res => { res.on('data', () => {}); res.on('end', one); })
    .on('error', () => { errors++; one(); });
}
for (let i = 0; i < Math.min(conc, total); i++) { running++; one(); }
JS

PORT=18195
taskset -c 1 "$work/http_baseline" $PORT 2>/dev/null &
pids+=($!)
wait_port $PORT
url="http://127.0.0.1:$PORT/"

names=("netrun examples/fetch.lua (futures)" "netrun examples/fetch.lua --api callback"
       "Node http + keep-alive agent")
run() {   # I: one run of client I; prints "per_cpu_s req_s"
  local out
  if [[ $1 == 0 || $1 == 1 ]]; then
    local api=future
    [[ $1 == 1 ]] && api=callback
    out=$(taskset -c 0 build/http-bench/bin/netrun examples/fetch.lua --url "$url" \
          --requests "$REQUESTS" --concurrency "$CONC" --api $api | tail -1)
  else
    out=$(taskset -c 0 node "$work/node_fetch.js" "$url" "$REQUESTS" "$CONC")
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
echo "HTTP client, $REQUESTS requests, $CONC in flight, median of $RUNS; $(date -u '+%F %H:%M UTC'); load: $(uptime | sed 's/.*load average: //')"
echo
echo "| client | req/s | req per client CPU-s | errors | every run (per CPU-s) |"
echo "|---|---:|---:|---:|---|"
for i in "${!names[@]}"; do
  read -r per rps errs <<<"$(printf '%s' "${runs[$i]}" | sort -n | sed -n "$(((RUNS + 1) / 2))p")"
  printf '| %s | %s | %s | %s | %s |\n' "${names[$i]}" "$rps" "$per" "$errs" \
    "$(printf '%s' "${runs[$i]}" | cut -d' ' -f1 | paste -sd' ')"
done
