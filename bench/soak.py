"""Soak: the exporter pipeline for many cycles with model churn; RSS and state must not grow.

    .venv/bin/python bench/soak.py                       # 10,000 cycles, fixed-text source
    .venv/bin/python bench/soak.py --http                # the same through a loopback HTTP server
    .venv/bin/python bench/soak.py --cycles 2000 --models 100

Each cycle scrapes a Triton-shaped body (demo.payloads) whose counters grow and
whose model set churns: ``--models`` live at a time, one replaced every
``--churn-every`` cycles, so thousands of distinct model versions come and go.
The real Pipeline runs (parse, state, transform, EMF encode) and every event
is serialised; with ``--http`` the body goes through the real HTTP source.

Printed: RSS before the first cycle, after the warm-up (caches filled), and at
the end; the largest state size; the verdict. Exit 1 if RSS grew more than
``--max-growth-mb`` after the warm-up or the state size exceeded one scrape.
Not a unit test: docs/reliability.md records its figures.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from catalog import build
from demo.payloads import triton_metrics
from exporter.config import Settings
from exporter.pipeline import Pipeline
from exporter.sources import Collected, SourceKind
from exporter.sources.promtext import Parser
from exporter.sources.triton import TritonIndexSource, TritonMetricsSource

CATALOG = build()  # the built-in catalog, built once by this script


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Churn:
    """The body of scrape k: ``models`` names live, one replaced every ``every`` scrapes."""

    def __init__(self, models: int, every: int, pool: int = 0) -> None:
        self.models = models
        self.every = every
        self.pool = pool  # 0: every newcomer is a new name; N: names come back from a pool of N
        self.k = 0

    def names(self) -> list[str]:
        first = self.k // self.every
        ids = range(first, first + self.models)
        return [f"model_{(i % self.pool) if self.pool else i:06d}" for i in ids]

    def next_body(self) -> str:
        self.k += 1
        return triton_metrics(self.names(), self.k)

    def index(self) -> bytes:
        rows = ",".join(f'{{"name":"{n}","version":"1","state":"READY"}}' for n in self.names())
        return f"[{rows}]".encode()


class ChurnSource:
    name = "triton_metrics"
    kind = SourceKind.TRITON

    def __init__(self, churn: Churn) -> None:
        self.churn = churn
        self.parser = Parser(CATALOG.wanted_samples())

    def collect(self, timeout: float) -> Collected:
        return Collected(samples=self.parser.parse(self.churn.next_body()))

    def close(self) -> None:
        pass


class ChurnIndex:
    name = "triton_index"
    kind = SourceKind.TRITON

    def __init__(self, churn: Churn) -> None:
        self.churn = churn

    def collect(self, timeout: float) -> Collected:
        from exporter.sources.triton import parse_index

        return Collected(index=parse_index(self.churn.index()))

    def close(self) -> None:
        pass


def serve(churn: Churn) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, body: bytes, ctype: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._send(churn.next_body().encode(), "text/plain; version=0.0.4")

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
            self._send(churn.index(), "application/json")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=10_000)
    ap.add_argument("--models", type=int, default=50)
    ap.add_argument("--churn-every", type=int, default=5)
    ap.add_argument(
        "--pool", type=int, default=0, help="names come back from a pool of this many (0: every newcomer is a new name)"
    )
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--http", action="store_true", help="scrape a loopback HTTP server with the real sources")
    ap.add_argument("--max-growth-mb", type=float, default=5.0)
    args = ap.parse_args(argv)

    churn = Churn(args.models, args.churn_every, args.pool)
    settings = Settings(nvml="off", timeout=5.0)
    server = None
    if args.http:
        server = serve(churn)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        parser = Parser(CATALOG.wanted_samples())
        sources = [
            TritonMetricsSource(url + "/metrics", parser, 1.0, settings.max_body_bytes),
            TritonIndexSource(url, 1.0, settings.max_body_bytes),
        ]
    else:
        sources = [ChurnSource(churn), ChurnIndex(churn)]
    pipe = Pipeline(settings, CATALOG, sources)

    rss_start = rss_mb()
    rss_warm = rss_start
    state_max = events = 0
    per_scrape_max = 0
    t0 = time.perf_counter()
    for i in range(1, args.cycles + 1):
        result = pipe.cycle()
        if not all(s.up for s in result.statuses):
            print(f"cycle {i}: source down: {[s.error for s in result.statuses if s.error]}", file=sys.stderr)
            return 1
        events += sum(len(e) for e in result.events)
        state_max = max(state_max, pipe.baselines())
        per_scrape_max = max(per_scrape_max, result.series_kept)
        if i == args.warmup:
            rss_warm = rss_mb()
        if i % 2000 == 0:
            print(f"  cycle {i:>6}: RSS {rss_mb():7.1f} MB, state {pipe.baselines()} series", flush=True)
    seconds = time.perf_counter() - t0
    rss_end = rss_mb()
    pipe.close()
    if server is not None:
        server.shutdown()

    distinct = args.models + churn.k // args.churn_every
    if args.pool:
        distinct = min(distinct, args.pool)
    from telemetry import emf

    parser = sources[0].parser
    caches = (
        f"parser label cache {len(parser._cache)} blocks / {len(parser._interned)} label sets, "
        f"dimension-value cache {len(emf._SAFE_CACHE)}"
    )
    growth = rss_end - rss_warm
    print(
        f"soak: {args.cycles} cycles in {seconds:.1f} s ({1000 * seconds / args.cycles:.2f} ms/cycle), "
        f"{'loopback HTTP' if args.http else 'fixed-text'} source, {args.models} live models, "
        f"{distinct} distinct over the run, {events / 1e6:.1f} MB of EMF"
    )
    print(
        f"RSS start {rss_start:.1f} MB, after {args.warmup} warm-up cycles {rss_warm:.1f} MB, "
        f"end {rss_end:.1f} MB (growth after warm-up {growth:+.1f} MB)"
    )
    print(f"state size: max {state_max} series, largest scrape {per_scrape_max} series, end {pipe.baselines()}")
    print(f"caches at the end: {caches}")
    ok = growth <= args.max_growth_mb and state_max <= per_scrape_max
    print("verdict:", "OK (no growth)" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
