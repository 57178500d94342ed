#!/usr/bin/env bash
# run_static.sh -- the static files benchmark (DESIGN.md §9.8, §7's
# method): netrun (examples/static.lua, one worker loop: the native codec
# and netrun.handler.static, sendfile, its open file cache) against nginx
# (one worker, `sendfile on`, `open_file_cache`), each pinned to CPU 0,
# under `taskset -c 1 wrk -t1 -cCONNS -dDURs` keep-alive after a 2 s
# warm-up, on a 1 KiB and a 1 MiB file. Median of RUNS by requests per
# server CPU-second (utime+stime from /proc/PID/stat, nginx master and
# worker summed); bytes per server CPU-second are the body bytes
# (requests x file size). The servers take turns run by run, so a slow
# spell of the shared machine falls on both alike. Prints a markdown table.
#   bash bench/run_static.sh [DURATION_S] [RUNS]
# Instructions per request (callgrind, bench/instr.sh's method): INSTR=1.
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-10}
RUNS=${2:-3}
bash scripts/deps.sh wrk nginx >/dev/null

source bench/lib.sh
bench_init static

cmake -S . -B build/static-bench -DCMAKE_BUILD_TYPE=Release -DNETRUN_BENCH=OFF >/dev/null
cmake --build build/static-bench -j2 --target netrun_bin >/dev/null

