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

# nginx_proxy_conf DIR PORT BACKEND_PORT [DIRECTIVE...]: DIR/nginx.conf
# (and DIR/logs) for nginx as the proxy benchmarks run it: one worker,
# proxy_pass with upstream keep-alive to 127.0.0.1:BACKEND_PORT, listening
# on 127.0.0.1:PORT; each DIRECTIVE is added at the top level (e.g.
# "master_process off;", so that a tool sees the worker).
nginx_proxy_conf() {
  local dir=$1 port=$2 backend=$3 d
  shift 3
  mkdir -p "$dir/logs"
  {
    for d in "$@"; do echo "$d"; done
    cat <<CONF
worker_processes 1;
daemon off;
error_log stderr error;
pid nginx.pid;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 100000000;
  upstream backend { server 127.0.0.1:$backend; keepalive 64; keepalive_requests 100000000; }
  server {
    listen 127.0.0.1:$port;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering on;
    }
  }
}
CONF
  } > "$dir/nginx.conf"
}
