# bench/lib.sh -- what the bench/run_*.sh scripts share (sourced, not run):
# a scratch directory and the processes to stop when the script exits, the
# server CPU time DESIGN.md §7 divides by, and waiting for a port.
#   source "$(dirname "$0")/lib.sh"; bench_init NAME

# bench_init NAME: $work, a fresh directory removed on exit, and $pids,
# the processes killed on exit (append with pids+=($!)).
bench_init() {
  work=$(mktemp -d "/tmp/netrun-$1-bench.XXXXXX")
  pids=()
  trap bench_cleanup EXIT
}

bench_cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}

# ticks PID...: their summed utime+stime, in clock ticks ($hz a second).
ticks() {
  local t=0 p
  for p in "$@"; do
    t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$t"
}
hz=$(getconf CLK_TCK)

# wait_port PORT: until something accepts on 127.0.0.1:PORT (10 s at most).
wait_port() {
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "server on port $1 never came up" >&2
  return 1
}
