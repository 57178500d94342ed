#!/usr/bin/env python3
"""h2_idle_rss.py -- RSS per idle HTTP/2 connection (h2c by prior
knowledge) of a netrun server: the server's VmRSS before, then with N
connections that did the HTTP/2 handshake (preface, SETTINGS both ways,
acked) and nothing more, then with the same N after one request each
(answered, the stream closed: the HPACK tables and nghttp2's stream
memory have been used once). Raw frames, no h2 library.

  python3 bench/h2_idle_rss.py [--n 2000] [--bin build/bin/netrun]
                               [--app examples/http_hello.lua]
"""
import argparse
import os
import resource
import socket
import struct
import subprocess
import sys
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS, HEADERS, DATA = 4, 1, 0
ACK, END_STREAM, END_HEADERS = 1, 1, 4


def frame(t, fl, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", t, fl, sid) + payload


def read_frame(s, buf):
    while len(buf) < 9 or len(buf) < 9 + int.from_bytes(buf[:3], "big"):
        d = s.recv(65536)
        if not d:
            raise EOFError("closed")
        buf += d
    n = int.from_bytes(buf[:3], "big")
    return (buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, buf[9:9 + n]), buf[9 + n:]


# GET / on stream 1, HPACK without the dynamic table: :method GET (index 2),
# :scheme http (6), :path / (4), :authority (literal, name index 1).
REQUEST = bytes([0x82, 0x86, 0x84, 0x01, 9]) + b"127.0.0.1"


def rss(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--bin", default=os.path.join(root, "build", "bin", "netrun"))
    ap.add_argument("--app", default=os.path.join(root, "examples", "http_hello.lua"))
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    port = 20000 + os.getpid() % 20000
    srv = subprocess.Popen([a.bin, a.app, "--port", str(port), "--threads", "1"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        time.sleep(0.5)
        r0 = rss(srv.pid)
        conns = []
        for _ in range(a.n):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(PREFACE + frame(SETTINGS, 0, 0))
            buf = b""
            while True:          # the server's SETTINGS, then the ACK of ours
                f, buf = read_frame(s, buf)
                if f[0] == SETTINGS and not f[1] & ACK:
                    s.sendall(frame(SETTINGS, ACK, 0))
                elif f[0] == SETTINGS:
                    break
            conns.append(s)
        time.sleep(1)
        r1 = rss(srv.pid)
        for s in conns:
            s.sendall(frame(HEADERS, END_STREAM | END_HEADERS, 1, REQUEST))
            buf = b""
            while True:
                f, buf = read_frame(s, buf)
                if f[2] == 1 and f[1] & END_STREAM:
                    break
        time.sleep(1)
        r2 = rss(srv.pid)
        print("%d h2c connections; server RSS %d KiB, %d KiB after the handshakes "
              "(%d bytes a connection), %d KiB after one request each "
              "(%d bytes a connection)" % (a.n, r0, r1, (r1 - r0) * 1024 // a.n,
                                           r2, (r2 - r0) * 1024 // a.n))
        for s in conns:
            s.close()
    finally:
        srv.terminate()
        srv.wait(10)


if __name__ == "__main__":
    sys.exit(main())
