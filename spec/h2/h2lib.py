"""h2lib.py -- an HTTP/2 client for netrun's specs that writes frames by
hand (Debian's python3-hyperframe and python3-hpack): well-formed ones to
drive the server, malformed ones to see it refuse them, and floods to see
it defend itself. Also starts the server under test.

    from h2lib import Conn, Server
    with Server(bin, app) as srv:
        c = Conn(srv.port)            # preface and SETTINGS exchanged
        c.request(1, "/x")
        status, headers, body = c.response(1)
"""
import os
import select
import signal
import socket
import struct
import subprocess
import time

import hpack
from hyperframe.exceptions import HyperframeError
from hyperframe.frame import (DataFrame, Frame, HeadersFrame, PingFrame,
                              RstStreamFrame, SettingsFrame, WindowUpdateFrame)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, \
    WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

ERRORS = ["NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR",
          "SETTINGS_TIMEOUT", "STREAM_CLOSED", "FRAME_SIZE_ERROR",
          "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR", "CONNECT_ERROR",
          "ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED"]
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR, \
    SETTINGS_TIMEOUT, STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, \
    CANCEL, COMPRESSION_ERROR, CONNECT_ERROR, ENHANCE_YOUR_CALM = range(12)

HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, \
    MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = range(1, 7)


class Fail(Exception):
    pass


def frame(ftype, flags, stream, payload=b""):
    """A frame's bytes: the 9-byte header and the payload as given."""
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xffff, ftype, flags,
                       stream & 0xffffffff) + payload


