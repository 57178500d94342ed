#!/usr/bin/env bash
# bench/instr_h2.sh -- instructions per HTTP/2 request (h2c, prior
# knowledge) for netrun and the servers it is compared with, counted by
# callgrind as bench/instr.sh counts them for HTTP/1.1: each server under
# `valgrind --tool=callgrind --instr-atstart=no`, a warm-up, `-i on`,
# h2load -c C -m M -n N (default -c 64 -m 16, DESIGN.md §9.8's load),
# `-i off`, and the instructions counted in between divided by the
# requests answered. Instruction counts do not depend on the machine's
# load, so this is the comparison to make on a shared machine.
#
#   bench/instr_h2.sh [CASES...]   cases: baseline (bench/h2_baseline.c:
#       nghttp2 and epoll, no more), nginx (`return 200`), h2o-file (a
#       13-byte file), h2o-mruby, prepared, table (examples/http_hello.lua:
#       a Lua handler per request) -- default all
#   N=40000 C=64 M=16 BUILD=build/instr
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
CASES=("$@")
((${#CASES[@]})) || CASES=(baseline nginx h2o-file h2o-mruby prepared table)
N=${N:-40000} C=${C:-64} M=${M:-16}
build=${BUILD:-$here/build/instr}
work=$(mktemp -d /tmp/netrun-instr-h2.XXXXXX)
spid=""
cleanup() {
  [[ -z $spid ]] || kill "$spid" 2>/dev/null || true
  wait 2>/dev/null || true; [[ -n ${KEEPWORK:-} ]] || rm -rf "$work"
}
trap cleanup EXIT
if [[ " ${CASES[*]} " == *" prepared "* || " ${CASES[*]} " == *" table "* ]]; then
  cmake -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNETRUN_BENCH=OFF \
    -DNETRUN_ASAN=OFF -DNETRUN_TSAN=OFF >/dev/null
  cmake --build "$build" -j2 --target netrun_bin >/dev/null
fi
cc -O2 -g -o "$work/h2_baseline" "$here/bench/h2_baseline.c" -lnghttp2
printf 'Hello, World!' > "$work/hello.txt"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj /CN=localhost -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null

conf() {   # $1 template, $2 port, $3 top directive / h2o handler: the config's path
  local out=$work/$(basename "$1" .in)
  sed -e "s|@PORT@|$2|; s|@TLS_PORT@|$(($2 + 1))|; s|@CERT@|$work/cert.pem|" \
      -e "s|@KEY@|$work/key.pem|; s|@DIR@|$work|; s|@TOP@|$3|; s|@USER@|$(id -un)|" "$1" > "$out"
  echo "$out"
}

h2o_conf() {   # $1 port, $2 file|mruby
  local c
  c=$(conf "$here/bench/h2/h2o.conf.in" "$1" "")
  if [[ $2 == file ]]; then
    sed -i "s|@HANDLER@|        file.file: $work/hello.txt|" "$c"
  else
    sed -i "s|@HANDLER@|        mruby.handler: Proc.new { [200, {\"content-type\" => \"text/plain\"}, [\"Hello, World!\"]] }|" "$c"
  fi
  echo "$c"
}

server_cmd() {   # $1 case, $2 port
  case $1 in
    baseline) echo "$work/h2_baseline $2" ;;
    nginx) mkdir -p "$work/logs"
           echo "nginx -p $work -c $(conf "$here/bench/h2/nginx.conf.in" "$2" "master_process off;")" ;;
    h2o-file) echo "h2o -m worker -c $(h2o_conf "$2" file)" ;;
    h2o-mruby) echo "h2o -m worker -c $(h2o_conf "$2" mruby)" ;;
    prepared) echo "$build/bin/netrun $here/examples/http_hello.lua --port $2 --threads 1" ;;
    table) echo "$build/bin/netrun $here/examples/http_hello.lua --port $2 --threads 1 --response table" ;;
  esac
}

wait_port() {
  for _ in $(seq 1200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "instr_h2: server on port $1 never came up" >&2
  tail -5 "$work"/log.* >&2 2>/dev/null; exit 1
}

load() {   # $1 port, $2 requests: prints the requests that succeeded
  timeout 600 h2load -c "$C" -m "$M" -n "$2" "http://127.0.0.1:$1/" |
    awk '/^requests:/ { print $8 }'
}

instr_one() {   # $1 case: prints "instructions/request requests"
  local port=$((20000 + RANDOM % 12000)) out=$work/cg.$1 reqs ir
  bash -c "exec valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=$out \
    $(server_cmd "$1" "$port")" >"$work/log.$1" 2>&1 &
  spid=$!
  wait_port "$port"
  load "$port" 2000 >/dev/null
  callgrind_control -i on "$spid" >/dev/null 2>&1
  reqs=$(load "$port" "$N")
  callgrind_control -i off "$spid" >/dev/null 2>&1
  callgrind_control -d "$spid" >/dev/null 2>&1
  kill -TERM "$spid"; wait "$spid" 2>/dev/null || true; spid=""
  ir=$(cat "$out"* | awk '/^totals:/ { s += $2 } END { print s }')
  [[ -z ${KEEP:-} ]] || cp "$out".* "$KEEP/"
  awk -v i="$ir" -v r="$reqs" 'BEGIN { printf "%.0f %d\n", i / r, r }'
}

echo "| case | instructions/request | requests measured |"
echo "|---|---:|---:|"
for c in "${CASES[@]}"; do
  read -r ipr reqs < <(instr_one "$c")
  echo "| $c | $ipr | $reqs |"
done
