#!/usr/bin/env bash
# run_https.sh -- the HTTPS benchmarks of DESIGN.md §8.6, side by side in
# one run: nginx (1 worker, `return 200 "Hello, World!"`), netrun
# examples/https_hello.lua (one worker loop) and, to show what TLS costs,
# netrun examples/http_hello.lua in plaintext. TLS 1.3, TLS_AES_128_GCM_SHA256
# and X25519 on both TLS servers, the same EC P-256 certificate (made fresh
# by spec/fixtures/tls/make_certs.sh).
#
# Workloads, each server pinned to CPU 0 and the load on CPU 1, 2 s
# warm-up, median of RUNS by work per server CPU-second (utime+stime from
# /proc/PID/stat, nginx master+worker summed), servers taking turns:
#   keepalive  `wrk -t1 -c64`: HTTPS hello requests on kept-alive connections.
#   resumed    `wrk -t1 -c16 -H "Connection: close"`: a new connection per
#              request. wrk keeps its SSL across reconnects (SSL_clear), so
#              every connection but the first resumes from a ticket: a PSK
#              + X25519 handshake with no signature (checked with nginx's
#              $ssl_session_reused: 1991 of 1995 reused). The plaintext
#              server shows what a connection costs without TLS.
#   pipelined  `wrk -t1 -c64` with 16 requests per write: netrun gathers a
#              read's answers into one TLS record (nginx writes one each).
#   full       4 x `openssl s_time -new -www /`: new full handshakes (X25519
#              + an ECDSA P-256 signature, no session offered) and one
#              request each; wrk cannot turn resumption off, and s_time is
#              OpenSSL's own client, so both servers face the same one.
#              Handshakes per server CPU-second.
# Kernel TLS is not measured: netrun's TLS runs over memory BIOs (OpenSSL's
# kTLS needs its socket BIO), and this machine has no tls module
# (/proc/sys/net/ipv4/tcp_available_ulp lists no "tls").
#   bash bench/run_https.sh [DURATION_S] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
DUR=${1:-10}
RUNS=${2:-3}
bash scripts/deps.sh wrk nginx openssl >/dev/null

source bench/lib.sh
bench_init https

cmake -S . -B build/http-bench -DCMAKE_BUILD_TYPE=Release -DNETRUN_BENCH=OFF >/dev/null
cmake --build build/http-bench -j2 --target netrun_bin >/dev/null
bash spec/fixtures/tls/make_certs.sh "$work/certs"
cat > "$work/pipeline.lua" <<'EOF2'
-- 16 requests per write; wrk counts each response.
init = function(args)
  local r = {}
  for i = 1, 16 do r[i] = wrk.format(nil, "/") end
  req = table.concat(r)
end
request = function() return req end
EOF2
cert=$work/certs/server.crt key=$work/certs/server.key

mkdir -p "$work/nginx/logs"
cat > "$work/nginx/nginx.conf" <<EOF
worker_processes 1;
daemon off;
error_log stderr error;
pid nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  keepalive_requests 100000000;
  server {
    listen 127.0.0.1:18283 ssl;
    ssl_certificate $cert;
    ssl_certificate_key $key;
    ssl_protocols TLSv1.3;
    ssl_ecdh_curve X25519;
    ssl_conf_command Ciphersuites TLS_AES_128_GCM_SHA256;
    location / { default_type text/plain; return 200 "Hello, World!"; }
  }
}
EOF

wrk_args() {   # MODE URL
  if [[ $1 == resumed ]]; then
    echo "-c16 $2"
  else
    echo "-c64 $2"
  fi
}

