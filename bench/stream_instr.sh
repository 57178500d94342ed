#!/usr/bin/env bash
# bench/stream_instr.sh -- instructions of the stream workloads of
# bench/stream_instr.lua (callgrind, the whole process under stock lua5.4
# with the module from the build): each runs at two sizes, and the
# difference is divided by the difference in size, so start-up and
# shutdown cancel out.
#
#   bench/stream_instr.sh [MODES]    echo: instructions per request (both
#                                    sides); line: per byte of a 1 MiB line
#                                    in 256-byte frames, and of a 64 KiB one;
#                                    connect, channel, websocket: per new
#                                    connection (both sides; default: all)
#   LUA_TREE=DIR bench/stream_instr.sh   the Lua modules of DIR/lua (another
#                                    checkout: `git archive REV lua | tar -x -C DIR`)
#   BUILD=DIR                        the build whose lib/netrun/core.so is used
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
tree=${LUA_TREE:-$here}
build=${BUILD:-$here/build}
work=$(mktemp -d /tmp/netrun-stream-instr.XXXXXX)
trap 'rm -rf "$work"' EXIT
export LUA_PATH="$tree/lua/?.lua;$tree/lua/?/init.lua;;" LUA_CPATH="$build/lib/?.so;;"

count() {   # $1 mode, $2 size: total instructions of the run
  valgrind --tool=callgrind --callgrind-out-file="$work/cg" \
    lua5.4 "$here/bench/stream_instr.lua" "$1" "$2" >/dev/null 2>&1
  awk '/^totals:/ { s += $2 } END { print s }' "$work"/cg*
  rm -f "$work"/cg*
}

per() {   # $1 mode, $2 small, $3 large, $4 unit
  local a b
  a=$(count "$1" "$2")
  b=$(count "$1" "$3")
  awk -v a="$a" -v b="$b" -v n="$(( $3 - $2 ))" -v m="$1" -v s="$3" -v u="$4" \
    'BEGIN { printf "%-5s %8d: %10.1f instructions per %s\n", m, s, (b - a) / n, u }'
}

MODES=("$@")
((${#MODES[@]})) || MODES=(echo line connect channel websocket)
for m in "${MODES[@]}"; do
  case $m in
    echo) per echo 1000 11000 request ;;
    line) per line 16384 65536 byte; per line 65536 1048576 byte ;;
    connect|channel|websocket) per "$m" 100 600 connection ;;
  esac
done
