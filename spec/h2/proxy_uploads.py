#!/usr/bin/python3
"""proxy_uploads.py -- an HTTP/2 client's uploads through examples/proxy.lua
--body stream (the C stream forwarder) to spec/fixtures/h2_upload.lua on
HTTP/1.1, frames written by hand: a body reset mid-upload, then another
on the same connection, which must come whole.

    spec/h2/proxy_uploads.py --port PROXY_PORT     (prints one JSON line)

spec/http2_body_spec.lua starts the proxy and the backend, runs it and
asserts what it prints.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from h2lib import *                                       # noqa: E402,F403
from uploads import SCALE, Flow, pattern, sum997          # noqa: E402


def main():
    port = int(sys.argv[sys.argv.index("--port") + 1])
    out = {}
    try:
        c = Conn(port, timeout=10 * SCALE)
        fl = Flow(c)
        # a body without content-length (chunked to the backend), reset once
        # the forwarder has taken some of it: the window it gives back as it
        # sends to the backend says so
        c.request(1, "/sum", "POST", end_stream=False)
        fl.send(1, pattern(40000), end=False)
        c.wait(lambda f: f[0] == WINDOW_UPDATE and f[2] == 1,
               "stream 1's window given back", 10 * SCALE)
        c.rst(1, CANCEL)
        # the next stream on the connection goes on, with a body larger
        # than its window
        data = pattern(300000, 7)
        c.request(3, "/sum", "POST", end_stream=False,
                  extra=[("content-length", str(len(data)))])
        fl.send(3, data)
        st, _, b = c.response(3, 10 * SCALE)
        r = json.loads(b)
        out = {"status": st, "n": r["n"], "intact": r["sum"] == sum997(data)}
        # a body shorter than its content-length: nghttp2 resets that
        # stream (PROTOCOL_ERROR) while it waits its turn behind stream 5,
        # whose upload is under way; stream 5 and the next still go on
        a = pattern(50000, 5)
        c.request(5, "/sum", "POST", end_stream=False)
        fl.send(5, a[:1000], end=False)
        c.request(7, "/sum", "POST", end_stream=False,
                  extra=[("content-length", "1000")])
        fl.send(7, pattern(500), end=True)
        try:
            c.response(7, 10 * SCALE)
            out["short"] = "answered"
        except Fail as e:
            out["short"] = str(e)
        fl.send(5, a[1000:])
        st, _, b = c.response(5, 10 * SCALE)
        r = json.loads(b)
        out["beside_short"] = st == 200 and r["n"] == len(a) and r["sum"] == sum997(a)
        data = pattern(100000, 3)
        c.request(9, "/sum", "POST", end_stream=False)
        fl.send(9, data)
        st, _, b = c.response(9, 10 * SCALE)
        r = json.loads(b)
        out["after_short"] = st == 200 and r["n"] == len(data) and r["sum"] == sum997(data)
        c.close()
    except Fail as e:
        out = {"fail": str(e)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
