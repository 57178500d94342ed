#!/usr/bin/python3
"""attacks.py -- netrun's HTTP/2 server under the attacks its limits are for
(docs/guide/limits.md), one at a time against a fresh server running
spec/fixtures/h2_app.lua: each attack runs at most ATTACK seconds, as fast
as one client goes, and must end the connection with GOAWAY (the code
named) having cost the server less than one CPU-second.

    spec/h2/attacks.py --bin build/bin/netrun CASE   (prints one JSON line)
    cases: rapid_reset streams_per_read continuation made_you_reset
           ping_flood settings_flood empty_data_flood window_update_flood
           hpack_bomb shut_window shut_window_stream idle concurrency
           upload_slow_reader

spec/http2_limits_spec.lua runs each and asserts what it prints.
"""
import json
import os
import signal
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from h2lib import *                                       # noqa: E402,F403

# Seconds an attack may last at most: 10 by hand (issue 29's figure: an
# attack of 10 s costs the server under a CPU-second), shorter in ctest
# (spec/http2_limits_spec.lua), where a flood that is not stopped shows as
# a missing GOAWAY whatever the length, and the slow reader's buffers are
# full within the first second.
ATTACK = float(os.environ.get("NETRUN_H2_ATTACK_SECONDS", "10"))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
APP = os.path.join(ROOT, "spec", "fixtures", "h2_app.lua")


class Attack:
    """A connection that floods: frames are sent in batches while the
    server's answers are read (so that it is not stalled on us), until
    it says GOAWAY or closes, or ATTACK seconds pass."""

    def __init__(self, port, **kw):
        self.c = Conn(port, **kw)
        self.c.sock.setblocking(False)
        self.goaway = None
        self.frames_sent = 0
        self.t0 = time.monotonic()

    def pump(self):
        """Read what the server sent; True once it ended the connection."""
        c = self.c
        ended = False
        while True:
            try:
                chunk = c.sock.recv(1 << 20)
            except BlockingIOError:
                break
            except ConnectionResetError:
                ended = True
                break
            if not chunk:
                ended = True
                break
            c.buf += chunk
        self.parse()
        return ended

    def parse(self):
        c, at = self.c, 0
        buf = c.buf
        while len(buf) - at >= 9:
            n = int.from_bytes(buf[at:at + 3], "big")
            if len(buf) - at < 9 + n:
                break
            t, fl = buf[at + 3], buf[at + 4]
            sid = int.from_bytes(buf[at + 5:at + 9], "big") & 0x7fffffff
            p = buf[at + 9:at + 9 + n]
            at += 9 + n
            if t == GOAWAY and self.goaway is None:
                self.goaway = ERRORS[goaway_code(p)[1]]
            self.on_frame(t, fl, sid, p)
        c.buf = buf[at:]

    def on_frame(self, t, fl, sid, p):
        pass

    def send(self, data):
        view = memoryview(data)
        while view:
            try:
                n = self.c.sock.send(view)
                view = view[n:]
            except BlockingIOError:
                if self.pump():
                    return False
                time.sleep(0.001)
            except (BrokenPipeError, ConnectionResetError):
                return False
        return not self.pump()

    def run(self, batch, count_per_batch=1):
        """Send batch() again and again until the end."""
        while time.monotonic() - self.t0 < ATTACK:
            if not self.send(batch()):
                break
            self.frames_sent += count_per_batch
            if self.goaway is not None:
                break
        # the rest: GOAWAY, then the close
        end = time.monotonic() + 3
        while time.monotonic() < end and not self.pump():
            time.sleep(0.01)
        return self


def result(srv, cpu0, a, **extra):
    out = {"goaway": a.goaway, "cpu": round(srv.cpu() - cpu0, 3),
           "seconds": round(time.monotonic() - a.t0, 3), "frames": a.frames_sent}
    out.update(extra)
    return out


def headers_block(enc, path, sid_extra=()):
    return enc.encode([(":method", "GET"), (":scheme", "http"), (":path", path),
                       (":authority", "localhost")] + list(sid_extra))


