#!/usr/bin/env bash
# run_h2.sh -- the HTTP/2 server benchmark of DESIGN.md §9.8 by §7's
# method, side by side in one run: h2load -c 64 -m 16 against
#   nginx 1.22   one worker, `http2`, `return 200 "Hello, World!"`
#                (bench/h2/nginx.conf.in)
#   h2o 2.2.5    one thread, the 13-byte answer as a file, h2o's fastest
#                fixed answer (bench/h2/h2o.conf.in; mruby costs 5x more)
#   netrun       examples/http_hello.lua (h2c by prior knowledge) and
#                examples/https_hello.lua (h2 by ALPN), one worker loop, a
#                Lua handler per request; --response table with TABLE=1
#   baseline     bench/h2_baseline.c, h2c only: nghttp2 and epoll, no more
#                (the floor a server on nghttp2 starts from)
# each over h2c (prior knowledge) and TLS 1.3 (TLS_AES_128_GCM_SHA256,
# X25519, the same EC P-256 certificate). Each server pinned to CPU 0,
# h2load to CPU 1, a 2 s warm-up, then DURATION s measured; the figure is
# requests per server CPU-second (utime+stime from /proc/PID/stat over
# the measured run, nginx's master and worker summed), the median of RUNS,
# servers taking turns. h2load reports no percentiles: the mean time a
# request took is shown instead of a p99.
#   bash bench/run_h2.sh [DURATION_S] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-10}
RUNS=${2:-3}
C=${C:-64} M=${M:-16}

source bench/lib.sh
bench_init h2

cmake -S . -B build/http-bench -DCMAKE_BUILD_TYPE=Release -DNETRUN_BENCH=OFF >/dev/null
cmake --build build/http-bench -j2 --target netrun_bin >/dev/null
bash spec/fixtures/tls/make_certs.sh "$work/certs"
cert=$work/certs/server.crt key=$work/certs/server.key
printf 'Hello, World!' > "$work/hello.txt"

conf() {   # TEMPLATE PORT: the config made from it (TLS on PORT + 1)
  local out=$work/$(basename "$1" .in)
  sed -e "s|@PORT@|$2|; s|@TLS_PORT@|$(($2 + 1))|; s|@CERT@|$cert|; s|@KEY@|$key|" \
      -e "s|@DIR@|$work|; s|@TOP@||; s|@USER@|$(id -un)|" \
      -e "s|@HANDLER@|        file.file: $work/hello.txt|" "$1" > "$out"
  echo "$out"
}

mkdir -p "$work/logs"
taskset -c 0 nginx -p "$work" -c "$(conf bench/h2/nginx.conf.in 18390)" 2>"$work/nginx.err" &
pids+=($!); nginx_pid=$!
taskset -c 0 h2o -m worker -c "$(conf bench/h2/h2o.conf.in 18392)" 2>"$work/h2o.err" &
pids+=($!); h2o_pid=$!
resp=(); [[ -n ${TABLE:-} ]] && resp=(--response table)
taskset -c 0 build/http-bench/bin/netrun examples/http_hello.lua --port 18394 --threads 1 \
  "${resp[@]}" >/dev/null 2>&1 &
pids+=($!); h2c_pid=$!
taskset -c 0 build/http-bench/bin/netrun examples/https_hello.lua --port 18395 --threads 1 \
  --cert "$cert" --key "$key" "${resp[@]}" >/dev/null 2>&1 &
pids+=($!); tls_pid=$!
cc -O2 -o "$work/h2_baseline" bench/h2_baseline.c -lnghttp2
taskset -c 0 "$work/h2_baseline" 18396 >/dev/null 2>&1 &
pids+=($!); base_pid=$!
for p in 18390 18391 18392 18393 18394 18395 18396; do wait_port "$p"; done
nginx_procs="$nginx_pid $(pgrep -P "$nginx_pid" | head -1)"

