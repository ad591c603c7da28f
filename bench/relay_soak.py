"""Soak: the trace relay under a minute of mixed legitimate and hostile traffic; RSS flat, no legitimate span lost.

The real command runs (``python -m exporter``, the relay on, forwarding to a local OTLP endpoint that counts
spans by their trace id's first byte) next to a stand-in for Triton's HTTP API (bench/relay_hostile.py).

- Legitimate: one client, as Triton's exporter does, posts batches of Triton's own spans (the captured
  fixture, ids made unique, trace ids starting ``aa``) on one kept-alive connection, every ``--legit-every``
  seconds; every span of every batch answered 200 must reach the endpoint.
- Hostile: ``--hostile-threads`` clients cycle through what issue 26 found: bytes that are not HTTP, bodies
  dripped a byte at a time, connections that send nothing, bodies cut short by a reset, ids of the wrong
  length or all zero (JSON and protobuf), a 4 MiB model name and a 300-byte one, 500 models Triton does not
  serve, JSON nested 10,000 deep, 150,000 empty objects, a gzip bomb, bursts of 100 connections at once,
  duplicate span ids and an expensive valid body. Valid hostile spans (trace ids starting ``bb``) are
  relayed like any; nothing refused may reach the endpoint.

Printed: RSS of the exporter (after the warm-up, the largest, at the end), the legitimate spans sent and
exported, hostile requests by kind and by answer, the relay's own counts, lines on stderr that are not JSON.
Exit 1 when a legitimate span is missing, a refused span reached the endpoint, stderr had a non-JSON line,
or RSS ended more than ``--max-growth-mb`` above its warmed-up value.

    .venv/bin/python bench/relay_soak.py                 # 60 s, as docs/reliability.md records
    .venv/bin/python bench/relay_soak.py --seconds 10 --json
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import random
import socket
import struct
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from relay_hostile import (
    FIXTURE,
    ROOT,
    Exporter,
    Quiet,
    Server,
    fake_triton,
    model_span,
    not_json_lines,
    otlp,
)

LEGIT, HOSTILE = 0xAA, 0xBB  # first byte of the trace ids


class MarkedSink:
    """An OTLP endpoint that counts the spans it receives by their trace id's first byte."""

    def __init__(self) -> None:
        self.by_marker: Counter[int] = Counter()
        self.lock = threading.Lock()
        sink = self

        class Handler(Quiet):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                got: Counter[int] = Counter()
                for rs in request.resource_spans:
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            ok = len(s.trace_id) == 16 and len(s.span_id) == 8 and any(s.trace_id) and any(s.span_id)
                            got[s.trace_id[0] if ok else -1] += 1
                with sink.lock:
                    sink.by_marker.update(got)
                self.answer(b"", "application/x-protobuf")

        self.server = Server(Handler)

    def count(self, marker: int) -> int:
        with self.lock:
            return self.by_marker[marker]


_ids = iter(range(1, 1 << 62))


def triton_batch(marker: int, copies: int = 10) -> bytes:
    """``copies`` of the fixture's three requests (9 spans), every trace and span id fresh, links kept."""
    doc = orjson.loads(FIXTURE.read_bytes())
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    out = []
    for _ in range(copies):
        traces: dict[str, str] = {}
        span_ids: dict[str, str] = {}
        for s in spans:
            span_ids[s["spanId"]] = f"{next(_ids):016x}"
        for s in spans:
            s2 = dict(s)
            s2["traceId"] = traces.setdefault(s["traceId"], f"{marker:02x}{next(_ids):030x}")
            s2["spanId"] = span_ids[s["spanId"]]
            if s.get("parentSpanId"):
                s2["parentSpanId"] = span_ids.get(s["parentSpanId"]) or f"{next(_ids):016x}"
            out.append(s2)
    doc["resourceSpans"][0]["scopeSpans"][0]["spans"] = out
    return orjson.dumps(doc)


SPANS_PER_BATCH = 90


@dataclass
class Result:
    seconds: float
    legit_requests: int = 0
    legit_answers: dict[int, int] = field(default_factory=dict)
    legit_spans_sent: int = 0
    legit_spans_exported: int = 0
    hostile_requests: int = 0
    hostile_by_kind: dict[str, int] = field(default_factory=dict)
    hostile_answers: dict[str, int] = field(default_factory=dict)
    hostile_valid_spans_exported: int = 0
    refused_spans_exported: int = 0  # spans with bad ids at the endpoint: must be 0
    rss_start_mb: float = 0.0
    rss_warm_mb: float = 0.0
    rss_max_mb: float = 0.0
    rss_end_mb: float = 0.0
    rss_timeline_mb: list[float] = field(default_factory=list)  # at each tenth of the run
    relay_counts: dict[str, int] = field(default_factory=dict)
    stderr_lines: int = 0
    stderr_not_json: int = 0


# --- hostile clients: each sends one attack and returns its answer (the first line, or what happened) ------