def settings(*pairs, ack=False):
    """A well-formed SETTINGS (hyperframe); values out of range too (the
    server is to refuse them), so those are packed by hand."""
    if ack:
        return SettingsFrame(0, flags=["ACK"]).serialize()
    if all(v < 2 ** 31 for _, v in pairs):
        return SettingsFrame(0, settings=dict(pairs)).serialize() if len(
            dict(pairs)) == len(pairs) else frame(
            SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


def goaway_code(payload):
    return struct.unpack(">II", payload[:8])


class Conn:
    """One connection: a socket, an HPACK encoder and decoder, and the
    frames read, parsed as (type, flags, stream, payload)."""

    def __init__(self, port, host="127.0.0.1", handshake=True, preface=PREFACE,
                 local_settings=(), timeout=5):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.enc = hpack.Encoder()
        self.dec = hpack.Decoder()
        self.timeout = timeout
        self.closed = False
        self.server_settings = {}
        self.frames = []          # every frame read, in order
        self.fields = {}          # stream -> header blocks decoded, in order
        self.pending = b""        # a block still waiting for END_HEADERS
        if preface:
            self.send(preface)
        if handshake:
            self.send(settings(*local_settings))
            self.handshake()

    def handshake(self):
        """The server's SETTINGS (its first frame) acked, ours acked."""
        f = self.read()
        if f is None or f[0] != SETTINGS or f[1] & ACK:
            raise Fail("the server's first frame is not SETTINGS: %r" % (f,))
        self.note_settings(f[3])
        self.send(settings(ack=True))
        self.wait(lambda f: f[0] == SETTINGS and f[1] & ACK, "SETTINGS ACK")

    def decode(self, f):
        """Every header block the server sends is decoded in order (the
        HPACK table depends on it): kept in self.fields[stream]."""
        t, fl, sid, p = f
        if t == HEADERS:
            p = strip_padding(fl, p)
            if fl & PRIORITY_FLAG:
                p = p[5:]
            self.pending = p
        elif t == PUSH_PROMISE:
            self.pending = strip_padding(fl, p)[4:]
        elif t == CONTINUATION:
            self.pending += p
        else:
            return
        if fl & END_HEADERS:
            block, self.pending = self.pending, b""
            self.fields.setdefault(sid, []).append(self.dec.decode(block))

    def note_settings(self, payload):
        for i in range(0, len(payload) - 5, 6):
            k, v = struct.unpack(">HI", payload[i:i + 6])
            self.server_settings[k] = v

    def send(self, data):
        try:
            self.sock.sendall(data)
        except OSError:
            self.closed = True

    def close(self):
        self.sock.close()

    def read(self, timeout=None):
        """The next frame, or None once the server closed; Fail on timeout."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            if len(self.buf) >= 9:
                n = int.from_bytes(self.buf[:3], "big")
                if len(self.buf) >= 9 + n:
                    t, fl = self.buf[3], self.buf[4]
                    sid = int.from_bytes(self.buf[5:9], "big") & 0x7fffffff
                    f = (t, fl, sid, self.buf[9:9 + n])
                    check(self.buf[:9 + n])
                    self.buf = self.buf[9 + n:]
                    self.frames.append(f)
                    self.decode(f)
                    if t == SETTINGS and not fl & ACK:
                        self.note_settings(f[3])
                    return f
            left = deadline - time.monotonic()
            if left <= 0:
                raise Fail("no frame within %.1f s" % (timeout or self.timeout))
            r, _, _ = select.select([self.sock], [], [], left)
            if not r:
                continue
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.closed = True
                return None
            self.buf += chunk

    def wait(self, pred, what, timeout=None):
        """Read until pred(frame); Fail if the connection ends first."""
        while True:
            f = self.read(timeout)
            if f is None:
                raise Fail("the connection closed while waiting for " + what)
            if f[0] == GOAWAY and not pred(f):
                raise Fail("GOAWAY %s while waiting for %s" %
                           (ERRORS[goaway_code(f[3])[1]] if goaway_code(f[3])[1] < 14
                            else goaway_code(f[3])[1], what))
            if pred(f):
                return f

    # ---- requests -------------------------------------------------------

    def block(self, path="/", method="GET", extra=(), authority="localhost",
              scheme="http"):
        hs = [(":method", method), (":scheme", scheme), (":path", path),
              (":authority", authority)] + list(extra)
        return self.enc.encode(hs)

    def request(self, sid, path="/", method="GET", extra=(), end_stream=True,
                body=None):
        flags = ["END_HEADERS"] + (["END_STREAM"] if end_stream and body is None else [])
        self.send(HeadersFrame(sid, data=self.block(path, method, extra),
                               flags=flags).serialize())
        if body is not None:
            self.data(sid, body, end_stream=end_stream)

    def data(self, sid, body, end_stream=True, chunk=16384):
        for i in range(0, max(len(body), 1), chunk):
            part = body[i:i + chunk]
            last = i + chunk >= len(body)
            flags = ["END_STREAM"] if end_stream and last else []
            self.send(DataFrame(sid, data=part, flags=flags).serialize())

    def ping(self, opaque=b"12345678", ack=False):
        self.send(PingFrame(0, opaque_data=opaque,
                            flags=["ACK"] if ack else []).serialize())

    def rst(self, sid, code=CANCEL):
        self.send(RstStreamFrame(sid, error_code=code).serialize())

    def window_update(self, sid, inc):
        if 0 < inc < 2 ** 31:
            self.send(WindowUpdateFrame(sid, window_increment=inc).serialize())
        else:                   # what hyperframe refuses to make
            self.send(frame(WINDOW_UPDATE, 0, sid, struct.pack(">I", inc)))

    def response(self, sid, timeout=None):
        """(status, headers, body) of stream sid, read to its END_STREAM."""
        status, headers, body = None, {}, b""
        seen = [f for f in self.frames if f[2] == sid]   # read before
        while True:
            f = seen.pop(0) if seen else self.wait(
                lambda f: f[2] == sid or f[0] == GOAWAY,
                "stream %d's response" % sid, timeout)
            t, fl, _, p = f
            if t == HEADERS:
                while not fl & END_HEADERS:
                    c = self.wait(lambda f: f[0] == CONTINUATION, "CONTINUATION")
                    fl |= c[1]
                for k, v in self.fields[sid].pop(0):
                    if k == ":status":
                        status = int(v)
                    else:
                        headers[k] = v
            elif t == DATA:
                body += strip_padding(fl, p)
                if p:
                    self.window_update(0, len(p))
                    self.window_update(sid, len(p))
            elif t == RST_STREAM:
                raise Fail("stream %d reset: %s" % (sid, ERRORS[struct.unpack(">I", p)[0]]))
            if fl & END_STREAM and t in (HEADERS, DATA):
                return status, headers, body

    # ---- errors expected ----------------------------------------------------

    def connection_error(self, codes, timeout=None):
        """A GOAWAY with one of codes, then (or instead) the close."""
        codes = codes if isinstance(codes, (list, tuple, set)) else [codes]
        while True:
            f = self.read(timeout)
            if f is None:
                return "closed"
            if f[0] == GOAWAY:
                code = goaway_code(f[3])[1]
                if code not in codes:
                    raise Fail("GOAWAY %s, expected %s" % (
                        ERRORS[code] if code < 14 else code,
                        "/".join(ERRORS[c] for c in codes)))
                return "goaway"

    def stream_error(self, sid, codes, timeout=None):
        """RST_STREAM on sid with one of codes, or a connection error."""
        codes = codes if isinstance(codes, (list, tuple, set)) else [codes]
        while True:
            f = self.read(timeout)
            if f is None:
                return "closed"
            if f[0] == RST_STREAM and f[2] == sid:
                code = struct.unpack(">I", f[3])[0]
                if code not in codes:
                    raise Fail("RST_STREAM %s, expected %s" % (ERRORS[code], codes))
                return "rst"
            if f[0] == GOAWAY:
                code = goaway_code(f[3])[1]
                if code not in codes:
                    raise Fail("GOAWAY %s, expected %s" % (ERRORS[code], codes))
                return "goaway"

    def alive(self, timeout=None):
        """The connection still works: a PING is answered."""
        self.ping(b"alive!!!")
        self.wait(lambda f: f[0] == PING and f[1] & ACK and f[3] == b"alive!!!",
                  "PING ACK", timeout)


def check(raw):
    """Every frame the server sends must be one hyperframe can parse."""
    try:
        f, n = Frame.parse_frame_header(memoryview(raw[:9]))
        f.parse_body(memoryview(raw[9:9 + n]))
    except HyperframeError as e:
        raise Fail("the server sent a malformed frame: %s (%r)" % (e, raw[:32]))


def strip_padding(flags, p):
    if flags & PADDED:
        pad = p[0]
        return p[1:len(p) - pad]
    return p


class Server:
    """The netrun binary running a script on a free port, until closed."""

    def __init__(self, binary, script, args=(), env=None):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.port = s.getsockname()[1]
        s.close()
        self.log = open(os.devnull, "w") if not os.environ.get("H2_LOG") else None
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen([binary, script, "--port", str(self.port)] + list(args),
                                     stdout=self.log, stderr=self.log, env=e)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise Fail("the server exited: %s" % self.proc.returncode)
                time.sleep(0.05)
        raise Fail("the server never listened on %d" % self.port)

    def cpu(self):
        """The server's user + system CPU seconds so far."""
        with open("/proc/%d/stat" % self.proc.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log:
            self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()
