#!/usr/bin/env bash
# bench/instr.sh -- instructions and syscalls per request for the pipelined
# HTTP and RESP workloads (issue 17), for netrun and the servers it is
# compared with. Instruction counts do not depend on the machine's load, so
# this is the measurement to use on a shared machine (DESIGN.md §7's timed
# runs are bench/run_http.sh and bench/run_redis.sh).
#
# Each server runs under `valgrind --tool=callgrind --instr-atstart=no`;
# after a short warm-up, `callgrind_control -i on`, a bounded load, `-i off`,
# and the instructions counted in between are divided by the requests
# answered. Then the same load again under `strace -c -f` for syscalls per
# request. Loads: HTTP, wrk -t1 -c16 sending 16 pipelined requests per
# write; RESP, redis-benchmark -c16 -P 16 -n N for SET and GET; the
# reverse proxies (examples/proxy.lua, nginx proxy_pass with upstream
# keep-alive, both with one worker, as bench/run_proxy.sh) in front of the
# C baseline, wrk -t1 -c16 unpipelined (the backend is not measured).
#
#   bench/instr.sh [CASES...]   cases: c prepared observed table dynamic luv redis-set
#                               redis-get netrun-set netrun-get proxy
#                               nginx-proxy client client-https (default all)
#
# The client cases measure the client instead: examples/fetch.lua
# (callbacks, 64 in flight -- 8 for https --, one loop) under callgrind
# from its start,
# fetching CLIENT_N and 3 x CLIENT_N requests; the difference of the two
# totals divided by the 2 x CLIENT_N requests between them leaves out the
# start-up and the exit. `client` fetches from the C baseline (plain
# HTTP), `client-https` from examples/https_hello.lua with the test
# certificates (TLS 1.3, --ca). No syscall count for them.
#   PIPE=1 bench/instr.sh ...   the same unpipelined (wrk without the
#                               script, redis-benchmark -P 1)
#   BUILD=build/test            use that netrun build (default: build/instr)
#   KEEP=DIR                    keep the callgrind files there
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
CASES=("$@")
((${#CASES[@]})) || CASES=(c prepared table dynamic luv redis-set redis-get netrun-set netrun-get
                           proxy nginx-proxy client client-https)
N=${N:-100000}          # RESP requests per measured run
PIPE=${PIPE:-16}        # requests in flight per connection (16 or 1)
DUR=${DUR:-3}           # seconds of wrk per measured run
build=${BUILD:-$here/build/instr}
source "$here/bench/lib.sh"      # (nginx_proxy_conf; its wait_port is replaced below)
bash "$here/scripts/deps.sh" valgrind strace wrk redis-server redis-tools lua-luv nginx >/dev/null
cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNETRUN_BENCH=OFF \
  -DNETRUN_ASAN=OFF -DNETRUN_TSAN=OFF >/dev/null
cmake --build "$build" -j2 --target netrun_bin >/dev/null
work=$(mktemp -d /tmp/netrun-instr.XXXXXX)
cc -O2 -g -o "$work/http_baseline" "$here/bench/http_baseline.c"
spid="" bpid=""
cleanup() {
  [[ -z $spid ]] || kill "$spid" 2>/dev/null || true
  [[ -z ${hpid:-} ]] || kill "$hpid" 2>/dev/null || true
  [[ -z $bpid ]] || kill "$bpid" 2>/dev/null || true
  wait 2>/dev/null || true; rm -rf "$work"
}
trap cleanup EXIT

cat > "$work/pipeline.lua" <<'LUA'
init = function(args)
  local r = {}
  for i = 1, 16 do r[i] = wrk.format(nil, "/") end
  req = table.concat(r)
end
request = function() return req end
LUA

server_cmd() {   # $1 case, $2 port: the server's command line
  case $1 in
    c) echo "$work/http_baseline $2" ;;
    prepared) echo "$build/bin/netrun $here/examples/http_hello.lua --port $2 --threads 1" ;;
    table) echo "$build/bin/netrun $here/examples/http_hello.lua --port $2 --threads 1 --response table" ;;
    observed) echo "$build/bin/netrun $here/examples/http_hello.lua --port $2 --threads 1 \
      --observe $work/access.log" ;;
    dynamic) echo "$build/bin/netrun $here/examples/http_hello.lua --port $2 --threads 1 \
      --response dynamic" ;;
    luv) echo "lua5.4 $here/bench/luv_http.lua $2" ;;
    redis-*) echo "redis-server --port $2 --bind 127.0.0.1 --save '' --appendonly no" ;;
    netrun-*) echo "$build/bin/netrun $here/examples/redis.lua --port $2 --threads 1" ;;
    proxy) echo "$build/bin/netrun $here/examples/proxy.lua --port $2 --threads 1 \
      --backend 127.0.0.1:$BACKEND" ;;
    nginx-proxy) nginx_conf "$2"; echo "nginx -p $work/nginx -c nginx.conf" ;;
  esac
}