# ---- the attacks ------------------------------------------------------------------------


def rapid_reset(srv):
    """CVE-2023-44487: streams opened and reset at once, 100 a write, each
    write read by the server before the next (a PING's ACK between them:
    a slow server would read several in one, and the limit of new streams
    a read would end it before the reset bucket is drained)."""
    a = Attack(srv.port)
    nxt, acked = [1], [True]

    def on_frame(t, fl, sid, p):
        if t == PING and fl & ACK:
            acked[0] = True
    a.on_frame = on_frame

    def batch():
        end = time.monotonic() + 2
        while not acked[0] and a.goaway is None and time.monotonic() < end:
            if a.pump():
                break
            time.sleep(0.001)
        acked[0] = False
        out = [frame(PING, 0, 0, b"rr-sync!")]
        for _ in range(100):
            sid = nxt[0]
            nxt[0] += 2
            out.append(frame(HEADERS, END_STREAM | END_HEADERS, sid, headers_block(a.c.enc, "/hold")))
            out.append(frame(RST_STREAM, 0, sid, struct.pack(">I", CANCEL)))
        return b"".join(out)
    cpu0 = srv.cpu()
    a.run(batch, 100)
    return result(srv, cpu0, a, streams=(nxt[0] - 1) // 2)


def streams_per_read(srv):
    """Rapid Reset in one read: 300 streams opened and reset in a single
    write, more than 2 x the stream limit (256) a read, fewer than the
    reset bucket's 1000."""
    a = Attack(srv.port)
    block = b"".join(frame(HEADERS, END_STREAM | END_HEADERS, 1 + 2 * i,
                           headers_block(a.c.enc, "/hold")) +
                     frame(RST_STREAM, 0, 1 + 2 * i, struct.pack(">I", CANCEL))
                     for i in range(300))
    cpu0 = srv.cpu()
    sent = [False]

    def batch():
        if sent[0]:
            time.sleep(0.01)
            return b""
        sent[0] = True
        return block
    a.run(batch)
    return result(srv, cpu0, a)


def continuation(srv):
    """CVE-2024-27316/28182: a header block that never ends."""
    a = Attack(srv.port)
    first = [True]

    def batch():
        if first[0]:
            first[0] = False
            return frame(HEADERS, END_STREAM, 1, headers_block(a.c.enc, "/"))
        return b"".join(frame(CONTINUATION, 0, 1, b"\x40\x01a\x01b") for _ in range(100))
    cpu0 = srv.cpu()
    a.run(batch, 100)
    return result(srv, cpu0, a)


def made_you_reset(srv):
    """CVE-2025-8671: requests the server must reset (an uppercase field
    name: a stream error), 50 a write, as fast as the resets come back
    (so that no read holds more than the stream limit)."""
    a = Attack(srv.port)
    nxt = [1]
    resets = [0]

    def on_frame(t, fl, sid, p):
        if t == RST_STREAM:
            resets[0] += 1
    a.on_frame = on_frame

    def batch():
        while nxt[0] > 2 * resets[0] + 100 and a.goaway is None:
            if a.pump():
                return b""
            time.sleep(0.0005)
        out = []
        for _ in range(50):
            out.append(frame(HEADERS, END_STREAM | END_HEADERS, nxt[0],
                             headers_block(a.c.enc, "/", [("X-Bad", "1")])))
            nxt[0] += 2
        return b"".join(out)
    cpu0 = srv.cpu()
    a.run(batch, 50)
    return result(srv, cpu0, a, resets=resets[0])


def flood(srv, make):
    a = Attack(srv.port)
    cpu0 = srv.cpu()
    a.run(lambda: b"".join(make(a) for _ in range(100)), 100)
    return result(srv, cpu0, a)


def ping_flood(srv):
    return flood(srv, lambda a: frame(PING, 0, 0, b"flooding"))


def settings_flood(srv):
    return flood(srv, lambda a: frame(SETTINGS, 0, 0, struct.pack(">HI", 4, 65535)))


def empty_data_flood(srv):
    a = Attack(srv.port)
    a.c.send(frame(HEADERS, END_HEADERS, 1, headers_block(a.c.enc, "/echo")))
    cpu0 = srv.cpu()
    a.run(lambda: frame(DATA, 0, 1, b"") * 100, 100)
    return result(srv, cpu0, a)


def window_update_flood(srv):
    return flood(srv, lambda a: frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)))