# load MODE URL SECONDS: run the load; prints "requests req_s p99".
load() {
  local mode=$1 url=$2 secs=$3 out
  if [[ $mode == full ]]; then
    local hostport=${url#https://}
    hostport=${hostport%/}
    for _ in 1 2 3 4; do
      taskset -c 1 openssl s_time -connect "$hostport" -new -www / -time "$secs" 2>/dev/null |
        awk '/connections in .* real seconds/ {print $1}' &
    done | awk -v s="$secs" '{ n += $1 } END { printf "%d %.0f -\n", n, n / s }'
    return
  fi
  local hdr=()
  [[ $mode == resumed ]] && hdr=(-H "Connection: close")
  [[ $mode == pipelined ]] && hdr=(-s "$work/pipeline.lua")
  # shellcheck disable=SC2046
  out=$(taskset -c 1 wrk -t1 -d${secs}s --latency "${hdr[@]}" $(wrk_args "$mode" "$url"))
  awk '/requests in/ {r = $1} /^Requests\/sec/ {s = $2} $1 == "99%" {p = $2}
       END { print r, s, p }' <<<"$out"
}

# one MODE URL PIDS...: one run; prints "per_cpu_s req_s p99".
one() {
  local mode=$1 url=$2; shift 2
  local t0 t1 reqs rps p99
  t0=$(ticks "$@")
  read -r reqs rps p99 <<<"$(load "$mode" "$url" "$DUR")"
  t1=$(ticks "$@")
  awk -v r="$reqs" -v t=$((t1 - t0)) -v hz="$hz" -v rps="$rps" -v p99="$p99" \
    'BEGIN { printf "%d %s %s\n", (t > 0 ? r / (t / hz) : 0), rps, p99 }'
}

warm() {   # MODE URL
  load "$1" "$2" 2 >/dev/null
}

names=("nginx return 200 (TLS 1.3)" "netrun https_hello.lua" "netrun http_hello.lua (plaintext)")
urls=("https://127.0.0.1:18283/" "https://127.0.0.1:18281/" "http://127.0.0.1:18282/")
declare -A procs
taskset -c 0 nginx -p "$work/nginx" -c nginx.conf 2>"$work/nginx/err.log" &
pids+=($!)
taskset -c 0 build/http-bench/bin/netrun examples/https_hello.lua --port 18281 --threads 1 \
  --cert "$cert" --key "$key" >/dev/null 2>&1 &
pids+=($!); procs[1]=$!
taskset -c 0 build/http-bench/bin/netrun examples/http_hello.lua --port 18282 --threads 1 \
  >/dev/null 2>&1 &
pids+=($!); procs[2]=$!
for p in 18283 18281 18282; do wait_port "$p"; done
procs[0]="${pids[0]} $(pgrep -P "${pids[0]}" | head -1)"   # master and worker

# The negotiated parameters, as a check that both TLS servers agree.
for port in 18283 18281; do
  echo | timeout 5 openssl s_client -connect 127.0.0.1:$port 2>/dev/null |
    awk -v p=$port '/^New, / {printf "port %s: %s ", p, $0} /Server Temp Key/ {print $0}'
done

modes=(keepalive pipelined resumed full)
declare -A row runs every
for mode in "${modes[@]}"; do
  for i in "${!names[@]}"; do
    [[ $mode == full && ${urls[$i]} == http:* ]] || warm "$mode" "${urls[$i]}"
  done
  for _ in $(seq "$RUNS"); do
    for i in "${!names[@]}"; do
      [[ $mode == full && ${urls[$i]} == http:* ]] && continue
      # shellcheck disable=SC2086
      runs[$i]+="$(one "$mode" "${urls[$i]}" ${procs[$i]})"$'\n'
    done
  done
  for i in "${!names[@]}"; do
    [[ -z ${runs[$i]:-} ]] && { row[${names[$i]},$mode]="- - -"; every[${names[$i]},$mode]="-"; continue; }
    row[${names[$i]},$mode]=$(printf '%s' "${runs[$i]}" | sort -n | sed -n "$(((RUNS + 1) / 2))p")
    every[${names[$i]},$mode]=$(printf '%s' "${runs[$i]}" | cut -d' ' -f1 | paste -sd' ')
    runs[$i]=""
  done
done

echo
echo "HTTPS hello, wrk -t1 -d${DUR}s, median of $RUNS; $(date -u '+%F %H:%M UTC'); load: $(uptime | sed 's/.*load average: //')"
echo
echo "| server | workload | req/s | p99 | per server CPU-s | vs nginx |"
echo "|---|---|---:|---:|---:|---:|"
for mode in "${modes[@]}"; do
  base=$(cut -d' ' -f1 <<<"${row[${names[0]},$mode]}")
  case $mode in
    keepalive) label="keep-alive, 64 conns" ;;
    pipelined) label="16 pipelined, 64 conns" ;;
    resumed) label="resumed handshake + request, 16 conns" ;;
    full) label="full handshake + request, 4 s_time" ;;
  esac
  for name in "${names[@]}"; do
    read -r per rps p99 <<<"${row[$name,$mode]}"
    printf '| %s | %s | %s | %s | %s | %s |\n' "$name" "$label" "$rps" "$p99" "$per" \
      "$(awk -v a="$per" -v b="$base" 'BEGIN { if (a == "-") print "-"; else printf "%.2f", (b > 0 ? a / b : 0) }')"
  done
done
echo
echo "Every run, per server CPU-second, in order:"
for name in "${names[@]}"; do
  for mode in "${modes[@]}"; do
    echo "- $name, $mode: ${every[$name,$mode]}"
  done
done