# The proxies' backend: the C baseline, started once, outside the tools.
# Ports below the ephemeral range (32768 up): a port there may be some
# client's, and the bind fails.
BACKEND=$((20000 + RANDOM % 12000))
backend() {
  [[ -z $bpid ]] || return 0
  "$work/http_baseline" "$BACKEND" 2>/dev/null &
  bpid=$!
  wait_port "$BACKEND"
}

# nginx as bench/run_proxy.sh runs it, in one process (no master), so
# that the tools see the worker.
nginx_conf() { nginx_proxy_conf "$work/nginx" "$1" "$BACKEND" "master_process off;"; }

wait_port() {
  for _ in $(seq 1200); do   # 60 s: valgrind starts slowly on a busy machine
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "instr: server on port $1 never came up" >&2
  tail -5 "$work"/log.* >&2 2>/dev/null; exit 1
}

load() {   # $1 case, $2 port, $3 seconds/requests scale: prints requests answered
  case $1 in
    c|prepared|observed|table|dynamic|luv|proxy|nginx-proxy)
      local script=(-s "$work/pipeline.lua")
      [[ $PIPE == 16 && $1 != *proxy ]] || script=()
      timeout 60 wrk -t1 -c16 -d"$3"s "${script[@]}" "http://127.0.0.1:$2/" |
        awk '/requests in/ { print $1 }' ;;
    *-set|*-get)
      timeout 300 redis-benchmark -p "$2" -c 16 -P "$PIPE" -n "$3" -t "${1#*-}" -q >/dev/null
      echo "$3" ;;
  esac
}

# Server ports are drawn below the ephemeral range (32768-): a port above
# it may be a client's, and the server's bind then fails.
instr_one() {   # $1 case: prints "instructions/request"
  local port=$((20000 + RANDOM % 12000)) out=$work/cg.$1 reqs ir scale warm
  bash -c "exec valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=$out \
    $(server_cmd "$1" "$port")" >"$work/log.$1" 2>&1 &
  spid=$!
  wait_port "$port"
  case $1 in *-set|*-get) scale=$N warm=2000 ;; *) scale=$DUR warm=1 ;; esac
  load "$1" "$port" "$warm" >/dev/null
  callgrind_control -i on "$spid" >/dev/null
  reqs=$(load "$1" "$port" "$scale")
  callgrind_control -i off "$spid" >/dev/null
  callgrind_control -d "$spid" >/dev/null   # the C server dies of SIGTERM undumped
  kill -TERM "$spid"; wait "$spid" 2>/dev/null || true; spid=""
  ir=$(cat "$out"* | awk '/^totals:/ { s += $2 } END { print s }')
  [[ -z ${KEEP:-} ]] || cp "$out".* "$KEEP/"
  awk -v i="$ir" -v r="$reqs" 'BEGIN { printf "%.0f %d\n", i / r, r }'
}

