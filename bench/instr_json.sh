#!/usr/bin/env bash
# bench/instr_json.sh -- instructions per netrun.json.encode and per
# netrun.json.decode of bench/json.lua's typical object: callgrind counts
# the whole process for N and for 0 iterations, and the difference is
# divided by N (start-up and the one encode that makes the text cancel).
#   BUILD=build bash bench/instr_json.sh        (default N=20000)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$here/build}
N=${N:-20000}
out=$(mktemp -d /tmp/netrun-json.XXXXXX)
trap 'rm -rf "$out"' EXIT
count() {   # $1 iterations, $2 encode|decode: instructions of the whole run
  valgrind --tool=callgrind --callgrind-out-file="$out/cg" \
    "$build/bin/netrun" "$here/bench/json.lua" "$1" "$2" >/dev/null 2>&1
  callgrind_annotate --auto=no "$out/cg" | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'
}
echo "| operation | instructions/op |"
echo "|---|---:|"
for op in encode decode; do
  a=$(count 0 "$op"); b=$(count "$N" "$op")
  echo "| $op | $(( (b - a) / N )) |"
done
