#!/usr/bin/env bash
# RSS per idle connection: start a server, read its VmRSS, hold N idle
# connections, read it again. Usage: bench/idle_rss.sh [N=10000] -- CMD...
# (CMD gets the port as {port} and in $PORT).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
n=10000
if [[ ${1:-} != -- ]]; then n=$1; shift; fi
shift                                  # --
hold=${CONN_HOLD:-$here/build/bench/bench/conn_hold}
port=$((20000 + RANDOM % 20000))
ulimit -n "$(ulimit -Hn)"
cmd=("${@//\{port\}/$port}")
PORT=$port "${cmd[@]}" > /tmp/idle_rss.$$.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 200); do
  (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break
  sleep 0.05
done
sleep 0.5
rss() { awk '/VmRSS/ {print $2}' /proc/$pid/status; }
before=$(rss)
coproc HOLD { "$hold" "$port" "$n"; }
read -r line <&"${HOLD[0]}"
sleep 1                                # let the server register them all
after=$(rss)
echo "$line; server RSS ${before} KiB -> ${after} KiB: $(( (after - before) * 1024 / n )) bytes per idle connection"
exec {HOLD[1]}>&-
