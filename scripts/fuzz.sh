#!/usr/bin/env bash
# Builds every libFuzzer target fuzz/fuzz_<name>.c with clang
# (-fsanitize=fuzzer,address,undefined) against the runtime core sources
# (not through the main CMake build) into build/fuzz/, and runs each for
# SECONDS (default 30) on a copy of its seed corpus fuzz/corpus/<name>/, so
# the seeds in the tree stay as they are. Exits non-zero at the first target
# that fails to build or finds a crash (the reproducer is left in
# build/fuzz/<name>/).
#   bash scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
cc=${CLANG:-clang}
out=build/fuzz
mkdir -p "$out"
flags=(-g -O1 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror
       -Wmissing-prototypes -Wmissing-declarations
       -fno-sanitize-recover=undefined -Iruntime -Iruntime/bindings -Ifuzz -I/usr/include/lua5.4)
libs=(-llua5.4 -lssl -lcrypto -lz -lcares -lnghttp2 -lpthread -lm)
# The core (everything under runtime/ but the Lua bindings) is compiled once
# with the fuzzer's coverage and the sanitizers, two files at a time; each
# target then only compiles its own file and links.
mapfile -t sources < <(find runtime -name '*.c' -not -path 'runtime/bindings/*' | sort)
rm -rf "$out/obj" && mkdir -p "$out/obj"
printf '%s\n' "${sources[@]}" | xargs -P "$(nproc)" -I{} sh -c \
  'src=$1 obj=$2/obj/$(echo "$1" | tr / _).o; shift 2; exec "$@" -c -o "$obj" "$src"' \
  sh {} "$out" "$cc" "${flags[@]}" -fsanitize=fuzzer-no-link,address,undefined
objects=("$out"/obj/*.o)
for src in fuzz/fuzz_*.c; do
  target=$(basename "$src" .c)
  name=${target#fuzz_}
  echo "== fuzz: $name (${secs}s)"
  "$cc" "${flags[@]}" -fsanitize=fuzzer,address,undefined -o "$out/$target" \
    "$src" "${objects[@]}" "${libs[@]}"
  work="$out/$name"
  rm -rf "$work"
  mkdir -p "$work/corpus"
  if [[ -d fuzz/corpus/$name ]]; then
    cp -r "fuzz/corpus/$name/." "$work/corpus/"
  fi
  (cd "$work" && "../$target" -max_total_time="$secs" -timeout=10 \
     -rss_limit_mb=2048 -print_final_stats=1 corpus 2>fuzz.log) || {
    tail -n 40 "$work/fuzz.log"
    echo "fuzz: $name FAILED (log and reproducer in $work)" >&2
    exit 1
  }
  grep -E "^stat::number_of_executed_units|^Done" "$work/fuzz.log" || true
done
echo "fuzz: all targets passed"
