#!/usr/bin/env bash
# spec/sim/determinism.sh NETRUN FILE [SEEDS] -- the determinism check of
# a file of simulated scenarios (spec/sim/*.lua): `netrun --sim SEEDS
# FILE` twice, in two processes; every scenario must pass for every seed
# (default 1-100) and each run of a seed must leave the same trace hash
# (netrun --sim prints one line per seed and scenario). Prints the first
# line that differs, with the command that replays it.
set -uo pipefail
bin=$1 file=$2 seeds=${3:-1-100}
a=$(mktemp) b=$(mktemp)
trap 'rm -f "$a" "$b"' EXIT
for out in "$a" "$b"; do
  if ! NETRUN_SIM_REPORT=1 "$bin" --sim "$seeds" "$file" >/dev/null 2>"$out"; then
    grep -v '^netrun --sim: seed' "$out" | tail -20 >&2
    exit 1
  fi
done
lines=$(grep -c '^netrun --sim: seed .*: trace ' "$a")
if ! diff -q <(grep '^netrun --sim: seed' "$a") <(grep '^netrun --sim: seed' "$b") >/dev/null; then
  echo "determinism: $file: two runs differ:" >&2
  diff <(grep '^netrun --sim: seed' "$a") <(grep '^netrun --sim: seed' "$b") | head -4 >&2
  echo "(find where with NETRUN_SIM_TRACE=FILE and NETRUN_SIM_ONLY=SCENARIO, netrun --sim SEED $file)" >&2
  exit 1
fi
echo "determinism: $file: $lines runs (seeds $seeds), twice each: same trace hashes"
