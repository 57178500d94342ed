#!/usr/bin/python3
"""h2_upload_rss.py -- what a 1 GiB HTTP/2 upload on one stream adds to a
netrun server's RSS when the body goes to a slow reader: the server runs
spec/fixtures/h2_upload.lua (body = "stream"), whose /sink writes each
piece to a TCP connection to this script's reader, which takes
--rate MB/s at most; the client (this script, frames by hand, h2lib)
sends as fast as the server's windows allow. The server's VmRSS is
sampled every 20 ms: its peak over the RSS after a 1 MiB warm-up upload
is the figure (issue 29: <= the window + 1 MiB).

  /usr/bin/python3 bench/h2_upload_rss.py [--bin build/bin/netrun]
        [--size 1073741824] [--rate 200]
"""
import argparse
import json
import os
import socket
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "spec", "h2"))
from h2lib import Conn, Server                            # noqa: E402
from uploads import Flow                                  # noqa: E402

APP = os.path.join(ROOT, "spec", "fixtures", "h2_upload.lua")


def reader(lsock, rate, got):
    """Accept /sink's connections; read each at rate MB/s at most."""
    while True:
        try:
            s, _ = lsock.accept()
        except OSError:
            return
        t0, n = time.monotonic(), 0
        while True:
            d = s.recv(1 << 20)
            if not d:
                break
            n += len(d)
            got[0] += len(d)
            ahead = n / (rate * 1e6) - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
        s.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin", "netrun"))
    ap.add_argument("--size", type=int, default=1 << 30)
    ap.add_argument("--rate", type=float, default=200.0)
    a = ap.parse_args()
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    got = [0]
    threading.Thread(target=reader, args=(lsock, a.rate, got), daemon=True).start()
    with Server(a.bin, APP, ["--sink-port", str(lsock.getsockname()[1])]) as srv:
        c = Conn(srv.port, timeout=30)
        fl = Flow(c)
        c.request(1, "/sink", "POST", end_stream=False)      # warm-up: 1 MiB
        fl.send(1, b"w" * (1 << 20))
        c.response(1, 30)
        time.sleep(0.3)
        base = srv.rss()
        peak = [base]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], srv.rss())
                time.sleep(0.02)
        threading.Thread(target=sample, daemon=True).start()
        t0, cpu0 = time.monotonic(), srv.cpu()
        c.request(3, "/sink", "POST", end_stream=False)
        chunk = b"u" * (1 << 20)
        sent = 0
        while sent < a.size:
            n = min(len(chunk), a.size - sent)
            fl.send(3, chunk[:n], end=sent + n == a.size)
            sent += n
        st, _, body = c.response(3, 120)
        secs = time.monotonic() - t0
        done.set()
        r = json.loads(body)
        out = {"status": st, "bytes": r["n"], "seconds": round(secs, 2),
               "mb_per_s": round(r["n"] / secs / 1e6, 1), "reader_mb_per_s": a.rate,
               "server_cpu": round(srv.cpu() - cpu0, 2), "rss_base": base,
               "rss_peak": peak[0], "rss_growth": peak[0] - base,
               "window": c.server_settings.get(4, 65535),
               "bound": c.server_settings.get(4, 65535) + (1 << 20)}
        out["within"] = out["rss_growth"] <= out["bound"]
        print(json.dumps(out))
    lsock.close()


if __name__ == "__main__":
    main()
