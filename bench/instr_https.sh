#!/usr/bin/env bash
# bench/instr_https.sh -- instructions and syscalls per new HTTPS connection
# (issue 13) for netrun examples/https_hello.lua and nginx (one process,
# `daemon off; master_process off;`), configured as in bench/run_https.sh.
# Instruction counts do not depend on the machine's load.
#
# Loads (each a bounded count of connections, one request each):
#   full     openssl s_time -new: full TLS 1.3 handshakes (X25519 + P-256
#            signature), one request per connection.
#   resumed  wrk -t1 -c1 -H "Connection: close": ticket resumptions (one
#            connection at a time: at most one cut off at the end).
# Each server runs under `valgrind --tool=callgrind --instr-atstart=no`;
# after a warm-up, `callgrind_control -i on`, the load, `-i off`, and the
# instructions counted in between divided by connections. Then the same load
# under `strace -c -f` for syscalls per connection.
#   bench/instr_https.sh [CASES...]   cases: netrun-full netrun-resumed
#                                     nginx-full nginx-resumed (default all)
#   BUILD=build/test  use that netrun build (default: build/instr)
#   KEEP=DIR          keep the callgrind files there
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
CASES=("$@")
((${#CASES[@]})) || CASES=(netrun-full nginx-full netrun-resumed nginx-resumed)
DUR=${DUR:-3}           # seconds of load per measured run
build=${BUILD:-$here/build/instr}
bash "$here/scripts/deps.sh" valgrind strace wrk nginx openssl >/dev/null
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNETRUN_BENCH=OFF \
  -DNETRUN_ASAN=OFF -DNETRUN_TSAN=OFF >/dev/null
cmake --build "$build" -j2 --target netrun_bin >/dev/null
work=$(mktemp -d /tmp/netrun-instr-https.XXXXXX)
spid=""
cleanup() { [[ -z $spid ]] || kill "$spid" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
bash "$here/spec/fixtures/tls/make_certs.sh" "$work/certs" >/dev/null
cert=$work/certs/server.crt key=$work/certs/server.key

nginx_conf() {   # $1 port
  mkdir -p "$work/nginx/logs"
  cat > "$work/nginx/nginx.conf" <<NGX
worker_processes 1;
daemon off;
master_process off;
error_log stderr error;
pid nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  keepalive_requests 100000000;
  server {
    listen 127.0.0.1:$1 ssl;
    ssl_certificate $cert;
    ssl_certificate_key $key;
    ssl_protocols TLSv1.3;
    ssl_ecdh_curve X25519;
    ssl_conf_command Ciphersuites TLS_AES_128_GCM_SHA256;
    location / { default_type text/plain; return 200 "Hello, World!"; }
  }
}
NGX
}

server_cmd() {   # $1 case, $2 port
  case $1 in
    netrun-*) echo "$build/bin/netrun $here/examples/https_hello.lua --port $2 --threads 1 --cert $cert --key $key" ;;
    nginx-*) nginx_conf "$2"; echo "nginx -p $work/nginx -c nginx.conf" ;;
  esac
}

wait_port() {
  for _ in $(seq 400); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "instr_https: server on port $1 never came up" >&2; exit 1
}

load() {   # $1 case, $2 port, $3 seconds: prints connections made
  case $1 in
    *-full)
      timeout 60 openssl s_time -connect "127.0.0.1:$2" -new -www / -time "$3" 2>/dev/null |
        awk '/connections in .* real seconds/ { print $1 }' ;;
    *-resumed)
      timeout 60 wrk -t1 -c1 -d"$3"s -H "Connection: close" "https://127.0.0.1:$2/" |
        awk '/requests in/ { print $1 }' ;;
  esac
}

instr_one() {   # $1 case: prints "instructions/connection connections"
  local port=$((20000 + RANDOM % 12000)) out=$work/cg.$1 conns ir cmd
  cmd=$(server_cmd "$1" "$port")
  bash -c "exec valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=$out $cmd" \
    >"$work/log.$1" 2>&1 &
  spid=$!
  wait_port "$port"
  load "$1" "$port" 1 >/dev/null
  callgrind_control -i on "$spid" >/dev/null
  conns=$(load "$1" "$port" "$DUR")
  callgrind_control -i off "$spid" >/dev/null
  callgrind_control -d "$spid" >/dev/null
  kill -TERM "$spid"; wait "$spid" 2>/dev/null || true; spid=""
  ir=$(cat "$out"* | awk '/^totals:/ { s += $2 } END { print s }')
  [[ -z ${KEEP:-} ]] || cp "$out".* "$KEEP/"
  awk -v i="$ir" -v r="$conns" 'BEGIN { printf "%.0f %d\n", i / r, r }'
}

sys_one() {   # $1 case: prints "syscalls/connection"
  local port=$((20000 + RANDOM % 12000)) conns calls cmd child
  cmd=$(server_cmd "$1" "$port")
  bash -c "exec strace -f -c -o $work/st.$1 $cmd" >/dev/null 2>&1 &
  spid=$!
  wait_port "$port"
  conns=$(load "$1" "$port" 2)
  child=$(pgrep -P "$spid" | head -1)
  kill -TERM "$child"; wait "$spid" 2>/dev/null || true; spid=""
  calls=$(awk '$NF == "total" { print $4 }' "$work/st.$1")
  awk -v c="$calls" -v r="$conns" 'BEGIN { printf "%.2f\n", c / r }'
  [[ -z ${KEEP:-} ]] || cp "$work/st.$1" "$KEEP/"
}

echo "| case | instructions/connection | connections measured | syscalls/connection |"
echo "|---|---:|---:|---:|"
for c in "${CASES[@]}"; do
  read -r ipc conns < <(instr_one "$c")
  spc=$(sys_one "$c")
  echo "| $c | $ipc | $conns | $spc |"
done