def hpack_bomb(srv):
    """A 4000-byte field indexed once, then referenced 16,000 times a
    block (64 MB decoded a request), request after request."""
    a = Attack(srv.port)
    a.c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1,
                   b"\x82\x86\x84\x41\x09localhost\x40\x04x-bb\x7f\xa1\x1e" + b"a" * 4000))
    nxt = [3]

    def batch():
        sid = nxt[0]
        nxt[0] += 2
        return frame(HEADERS, END_STREAM | END_HEADERS, sid, b"\x82\x86\x84\xbf" + b"\xbe" * 16000)
    cpu0 = srv.cpu()
    a.run(batch)
    return result(srv, cpu0, a, streams=(nxt[0] - 3) // 2)


def shut_window(srv):
    """A client that never opens its window: a 1 MiB answer waits for it
    until h2_send_timeout (1 s here)."""
    a = Attack(srv.port, local_settings=[(INITIAL_WINDOW_SIZE, 0)])
    a.c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1, headers_block(a.c.enc, "/big?n=1048576")))
    cpu0 = srv.cpu()
    a.run(lambda: (time.sleep(0.05), b"")[1])
    return result(srv, cpu0, a, rss=srv.rss())


def shut_window_stream(srv):
    """The same with a streamed answer (1 MiB in 64 chunks written at
    once): its chunks wait on the window, held, until h2_send_timeout."""
    a = Attack(srv.port, local_settings=[(INITIAL_WINDOW_SIZE, 0)])
    a.c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1,
                   headers_block(a.c.enc, "/stream?n=64&size=16384")))
    cpu0 = srv.cpu()
    a.run(lambda: (time.sleep(0.05), b"")[1])
    return result(srv, cpu0, a, rss=srv.rss())


def idle(srv):
    """A connection that opens and says nothing more: keepalive_timeout
    (0.5 s here)."""
    a = Attack(srv.port)
    cpu0 = srv.cpu()
    a.run(lambda: (time.sleep(0.05), b"")[1])
    return result(srv, cpu0, a)


def concurrency(srv):
    """128 streams at once (the limit) are all answered; a client that
    opens a 129th after acknowledging the limit gets PROTOCOL_ERROR (the
    conformance suite's 5.1.2)."""
    c = Conn(srv.port)
    for i in range(128):
        c.request(1 + 2 * i, "/slow?ms=300")
    done = set()
    while len(done) < 128:
        f = c.wait(lambda f: f[0] == DATA and f[1] & END_STREAM, "answers", 10)
        done.add(f[2])
    return {"answered": len(done)}


def upload_slow_reader(srv):
    """1 GiB on one stream to a server whose handlers cannot take it: the
    client reads nothing (not the 8 MiB answer it asked for, so the
    server's channel stays unwritable and it gives no window; not the
    WINDOW_UPDATEs or RST_STREAM either) and sends DATA as fast as the
    socket takes it for ATTACK seconds. The server's memory grows by the
    stream's window and max_body at most; it stays cheap."""
    c = Conn(srv.port, local_settings=[(INITIAL_WINDOW_SIZE, 2 ** 31 - 1)])
    c.window_update(0, 2 ** 31 - 1 - 65535)
    c.request(1, "/big?n=8388608")
    rss0, last = 0, time.monotonic()      # (the answer settles in buffers:
    while time.monotonic() - last < 0.5:  # RSS steady for half a second)
        time.sleep(0.1)
        r = srv.rss()
        if r != rss0:
            rss0, last = r, time.monotonic()
    cpu0 = srv.cpu()
    c.request(3, "/hold", "POST", end_stream=False)
    c.sock.setblocking(False)
    chunk = frame(DATA, 0, 3, b"u" * 16384)
    sent, t0 = 0, time.monotonic()
    while sent < (1 << 30) and time.monotonic() - t0 < ATTACK:
        try:
            sent += c.sock.send(chunk)
        except BlockingIOError:
            time.sleep(0.01)
        except (BrokenPipeError, ConnectionResetError):
            break
    time.sleep(0.5)
    return {"sent": sent, "window": c.server_settings.get(INITIAL_WINDOW_SIZE, 65535),
            "rss_growth": srv.rss() - rss0, "cpu": round(srv.cpu() - cpu0, 3),
            "seconds": round(time.monotonic() - t0, 3)}