names=(nginx h2o netrun baseline)
declare -A url procs
url[nginx,h2c]=http://127.0.0.1:18390/  url[nginx,tls]=https://127.0.0.1:18391/
url[h2o,h2c]=http://127.0.0.1:18392/    url[h2o,tls]=https://127.0.0.1:18393/
url[netrun,h2c]=http://127.0.0.1:18394/ url[netrun,tls]=https://127.0.0.1:18395/
procs[nginx,h2c]=$nginx_procs procs[nginx,tls]=$nginx_procs
procs[h2o,h2c]=$h2o_pid procs[h2o,tls]=$h2o_pid
procs[netrun,h2c]=$h2c_pid procs[netrun,tls]=$tls_pid
url[baseline,h2c]=http://127.0.0.1:18396/ procs[baseline,h2c]=$base_pid

load() {   # URL SECONDS: prints "requests req_s mean_time" (h2c by prior knowledge)
  taskset -c 1 h2load -c "$C" -m "$M" -D "$2" --tls13-ciphers=TLS_AES_128_GCM_SHA256 "$1" |
    awk '/^requests:/ { r = $8 } /^finished in/ { s = $4 }
         /^time for request:/ { t = $6 }
         /^status codes:/ { if ($3 + 0 != r + 0) bad = 1 }
         END { print r, s, t (bad ? "!non-2xx" : "") }'
}

one() {   # NAME MODE: "per_cpu_s req_s mean"
  local t0 t1 reqs rps mean
  # shellcheck disable=SC2086
  t0=$(ticks ${procs[$1,$2]})
  read -r reqs rps mean <<<"$(load "${url[$1,$2]}" "$DUR")"
  # shellcheck disable=SC2086
  t1=$(ticks ${procs[$1,$2]})
  awk -v r="$reqs" -v t=$((t1 - t0)) -v hz="$hz" -v rps="$rps" -v m="$mean" \
    'BEGIN { printf "%d %s %s\n", (t > 0 ? r / (t / hz) : 0), rps, m }'
}

declare -A row every
for mode in h2c tls; do
  declare -A runs=()
  for n in "${names[@]}"; do
    [[ -n ${url[$n,$mode]:-} ]] && load "${url[$n,$mode]}" 2 >/dev/null
  done
  for _ in $(seq "$RUNS"); do
    for n in "${names[@]}"; do
      [[ -n ${url[$n,$mode]:-} ]] && runs[$n]+="$(one "$n" "$mode")"$'\n'
    done
  done
  for n in "${names[@]}"; do
    [[ -z ${runs[$n]:-} ]] && continue
    row[$n,$mode]=$(printf '%s' "${runs[$n]}" | sort -n | sed -n "$(((RUNS + 1) / 2))p")
    every[$n,$mode]=$(printf '%s' "${runs[$n]}" | cut -d' ' -f1 | paste -sd' ')
  done
done

echo
echo "HTTP/2 hello, h2load -c $C -m $M -D ${DUR}s, median of $RUNS${TABLE:+, netrun --response table}; $(date -u '+%F %H:%M UTC') at $(git rev-parse --short HEAD); load: $(uptime | sed 's/.*load average: //')"
echo
echo "| server | transport | req/s | mean time a request | per server CPU-s | vs nginx | vs h2o |"
echo "|---|---|---:|---:|---:|---:|---:|"
for mode in h2c tls; do
  ng=$(cut -d' ' -f1 <<<"${row[nginx,$mode]}") ho=$(cut -d' ' -f1 <<<"${row[h2o,$mode]}")
  for n in "${names[@]}"; do
    [[ -z ${row[$n,$mode]:-} ]] && continue
    read -r per rps mean <<<"${row[$n,$mode]}"
    printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$n" "$mode" "$rps" "$mean" "$per" \
      "$(awk -v a="$per" -v b="$ng" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')" \
      "$(awk -v a="$per" -v b="$ho" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')"
  done
done
echo
echo "Every run, per server CPU-second, in order:"
for n in "${names[@]}"; do
  for mode in h2c tls; do
    [[ -n ${every[$n,$mode]:-} ]] && echo "- $n, $mode: ${every[$n,$mode]}"
  done
done