def _raw(port: int, data: bytes, rst: bool = False, read: bool = True, timeout: float = 20.0) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except OSError as exc:
            return type(exc).__name__
        if rst:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return "reset sent"
        if not read:
            return "sent"
        try:
            line = s.recv(64).split(b"\r\n")[0].decode(errors="replace")
        except OSError as exc:
            return type(exc).__name__
        return line[:12] or "closed"


def _post(port: int, body: bytes, ctype: str = "application/json", encoding: str = "") -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Content-Type": ctype, **({"Content-Encoding": encoding} if encoding else {})}
        conn.request("POST", "/v1/traces", body, headers)
        resp = conn.getresponse()
        resp.read()
        return f"HTTP {resp.status}"
    except OSError as exc:
        return type(exc).__name__
    finally:
        conn.close()


def _hostile_span(i: int, model: str = "add") -> dict[str, object]:
    return model_span(model, f"{HOSTILE:02x}{i:030x}", f"{i + 1:016x}")


def attacks(port: int, counter: Callable[[int], int]) -> dict[str, Callable[[], str]]:
    head = b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    proto = ExportTraceServiceRequest()
    proto.resource_spans.add().scope_spans.add().spans.add(trace_id=b"abc", span_id=b"\x01" * 8, name="x")
    bomb = gzip.compress(b"\0" * (64 << 20))
    big_name = otlp(model_span("m" * (4 << 20), "1" * 32, "1" * 16))
    expensive = otlp(
        {
            **_hostile_span(0),
            "attributes": [{"key": f"k{i}", "value": {"intValue": str(i)}} for i in range(15_000)],
        }
    )

    def drip() -> str:
        with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
            s.sendall(head)
            try:
                for _ in range(1000):
                    s.sendall(b" ")
                    time.sleep(0.5)
            except OSError:
                pass
            try:
                return s.recv(64).split(b"\r\n")[0].decode(errors="replace")[:12] or "closed"
            except OSError as exc:
                return type(exc).__name__

    def burst() -> str:
        body = otlp(*(_hostile_span(counter(1)) for _ in range(3)))
        results: list[str] = []
        lock = threading.Lock()

        def one() -> None:
            r = _post(port, body)
            with lock:
                results.append(r)

        threads = [threading.Thread(target=one) for _ in range(100)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return ",".join(f"{k}x{v}" for k, v in sorted(Counter(results).items()))

    def dup() -> str:
        spans = [_hostile_span(counter(1)) for _ in range(4)]
        for s in spans:
            s["spanId"] = "00f067aa0ba902b7"
            for key in ("startTimeUnixNano", "endTimeUnixNano", "events"):
                s[key] = spans[0][key]
        return _post(port, otlp(*spans))

    return {
        "not_http": lambda: _raw(port, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"),
        "drip": drip,
        "silent": lambda: _raw(port, b""),
        "cut_short": lambda: _raw(port, head + b'{"resou', rst=True),
        "bad_id_json": lambda: _post(port, otlp({"trace_id": "AQEBAQEBAQEBAQEBAQEB", "spanId": "0102030405060708"})),
        "bad_id_proto": lambda: _post(port, proto.SerializeToString(), "application/x-protobuf"),
        "zero_id": lambda: _post(port, otlp({"traceId": "0" * 32, "spanId": "0102030405060708"})),
        "name_300": lambda: _post(port, otlp(_hostile_span(counter(1), "m" * 300))),
        "name_4mib": lambda: _post(port, big_name),
        "unknown_models": lambda: _post(port, otlp(*(_hostile_span(counter(1), f"fake{i}") for i in range(500)))),
        "deep": lambda: _post(port, b'{"resourceSpans":' + b"[" * 10_000 + b"]" * 10_000 + b"}"),
        "values": lambda: _post(port, b'{"resourceSpans":[' + b",".join([b"{}"] * 150_000) + b"]}"),
        "gzip_bomb": lambda: _post(port, bomb, encoding="gzip"),
        "burst": burst,
        "dup_span_ids": dup,
        "expensive": lambda: _post(port, expensive),
    }


def run(seconds: float = 60.0, hostile_threads: int = 6, legit_every: float = 0.1, tree: Path = ROOT) -> Result:
    result = Result(seconds)
    with tempfile.TemporaryDirectory() as tmp:
        triton, sink = fake_triton(), MarkedSink()
        x = Exporter(tree, Path(tmp), sink, triton)  # type: ignore[arg-type]
        result.rss_start_mb = x.rss_mb()
        stop = threading.Event()
        lock = threading.Lock()
        serial = [1_000]

        def counter(n: int) -> int:
            with lock:
                serial[0] += n
                return serial[0]

        menu = attacks(x.port, counter)
        hostile_kinds: Counter[str] = Counter()
        hostile_answers: Counter[str] = Counter()

        def hostile(seed: int) -> None:
            rng = random.Random(seed)
            kinds = list(menu)
            while not stop.is_set():
                kind = rng.choice(kinds)
                try:
                    answer = menu[kind]()
                except OSError as exc:
                    answer = type(exc).__name__
                with lock:
                    hostile_kinds[kind] += 1
                    hostile_answers[answer] += 1

        def legit() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", x.port, timeout=30)
            while not stop.is_set():
                body = triton_batch(LEGIT)
                try:
                    conn.request("POST", "/v1/traces", body, {"Content-Type": "application/json"})
                    resp = conn.getresponse()
                    answer = orjson.loads(resp.read() or b"{}")
                    status = resp.status
                except (OSError, http.client.HTTPException):
                    conn.close()  # the server closed a kept-alive connection: reconnect, as curl does
                    conn = http.client.HTTPConnection("127.0.0.1", x.port, timeout=30)
                    status = -1
                    answer = {}
                with lock:
                    result.legit_requests += 1
                    result.legit_answers[status] = result.legit_answers.get(status, 0) + 1
                    if status == 200:
                        rejected = int(answer.get("partialSuccess", {}).get("rejectedSpans", 0))
                        result.legit_spans_sent += SPANS_PER_BATCH - rejected
                stop.wait(legit_every)
            conn.close()

        threads = [threading.Thread(target=legit, daemon=True)]
        threads += [threading.Thread(target=hostile, args=(i,), daemon=True) for i in range(hostile_threads)]
        for t in threads:
            t.start()
        rss: list[float] = []
        end = time.monotonic() + seconds
        warm_at = time.monotonic() + max(seconds * 0.2, 2.0)
        while time.monotonic() < end:
            time.sleep(0.5)
            rss.append(x.rss_mb())
            if not result.rss_warm_mb and time.monotonic() >= warm_at:
                result.rss_warm_mb = rss[-1]
        stop.set()
        for t in threads:
            t.join(60)
        deadline = time.monotonic() + 60
        while sink.count(LEGIT) < result.legit_spans_sent and time.monotonic() < deadline:
            time.sleep(0.2)
        x.wait_cycles(2)
        result.rss_end_mb = x.rss_mb()
        result.rss_max_mb = max([*rss, result.rss_end_mb])
        result.rss_timeline_mb = (
            [round(rss[min(len(rss) - 1, len(rss) * i // 10)]) for i in range(1, 11)] if rss else []
        )
        result.legit_spans_exported = sink.count(LEGIT)
        result.hostile_valid_spans_exported = sink.count(HOSTILE)
        result.refused_spans_exported = sink.count(-1)
        result.hostile_requests = sum(hostile_kinds.values())
        result.hostile_by_kind = dict(hostile_kinds)
        result.hostile_answers = dict(hostile_answers)
        for name in (
            "SpansReceived",
            "SpansExported",
            "SpansDropped",
            "TraceRequestsInvalid",
            "TraceRequestsRefused",
            "SpansUnknownModel",
            "SpansOverLimit",
            "SlowRequestLinesOverLimit",
        ):
            result.relay_counts[name] = x.counted(name)
        stderr = x.stop()
        triton.close()
        sink.server.close()
        result.stderr_lines = len(stderr.splitlines())
        result.stderr_not_json = len(not_json_lines(stderr))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--hostile-threads", type=int, default=6)
    parser.add_argument("--legit-every", type=float, default=0.1, help="seconds between legitimate batches")
    parser.add_argument("--max-growth-mb", type=float, default=30.0)
    parser.add_argument("--tree", type=Path, default=ROOT, help="checkout whose exporter to run")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = parser.parse_args()
    r = run(args.seconds, args.hostile_threads, args.legit_every, args.tree)
    failed = (
        r.legit_spans_exported != r.legit_spans_sent
        or r.refused_spans_exported
        or r.stderr_not_json
        or r.rss_end_mb - r.rss_warm_mb > args.max_growth_mb
    )
    if args.json:
        print(orjson.dumps(asdict(r), option=orjson.OPT_NON_STR_KEYS).decode())
        return 1 if failed else 0
    print(f"soak of {r.seconds:g} s, {args.hostile_threads} hostile clients, one legitimate client")
    print(
        f"  RSS of the exporter: {r.rss_start_mb:.0f} MB at start, {r.rss_warm_mb:.0f} after the warm-up, "
        f"{r.rss_max_mb:.0f} at most, {r.rss_end_mb:.0f} at the end; at each tenth of the run {r.rss_timeline_mb}"
    )
    print(
        f"  legitimate: {r.legit_requests} requests answered {r.legit_answers}; spans sent {r.legit_spans_sent}, "
        f"exported {r.legit_spans_exported}"
    )
    print(f"  hostile: {r.hostile_requests} requests; by kind {r.hostile_by_kind}")
    print(f"  hostile answers: {r.hostile_answers}")
    print(
        f"  valid hostile spans relayed {r.hostile_valid_spans_exported}; refused spans at the endpoint "
        f"{r.refused_spans_exported}"
    )
    print(f"  the relay counted: {r.relay_counts}")
    print(f"  stderr: {r.stderr_lines} lines, {r.stderr_not_json} not JSON")
    print("  verdict: " + ("FAILED" if failed else "ok"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
