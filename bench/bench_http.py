"""Benchmark: one call of triton_http's client against requests, same server, same bodies, same run.

    .venv/bin/python bench/bench_http.py [--calls 300] [--rounds 3]

A server in a child process (standard library, ``Connection: close`` as every call of ours asks) answers
GETs with a body of the size the path names. For each size (a small JSON answer, a 1000-model /metrics
body of Triton's shape) it times --calls calls, best of --rounds:
- ours: ``triton_http.Client.get`` (http.client under one deadline, byte cap);
- reference: a ``requests.Session`` used the way the exporter's sources used it before triton_http
  (``trust_env`` off, streamed, ``read1`` until the end, the socket timeout shrunk before every read);
and prints wall and this process's CPU per call (the server's CPU is its own), and the import time of
each client in a fresh process.

Target: ours no slower than the reference per call, in wall and in CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SERVER = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    bodies = {}

    def do_GET(self):
        size = int(self.path.strip("/"))
        body = self.bodies.get(size) or self.bodies.setdefault(size, (b"x" * 63 + b"\n") * (size // 64))
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def _requests_call(session, url: str, timeout: float, max_bytes: int) -> bytes:  # type: ignore[no-untyped-def]
    """The exporter's sources' call before triton_http (exporter/sources/http.py), without its messages."""
    deadline = time.monotonic() + timeout
    resp = session.request("GET", url, stream=True, allow_redirects=False, timeout=(1.0, timeout))
    try:
        chunks, size, raw = [], 0, resp.raw
        while True:
            conn = getattr(raw, "connection", None) or getattr(raw, "_connection", None)
            sock = getattr(conn, "sock", None)
            if sock is not None:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = raw.read1(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise ValueError("over the cap")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        resp.close()


def _time(call, calls: int, rounds: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(wall ms, CPU ms) per call, best round."""
    best = (float("inf"), float("inf"))
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            call()
        per = ((time.perf_counter() - wall) * 1e3 / calls, (time.process_time() - cpu) * 1e3 / calls)
        best = min(best, per)
    return best


def _import_ms(module: str, rounds: int) -> float:
    out = []
    for _ in range(max(5, rounds * 3)):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {module}"], check=True, cwd=ROOT)
        out.append(time.perf_counter() - start)
    return min(out) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import requests

    from triton_http import Client

    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        ours = Client(1.0, 64 << 20)
        session = requests.Session()
        session.trust_env = False
        session.headers.update({"User-Agent": "bench", "Accept-Encoding": "identity", "Connection": "close"})
        print(
            f"{'body':>10} {'calls':>6} {'ours ms':>8} {'ours CPU':>9} {'requests ms':>12} {'req CPU':>8} {'ratio':>6}"
        )
        for label, size in (("2 KB", 2048), ("1.4 MB", 1400 * 1024)):
            url = f"http://127.0.0.1:{port}/{size}"
            calls = args.calls if size < 1 << 20 else max(args.calls // 5, 10)
            assert len(ours.get(url, 5).body) == len(_requests_call(session, url, 5, 64 << 20)) > 0
            mine = _time(lambda url=url: ours.get(url, 5), calls, args.rounds)
            ref = _time(lambda url=url: _requests_call(session, url, 5, 64 << 20), calls, args.rounds)
            print(
                f"{label:>10} {calls:>6} {mine[0]:>8.3f} {mine[1]:>9.3f} {ref[0]:>12.3f} {ref[1]:>8.3f} "
                f"{ref[0] / mine[0]:>5.1f}x"
            )
    finally:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(5)
    bare = _import_ms("sys", args.rounds)
    mine_ms, ref_ms = (_import_ms(m, args.rounds) - bare for m in ("triton_http", "requests"))
    print(
        f"\nimport (best of {max(5, args.rounds * 3)} fresh processes, over a bare interpreter): "
        f"triton_http +{mine_ms:.0f} ms; requests +{ref_ms:.0f} ms"
    )


if __name__ == "__main__":
    main()