root=$work/root
mkdir -p "$root"
head -c 1024 /dev/urandom > "$root/1k.bin"
head -c $((1 << 20)) /dev/urandom > "$root/1m.bin"
# nginx's worker runs as nobody when started as root: it must read them
# (mktemp's directory is 0700; a 403 would pass for a fast answer)
chmod 755 "$work" "$root"
chmod 644 "$root"/*.bin

mkdir -p "$work/nginx/logs"
cat > "$work/nginx/nginx.conf" <<EOF
worker_processes 1;
daemon off;
error_log stderr error;
pid nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  open_file_cache max=1000 inactive=60s;
  open_file_cache_valid 60s;
  keepalive_requests 100000000;
  default_type application/octet-stream;
  server {
    listen 127.0.0.1:18282;
    root $root;
  }
}
EOF

NR_PORT=18281 NGX_PORT=18282
taskset -c 0 build/static-bench/bin/netrun examples/static.lua --root "$root" \
  --port $NR_PORT --threads 1 >/dev/null 2>&1 &
pids+=($!)
nr_pid=$!
taskset -c 0 nginx -p "$work/nginx" -c nginx.conf 2>"$work/nginx/err.log" &
pids+=($!)
ngx_master=$!
wait_port $NR_PORT
wait_port $NGX_PORT
ngx_pids="$ngx_master $(pgrep -P "$ngx_master" | head -1)"
for port in $NR_PORT $NGX_PORT; do     # both answer the whole files
  for f in 1k.bin:1024 1m.bin:1048576; do
    got=$(curl -s -o /dev/null -w '%{http_code} %{size_download}' "http://127.0.0.1:$port/${f%%:*}")
    [[ $got == "200 ${f##*:}" ]] || { echo "port $port: /${f%%:*}: $got" >&2; exit 1; }
  done
done

# one PORT FILE CONNS PIDS...: prints "req_per_cpu_s req_s".
one() {
  local port=$1 file=$2 conns=$3; shift 3
  local t0 t1 out reqs rps
  t0=$(ticks "$@")
  out=$(taskset -c 1 wrk -t1 -c"$conns" -d"${DUR}s" "http://127.0.0.1:$port/$file")
  t1=$(ticks "$@")
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  awk -v r="$reqs" -v t=$((t1 - t0)) -v hz="$hz" -v rps="$rps" \
    'BEGIN { printf "%d %s\n", (t > 0 ? r / (t / hz) : 0), rps }'
}

declare -A row every
for spec in "1k.bin 1024 64" "1m.bin 1048576 16"; do
  read -r file size conns <<<"$spec"
  for port in $NR_PORT $NGX_PORT; do
    taskset -c 1 wrk -t1 -c"$conns" -d2s "http://127.0.0.1:$port/$file" >/dev/null
  done
  nr_runs="" ngx_runs=""
  for _ in $(seq "$RUNS"); do
    nr_runs+="$(one $NR_PORT "$file" "$conns" $nr_pid)"$'\n'
    # shellcheck disable=SC2086
    ngx_runs+="$(one $NGX_PORT "$file" "$conns" $ngx_pids)"$'\n'
  done
  mid=$(((RUNS + 1) / 2))
  row[netrun,$file]=$(printf '%s' "$nr_runs" | sort -n | sed -n "${mid}p")
  row[nginx,$file]=$(printf '%s' "$ngx_runs" | sort -n | sed -n "${mid}p")
  every[netrun,$file]=$(printf '%s' "$nr_runs" | cut -d' ' -f1 | paste -sd' ')
  every[nginx,$file]=$(printf '%s' "$ngx_runs" | cut -d' ' -f1 | paste -sd' ')
  row[size,$file]=$size
  row[conns,$file]=$conns
done

echo
echo "Static files, wrk -t1 keep-alive, -d${DUR}s, median of $RUNS; $(date -u '+%F %H:%M UTC');" \
  "commit $(git rev-parse --short HEAD); $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'));" \
  "load: $(uptime | sed 's/.*load average: //')"
echo
echo "| server | file | connections | req/s | req per server CPU-s | MiB per server CPU-s | vs nginx |"
echo "|---|---|---:|---:|---:|---:|---:|"
for file in 1k.bin 1m.bin; do
  read -r ngx_per _ <<<"${row[nginx,$file]}"
  for server in netrun nginx; do
    read -r per rps <<<"${row[$server,$file]}"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$server" "$file" "${row[conns,$file]}" "$rps" "$per" \
      "$(awk -v p="$per" -v s="${row[size,$file]}" 'BEGIN { printf "%.1f", p * s / 1048576 }')" \
      "$(awk -v a="$per" -v b="$ngx_per" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')"
  done
done
echo
echo "Every run, requests per server CPU-second, in order:"
for file in 1k.bin 1m.bin; do
  for server in netrun nginx; do echo "- $server, $file: ${every[$server,$file]}"; done
done

# Instructions per request: each server under callgrind (instrumentation
# switched on after a warm-up), a bounded wrk load, instructions / requests.
if [[ ${INSTR:-0} == 1 ]]; then
  bash scripts/deps.sh valgrind >/dev/null
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
  cmake -S . -B build/instr -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNETRUN_BENCH=OFF >/dev/null
  cmake --build build/instr -j2 --target netrun_bin >/dev/null
  instr() {   # NAME FILE CMD...: prints instructions per request
    local name=$1 file=$2; shift 2
    local out=$work/cg.$name.$file
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" "$@" >/dev/null 2>&1 &
    local vpid=$!
    wait_port "$3"
    taskset -c 1 wrk -t1 -c16 -d1s "http://127.0.0.1:$3/$file" >/dev/null
    callgrind_control -i on "$vpid" >/dev/null
    local reqs
    reqs=$(taskset -c 1 wrk -t1 -c16 -d3s "http://127.0.0.1:$3/$file" | awk '/requests in/ {print $1}')
    callgrind_control -i off "$vpid" >/dev/null
    callgrind_control -d "$vpid" >/dev/null
    kill "$vpid"; wait "$vpid" 2>/dev/null || true
    local ir
    ir=$(cat "$out"* | awk '/^totals:/ {s += $2} END {print s}')
    echo "- $name, $file: $((ir / reqs)) instructions per request ($reqs requests)"
  }
  echo
  echo "Instructions per request (callgrind, wrk -t1 -c16 keep-alive, 3 s):"
  for file in 1k.bin 1m.bin; do
    instr netrun "$file" build/instr/bin/netrun examples/static.lua --root "$root" --port 18283 --threads 1
  done
fi
