#!/usr/bin/python3
"""uploads.py -- HTTP/2 request bodies as streams (body = "stream"),
frames written by hand against spec/fixtures/h2_upload.lua: flow control
is the backpressure (a body nobody reads, or whose sink is full, gets no
window), streams stay independent, bodies are cut short by RST_STREAM.

    spec/h2/uploads.py --bin build/bin/netrun      (prints one JSON line)
    spec/h2/uploads.py --bin ... --case slow --codec '{ body_timeout = 0.5 }'

spec/http2_body_spec.lua runs it and asserts what it prints.
"""
import json
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from h2lib import *                                       # noqa: E402,F403

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
APP = os.path.join(ROOT, "spec", "fixtures", "h2_upload.lua")
SCALE = float(os.environ.get("NETRUN_TIMEOUT_SCALE", "1"))


def pattern(n, seed=0):
    return (bytes((i * 7 + seed) % 251 for i in range(251)) * (n // 251 + 1))[:n]


def sum997(data):
    return sum(data[i] for i in range(996, len(data), 997))


class Flow:
    """The client's side of the server's windows: what it may send on the
    connection and on each stream, updated from WINDOW_UPDATE frames read
    (and the responses read meanwhile stay in c.frames)."""

    def __init__(self, c):
        self.c = c
        self.conn = 65535
        self.initial = c.server_settings.get(INITIAL_WINDOW_SIZE, 65535)
        self.streams = {}
        self.updates = {}           # stream -> WINDOW_UPDATEs seen
        self.seen = len(c.frames)   # frames of c noted so far

    def win(self, sid):
        return self.streams.setdefault(sid, self.initial)

    def sync(self):
        """Note the frames c read since (here or in c.response)."""
        while self.seen < len(self.c.frames):
            self.note(self.c.frames[self.seen])
            self.seen += 1

    def note(self, f):
        if f[0] == WINDOW_UPDATE:
            inc = struct.unpack(">I", f[3])[0] & 0x7fffffff
            if f[2] == 0:
                self.conn += inc
            else:
                self.streams[f[2]] = self.win(f[2]) + inc
                self.updates[f[2]] = self.updates.get(f[2], 0) + 1

    def poll(self, timeout):
        """Read frames for up to timeout s; True if one came."""
        try:
            f = self.c.read(timeout)
        except Fail:
            return False
        if f is None:
            raise Fail("the server closed")
        self.sync()
        return True

    def send(self, sid, data, end=True, stall=None):
        """Send data on sid within the windows; with stall, give up once no
        window came for that many seconds: the bytes sent."""
        self.sync()
        sent, last = 0, time.monotonic()
        while sent < len(data) or (end and sent == len(data) == 0):
            n = min(16384, len(data) - sent, self.conn, self.win(sid))
            if n > 0 or len(data) == 0:
                part = data[sent:sent + n]
                fin = end and sent + n == len(data)
                self.c.send(frame(DATA, END_STREAM if fin else 0, sid, part))
                self.conn -= n
                self.streams[sid] -= n
                sent += n
                last = time.monotonic()
                if fin or len(data) == 0:
                    break
                continue
            if self.poll(0.05):
                last = time.monotonic()
            elif stall is not None and time.monotonic() - last > stall:
                return sent
            elif time.monotonic() - last > 10 * SCALE:
                raise Fail("no window on stream %d for 10 s" % sid)
        return sent


def fresh(srv):
    c = Conn(srv.port)
    return c, Flow(c)


def case_stall(srv):
    """A body nobody reads: its window (65535) is all the client may send;
    another stream on the connection is answered meanwhile, another
    upload completes."""
    c, fl = fresh(srv)
    c.request(1, "/wait", "POST", end_stream=False)
    sent = fl.send(1, pattern(1 << 20), end=False, stall=0.5 * SCALE)
    fl.poll(0.3 * SCALE)
    c.request(3, "/whole")
    st3, _, b3 = c.response(3, 10 * SCALE)
    data = pattern(300000, 3)
    c.request(5, "/sum", "POST", end_stream=False)
    fl.send(5, data)
    st5, _, b5 = c.response(5, 10 * SCALE)
    r5 = json.loads(b5)
    c.close()
    return {"sent": sent, "window": fl.initial, "updates1": fl.updates.get(1, 0),
            "other": st3, "other_body": json.loads(b3),
            "upload": st5, "upload_ok": r5["n"] == len(data) and r5["sum"] == sum997(data)}


def case_sink(srv):
    """A body written to a connection that reads nothing: the server reads
    no faster than it takes, so the client stalls after the buffers on
    the way fill; once it drains, the rest goes and arrives intact."""
    c, fl = fresh(srv)
    total = 16 << 20
    data = pattern(total, 5)
    c.request(1, "/sink", "POST", end_stream=False)
    sent = fl.send(1, data, end=False, stall=1.0 * SCALE)
    c.request(3, "/drain")
    st3, _, _ = c.response(3, 10 * SCALE)
    rest = fl.send(1, data[sent:], end=True)
    st1, _, b1 = c.response(1, 20 * SCALE)
    r1 = json.loads(b1)
    c.close()
    return {"stalled_at": sent, "total": total, "drain": st3, "status": st1,
            "n": r1["n"], "rest": rest, "intact": r1["n"] == total and r1["sum"] == sum997(data),
            "largest": r1["largest"]}


def case_reset(srv):
    """A body cut short by RST_STREAM: the handler hears it
    (exception_caught), the stream is freed, the connection goes on."""
    c, fl = fresh(srv)
    c.request(1, "/sum", "POST", end_stream=False)
    fl.send(1, pattern(40000), end=False)
    # reset only once the handler reads the body (its window given back):
    # a reset read with the head, before delivery, reaches no handler
    deadline = time.monotonic() + 10 * SCALE
    while not fl.updates.get(1) and time.monotonic() < deadline:
        fl.poll(0.05)
    c.rst(1, CANCEL)
    events = []
    deadline = time.monotonic() + 5 * SCALE
    sid = 3
    while not events and time.monotonic() < deadline:
        c.request(sid, "/events")
        events = json.loads(c.response(sid, 10 * SCALE)[2])["events"]
        sid += 2
    # many more cut short: each record goes (the limit of 2 x 128 records
    # would refuse new streams otherwise)
    # (in rounds of 100, each ended by a round trip: sent at once, a slow
    # server could read more than 2 x 128 new streams in one read, which
    # is the Rapid Reset bound, not what this checks)
    for _ in range(3):
        for _ in range(100):
            # (one write: the reset read with its head, before the head
            # is delivered -- a delivered /wait is owed an answer that
            # never comes, and its record stays until then)
            c.send(HeadersFrame(sid, data=c.block("/wait", "POST"),
                                flags=["END_HEADERS"]).serialize() +
                   frame(DATA, 0, sid, b"x" * 100) +
                   RstStreamFrame(sid, error_code=CANCEL).serialize())
            sid += 2
        c.request(sid, "/events")
        c.response(sid, 10 * SCALE)
        sid += 2
    data = pattern(100000, 7)
    c.request(sid, "/sum", "POST", end_stream=False)
    fl.send(sid, data)
    st, _, b = c.response(sid, 10 * SCALE)
    c.close()
    return {"events": events, "after": st, "after_ok": json.loads(b)["n"] == len(data)}


def case_interleave(srv):
    """Two uploads at once, their DATA frames interleaved, one with
    trailers and one read with ctx:read(): each in order and intact."""
    c, fl = fresh(srv)
    a, b = pattern(200000, 1), pattern(150000, 2)
    c.request(1, "/sum", "POST", end_stream=False)
    c.request(3, "/read", "POST", end_stream=False)
    ia = ib = 0
    while ia < len(a) or ib < len(b):
        if ia < len(a):
            ia += fl.send(1, a[ia:ia + 10000], end=False)
        if ib < len(b):
            n = fl.send(3, b[ib:ib + 7000], end=ib + 7000 >= len(b))
            ib += n
    # stream 1 ends with trailers
    c.send(frame(HEADERS, END_STREAM | END_HEADERS, 1,
                 c.enc.encode([("x-sum", str(sum997(a)))])))
    r1 = json.loads(c.response(1, 10 * SCALE)[2])
    r3 = json.loads(c.response(3, 10 * SCALE)[2])
    c.close()
    return {"a": r1["n"] == len(a) and r1["sum"] == sum997(a), "a_stream": r1["stream"],
            "trailers": r1["trailers"],
            "b": r3["n"] == len(b) and r3["sum"] == sum997(b), "b_stream": r3["stream"],
            "pieces": r1["pieces"]}


def case_early(srv):
    """Answered before its body was read: the answer, then RST_STREAM
    NO_ERROR (RFC 9113 8.1); the connection goes on."""
    c, fl = fresh(srv)
    c.request(1, "/early", "POST", end_stream=False)
    fl.send(1, pattern(20000), end=False)
    st, _, _ = c.response(1, 10 * SCALE)
    code = None
    deadline = time.monotonic() + 5 * SCALE
    while code is None and time.monotonic() < deadline:
        f = c.read(5 * SCALE)
        if f is not None and f[0] == RST_STREAM and f[2] == 1:
            code = struct.unpack(">I", f[3])[0]
    c.request(3, "/whole")
    st3 = c.response(3, 10 * SCALE)[0]
    c.close()
    return {"status": st, "rst": code, "after": st3}


def case_slow(srv):
    """(body_timeout = 0.5) A body read, then nothing more from the client
    (its window open): that stream is reset and its handler told; another
    stream started meanwhile is answered, the connection goes on."""
    c, fl = fresh(srv)
    c.request(1, "/sum", "POST", end_stream=False)
    fl.send(1, b"s" * 1000, end=False)
    t0 = time.monotonic()
    c.request(3, "/whole")
    other = c.response(3, 10 * SCALE)[0]
    code = None
    while code is None and time.monotonic() - t0 < 10 * SCALE:
        f = c.read(10 * SCALE)
        if f is not None and f[0] == RST_STREAM and f[2] == 1:
            code = struct.unpack(">I", f[3])[0]
    after = time.monotonic() - t0
    c.request(5, "/events")
    events = json.loads(c.response(5, 10 * SCALE)[2])["events"]
    c.close()
    return {"rst": code, "after": round(after, 3), "other": other, "events": events}


CASES = [("stall", case_stall), ("sink", case_sink), ("reset", case_reset),
         ("interleave", case_interleave), ("early", case_early),
         ("slow", case_slow)]


def main():
    binary = sys.argv[sys.argv.index("--bin") + 1]
    only = sys.argv[sys.argv.index("--case") + 1] if "--case" in sys.argv else None
    out = {}
    codec = sys.argv[sys.argv.index("--codec") + 1] if "--codec" in sys.argv else "{}"
    with Server(binary, APP, ["--codec", codec]) as srv:
        for name, fn in CASES:
            if (only and name != only) or (not only and name == "slow"):
                continue
            try:
                out[name] = fn(srv)
            except Fail as e:
                out[name] = {"fail": str(e)}
        out["alive"] = srv.proc.poll() is None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
