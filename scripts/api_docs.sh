#!/usr/bin/env bash
# Builds the API reference with LDoc into BUILD_DIR/docs/api and checks it
# (the ctest test docs/api; docs/hacking.md, "The API reference"):
#   1. ldoc with docs/config.ld; any LDoc warning fails;
#   2. ldoc again with docs/ldoc_items.lua as filter: the documented items;
#   3. docs/check_api.lua holds them against the live API of netrun built in
#      BUILD_DIR: an undocumented public function, or a documented one that
#      is gone, fails.
# Usage: scripts/api_docs.sh [BUILD_DIR]   (default: build)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-build}" && pwd)
command -v ldoc >/dev/null || { echo "api_docs: ldoc not found (apt-get install lua-ldoc: scripts/deps.sh)" >&2; exit 1; }
out=$build/docs/api
mkdir -p "$out"
log=$build/docs/ldoc.log
cd "$root/docs"
# LDoc prints its warnings as FILE:LINE: ... and --fatalwarnings makes them
# fail; its notes about merged modules are not warnings.
if ! ldoc --fatalwarnings --testing -d "$out" . >"$log" 2>&1 ||
   grep -v -E '^(reading configuration from|output written to|found master module|\*\*\*closing section from master module)' "$log" | grep -q .; then
  cat "$log" >&2
  echo "api_docs: LDoc reported the problems above" >&2
  exit 1
fi
items=$build/docs/api-items.tsv
NETRUN_API_ITEMS=$items LUA_PATH="$root/docs/?.lua;;" ldoc --testing --filter ldoc_items.filter . >/dev/null
# In the executable built there, so that sanitizer builds check too.
"$build/bin/netrun" "$root/docs/check_api.lua" "$items" "$build"
echo "api_docs: $out/index.html"
