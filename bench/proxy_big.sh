#!/usr/bin/env bash
# proxy_big.sh -- a 1 GiB upload and a 1 GiB download through
# examples/proxy.lua (bodies streamed, the default; --max-body 0: no
# limit) in front of spec/fixtures/stream_backend.py: the bytes checked
# (sha256 at both ends) and the proxy's RSS sampled every 0.1 s, its growth
# over the idle proxy's reported (issue 30: at most 8 MiB).
#   bash bench/proxy_big.sh [SIZE_MIB]     (default 1024)
set -euo pipefail
cd "$(dirname "$0")/.."
MIB=${1:-1024}
SIZE=$((MIB * 1024 * 1024))
source bench/lib.sh
bench_init proxy-big
cmake -S . -B build/http-bench -DCMAKE_BUILD_TYPE=Release -DNETRUN_BENCH=OFF >/dev/null
cmake --build build/http-bench -j2 --target netrun_bin >/dev/null
BPORT=18290 PORT=18291
python3 spec/fixtures/stream_backend.py $BPORT >/dev/null 2>&1 &
pids+=($!)
build/http-bench/bin/netrun examples/proxy.lua --port $PORT --backend 127.0.0.1:$BPORT \
  --max-body 0 >"$work/proxy.log" 2>&1 &
ppid=$!
pids+=($ppid)
for _ in $(seq 200); do
  (exec 3<>/dev/tcp/127.0.0.1/$PORT) 2>/dev/null && (exec 3<>/dev/tcp/127.0.0.1/$BPORT) 2>/dev/null && break
  sleep 0.05
done
rss() { awk '/VmRSS/ { print $2 }' "/proc/$ppid/status"; }
# sample the proxy's RSS while $1 runs; prints "max_kib"
sampled() {
  local max=0 r
  "$@" &
  local job=$!
  while kill -0 $job 2>/dev/null; do
    r=$(rss); ((r > max)) && max=$r
    sleep 0.1
  done
  wait $job
  echo "$max" > "$work/max"
}
curl -s "http://127.0.0.1:$PORT/big/10" >/dev/null      # (a pooled connection made)
base=$(rss)
head -c "$SIZE" /dev/urandom > "$work/up"
want=$(sha256sum "$work/up" | cut -d' ' -f1)
t0=$(date +%s.%N)
sampled sh -c "curl -s -T '$work/up' http://127.0.0.1:$PORT/up > '$work/up.out'"
t1=$(date +%s.%N)
up_max=$(cat "$work/max")
read -r got_n got_sha < "$work/up.out"
rm -f "$work/up"
pat=$(python3 -c "import hashlib;P=bytes(range(256))*4096;n=$SIZE;h=hashlib.sha256()
while n: k=min(n,len(P));h.update(P[:k]);n-=k
print(h.hexdigest())")
t2=$(date +%s.%N)
sampled sh -c "curl -s http://127.0.0.1:$PORT/big/$SIZE | sha256sum > '$work/down.out'"
t3=$(date +%s.%N)
down_max=$(cat "$work/max")
down_sha=$(cut -d' ' -f1 "$work/down.out")
ok() { [[ $1 == "$2" ]] && echo intact || echo "MISMATCH"; }
echo "| transfer | bytes | sha256 | seconds | proxy RSS idle | max | growth |"
echo "|---|---:|---|---:|---:|---:|---:|"
printf "| upload (Content-Length) | %d | %s | %.1f | %d KiB | %d KiB | %+d KiB |\n" "$got_n" \
  "$(ok "$got_sha.$got_n" "$want.$SIZE")" "$(echo "$t1 - $t0" | bc)" "$base" "$up_max" $((up_max - base))
printf "| download | %d | %s | %.1f | %d KiB | %d KiB | %+d KiB |\n" "$SIZE" \
  "$(ok "$down_sha" "$pat")" "$(echo "$t3 - $t2" | bc)" "$base" "$down_max" $((down_max - base))