sys_one() {   # $1 case: prints "syscalls/request"
  local port=$((20000 + RANDOM % 12000)) reqs calls scale
  bash -c "exec strace -f -c -o $work/st.$1 $(server_cmd "$1" "$port")" >/dev/null 2>&1 &
  spid=$!
  local child
  wait_port "$port"
  case $1 in *-set|*-get) scale=$N ;; *) scale=2 ;; esac
  reqs=$(load "$1" "$port" "$scale")
  child=$(pgrep -P "$spid" | head -1)   # the server: strace prints when it ends
  kill -TERM "$child"; wait "$spid" 2>/dev/null || true; spid=""
  calls=$(awk '$NF == "total" { print $4 }' "$work/st.$1")
  awk -v c="$calls" -v r="$reqs" 'BEGIN { printf "%.3f\n", c / r }'
  grep -E 'read|write|epoll|send|recv' "$work/st.$1" >&2 || true
}

CLIENT_N=${CLIENT_N:-10000}
client_run() {   # $1 requests, $2 URL, $3... fetch options: prints the
                 # instructions and the requests answered
  local out=$work/cg.client.$1 ok conc=64
  # https: 8 connections, whose handshakes (a second each under valgrind)
  # end well within the server's 60 s wait for a first request
  [[ $2 != https* ]] || conc=8
  valgrind --tool=callgrind --callgrind-out-file="$out" "$build/bin/netrun" \
    "$here/examples/fetch.lua" --url "$2" --requests "$1" --concurrency $conc --api callback \
    --timeout 600 \
    "${@:3}" >"$work/log.client" 2>&1
  ok=$(sed -n 's/^requests=\([0-9]*\) .*/\1/p' "$work/log.client")
  # (a request or two may fail under valgrind's slowness: counted out)
  [[ -n $ok ]] && ((ok * 100 >= $1 * 99)) || { cat "$work/log.client" >&2; exit 1; }
  echo "$(cat "$out"* | awk '/^totals:/ { s += $2 } END { print s }') $ok"
  rm -f "$out"*
}
hpid=""
https_server() {   # the HTTPS server of client-https, started once
  [[ -z $hpid ]] || return 0
  bash "$here/spec/fixtures/tls/make_certs.sh" "$work/certs" >/dev/null
  HTTPS=$((20000 + RANDOM % 12000))
  "$build/bin/netrun" "$here/examples/https_hello.lua" --port "$HTTPS" --threads 1 \
    --cert "$work/certs/server.crt" --key "$work/certs/server.key" >/dev/null 2>&1 &
  hpid=$!
  wait_port "$HTTPS"
}
client_one() {   # $1 case: prints "instructions/request requests"
  local url=http://127.0.0.1:$BACKEND/ opts=() a b
  if [[ $1 == client-https ]]; then
    url=https://127.0.0.1:$HTTPS/ opts=(--ca "$work/certs/ca.crt")
  fi
  read -r a na < <(client_run "$CLIENT_N" "$url" "${opts[@]}")
  read -r b nb < <(client_run $((3 * CLIENT_N)) "$url" "${opts[@]}")
  awk -v a="$a" -v b="$b" -v n=$((nb - na)) 'BEGIN { printf "%.0f %d\n", (b - a) / n, n }'
}

echo "| case | instructions/request | requests measured | syscalls/request |"
echo "|---|---:|---:|---:|"
for c in "${CASES[@]}"; do
  if [[ $c == client* ]]; then
    backend
    [[ $c != client-https ]] || https_server
    read -r ipr reqs < <(client_one "$c")
    echo "| $c | $ipr | $reqs | -- |"
    continue
  fi
  [[ $c != *proxy ]] || backend
  read -r ipr reqs < <(instr_one "$c")
  spr=$(sys_one "$c")
  echo "| $c | $ipr | $reqs | $spr |"
done
