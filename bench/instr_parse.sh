#!/usr/bin/env bash
# bench/instr_parse.sh -- instructions per request of the HTTP/1.1 request
# parser alone (bench/bench_http_parse.c under callgrind): every function
# of runtime/codec/http_parse.c, and the SSE2 intrinsics inlined into them
# (callgrind files those under emmintrin.h), divided by the requests.
#   BUILD=build/test bash bench/instr_parse.sh      (a NETRUN_BENCH build)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$here/build/test}
cmake --build "$build" -j2 --target bench_http_parse >/dev/null
out=$(mktemp -d /tmp/netrun-parse.XXXXXX)
trap 'rm -rf "$out"' EXIT
echo "| request | parser instructions/request | nr_http_feed's own |"
echo "|---|---:|---:|"
for req in wrk browser; do
  n=$("$build/bench/bench_http_parse" "$req" 1 | awk '{print $1}')
  valgrind --tool=callgrind --callgrind-out-file="$out/cg.$req" \
    "$build/bench/bench_http_parse" "$req" 2000 >/dev/null 2>&1
  callgrind_annotate --auto=no "$out/cg.$req" | awk -v req="$req" -v n=$((n * 2000)) '
    /%\)/ && (/http_parse\.c:/ || /emmintrin\.h:/) {
      c = $1; gsub(",", "", c); all += c; if ($0 ~ /:nr_http_feed( |$)/ && $0 ~ /http_parse\.c/) own += c }
    END { printf "| %s | %.1f | %.1f |\n", req, all / n, own / n }'
done
