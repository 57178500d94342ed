#!/usr/bin/env bash
# Builds netrun and runs the whole test suite under ctest: a plain build, an
# AddressSanitizer+UBSan build, and a ThreadSanitizer build of the
# concurrent tests. Installs missing Debian packages first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
jobs=$(nproc)

run() {  # run BUILD_DIR CMAKE_ARGS... -- CTEST_ARGS...
  local dir=$1; shift
  local cm=()
  while (($#)) && [[ $1 != -- ]]; do cm+=("$1"); shift; done
  shift || true
  cmake -S . -B "$dir" -DNETRUN_BENCH=OFF "${cm[@]}" >/dev/null
  cmake --build "$dir" -j "$jobs" >/dev/null
  echo "== ctest: $dir"
  ctest --test-dir "$dir" --output-on-failure "$@"
}

# A short, bounded run of every libFuzzer target (needs clang).
if command -v clang >/dev/null; then
  bash scripts/fuzz.sh 5
fi

run build/test-asan -DNETRUN_ASAN=ON -DCMAKE_BUILD_TYPE=Debug --
run build/test-tsan -DNETRUN_TSAN=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -- -L concurrent
run build/test -DCMAKE_BUILD_TYPE=RelWithDebInfo --