def shutdown(srv):
    """Not an attack: a graceful shutdown (SIGTERM) while a 1 MiB answer is
    under way on a window the client opens as it reads once the first
    GOAWAY is in: GOAWAY with the highest stream id and a PING, the PING
    acked, GOAWAY with the last stream, the answer finished, the close, the
    process gone."""
    c = Conn(srv.port)
    c.request(1, "/big?n=1048576")
    f = c.wait(lambda f: f[0] == DATA, "DATA")
    got = len(f[3])
    srv.proc.send_signal(signal.SIGTERM)
    # The window opens only once the first GOAWAY is in: the signal reaches
    # the server's loop when it will, and an answer finished before would
    # leave nothing open to finish (then both GOAWAYs come at once).
    goaways, body_done, acked, owed = [], False, False, got
    while True:
        f = c.read(10)
        if f is None:
            break
        if f[0] == GOAWAY:
            goaways.append(goaway_code(f[3]))
        elif f[0] == PING and not f[1] & ACK:
            c.ping(f[3], ack=True)
            acked = True
        elif f[0] == DATA and f[2] == 1:
            got += len(f[3])
            owed += len(f[3])
            body_done = bool(f[1] & END_STREAM)
        if goaways and owed > 0:
            c.window_update(0, owed)
            c.window_update(1, owed)
            owed = 0
    c.close()
    t = time.monotonic()
    srv.proc.wait(15)
    return {"goaways": goaways, "body": got, "ended": body_done, "acked": acked,
            "exit": srv.proc.returncode, "exit_after": round(time.monotonic() - t, 3),
            "alive": True, "after": 200}


CASES = {
    "shutdown": (shutdown, "{}"),
    "rapid_reset": (rapid_reset, "{}"),
    "streams_per_read": (streams_per_read, "{}"),
    "continuation": (continuation, "{}"),
    "made_you_reset": (made_you_reset, "{}"),
    "ping_flood": (ping_flood, "{}"),
    "settings_flood": (settings_flood, "{}"),
    "empty_data_flood": (empty_data_flood, "{}"),
    "window_update_flood": (window_update_flood, "{}"),
    "hpack_bomb": (hpack_bomb, "{}"),
    "shut_window": (shut_window, "{ h2_send_timeout = 1 }"),
    "shut_window_stream": (shut_window_stream, "{ h2_send_timeout = 1 }"),
    "idle": (idle, "{ keepalive_timeout = 0.5 }"),
    "concurrency": (concurrency, "{}"),
    "upload_slow_reader": (upload_slow_reader, "{}"),
}


def main():
    binary, name = sys.argv[sys.argv.index("--bin") + 1], sys.argv[-1]
    fn, codec = CASES[name]
    with Server(binary, APP, ["--codec", codec]) as srv:
        out = fn(srv)
        if name == "shutdown":
            print(json.dumps(out))
            return
        out["alive"] = srv.proc.poll() is None
        try:                               # the server still serves others
            c = Conn(srv.port)
            c.request(1)
            out["after"] = c.response(1)[0]
            c.close()
        except Exception as e:             # noqa: BLE001
            out["after"] = str(e)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
