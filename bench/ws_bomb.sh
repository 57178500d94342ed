#!/usr/bin/env bash
# ws_bomb.sh -- what permessage-deflate bombs cost a server: CPU per byte
# the attacker sends. A raw client (Python, no library: it counts its own
# bytes) opens CONNS connections one after the other, each agreeing
# permessage-deflate with examples/ws_echo.lua --deflate yes and sending
# BOMBS messages of 1,000,000 zeros (993 bytes compressed), waiting for
# each echo (or the close that refuses it). Runs the server with each
# --inflate-ratio given (0: no bound, as before inflate_ratio existed) and
# prints a markdown table: server CPU ms (utime+stime, /proc/PID/stat) per
# KB the attacker sent, and per bomb.
#   bash bench/ws_bomb.sh [CONNS] [BOMBS] [RATIOS...]   (default 20 5 0 64)
set -euo pipefail
cd "$(dirname "$0")/.."
CONNS=${1:-20}
BOMBS=${2:-5}
RATIOS=("${@:3}")
[[ ${#RATIOS[@]} -gt 0 ]] || RATIOS=(0 64)

source bench/lib.sh
bench_init ws_bomb
cmake -S . -B build/ws-bench -DCMAKE_BUILD_TYPE=Release -DNETRUN_BENCH=OFF >/dev/null
cmake --build build/ws-bench -j2 --target netrun_bin >/dev/null

cat > "$work/bomb.py" <<'PY'
import os, socket, sys, zlib
port, conns, bombs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
c = zlib.compressobj(6, zlib.DEFLATED, -15)
z = c.compress(b"\0" * 1000000) + c.flush(zlib.Z_SYNC_FLUSH)
z = z[:-4]                                   # RFC 7692: no 00 00 ff ff
key = b"\x37\xfa\x21\x3d"
masked = bytes(b ^ key[i % 4] for i, b in enumerate(z))
frame = bytes([0xC2, 0x80 | 126]) + len(z).to_bytes(2, "big") + key + masked
upgrade = (b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
           b"Sec-WebSocket-Extensions: permessage-deflate\r\n\r\n")
sent = echoed = refused = 0
def recv_exact(s, n):
    b = b""
    while len(b) < n:
        d = s.recv(n - len(b))
        if not d: raise EOFError
        b += d
    return b
for _ in range(conns):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(upgrade); sent += len(upgrade)
    head = b""
    while b"\r\n\r\n" not in head: head += s.recv(4096)
    try:
        for _ in range(bombs):
            s.sendall(frame); sent += len(frame)
            h = recv_exact(s, 2)
            n = h[1] & 0x7f
            if n == 126: n = int.from_bytes(recv_exact(s, 2), "big")
            elif n == 127: n = int.from_bytes(recv_exact(s, 8), "big")
            recv_exact(s, n)
            if h[0] & 0x0f == 8:
                refused += 1
                break
            echoed += 1
    except (EOFError, ConnectionResetError):
        refused += 1
    s.close()
print(sent, echoed, refused)
PY

echo "| inflate_ratio | bombs echoed | refused | attacker bytes | server CPU ms | CPU ms per attacker KB |"
echo "|---:|---:|---:|---:|---:|---:|"
port=19291
for r in "${RATIOS[@]}"; do
  port=$((port + 1))
  build/ws-bench/bin/netrun examples/ws_echo.lua --port "$port" --deflate yes \
    --inflate-ratio "$r" >/dev/null 2>&1 &
  pid=$!
  pids+=("$pid")
  wait_port "$port"
  python3 "$work/bomb.py" "$port" 2 1 >/dev/null          # warm-up
  t0=$(ticks "$pid")
  read -r sent echoed refused < <(python3 "$work/bomb.py" "$port" "$CONNS" "$BOMBS")
  t1=$(ticks "$pid")
  awk -v r="$r" -v s="$sent" -v e="$echoed" -v f="$refused" -v t=$((t1 - t0)) -v hz="$hz" 'BEGIN {
    ms = t * 1000 / hz
    printf "| %s | %d | %d | %d | %.0f | %.2f |\n", r, e, f, s, ms, ms / (s / 1000) }'
  kill "$pid"
done
