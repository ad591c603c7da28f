"""How many spans a second the trace relay takes in, processes and forwards, and the memory it adds.

Bodies are Triton's own OTLP/JSON (tests/fixtures/traces, captured from Triton 2.51) replicated to
Triton's batch size (512 spans) with fresh ids. They are posted over HTTP to the relay, which
forwards to a local OTLP endpoint (plain HTTP, unsigned) that reads each request, counts its spans
and forgets it. Client and endpoint run in this process too, so the CPU figure is pessimistic.
Reference, same run: parsing the same bodies with protobuf's json_format alone, the least any
OTLP/JSON receiver does.

    .venv/bin/python bench/bench_relay.py [--batches 60]

Target (issue): 5,000 spans a second on one core with at most 20 MB of extra RSS.
"""

from __future__ import annotations

import argparse
import gzip
import http.client
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from google.protobuf import json_format  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from exporter.traces.forward import SpanForwarder  # noqa: E402
from exporter.traces.relay import TraceRelay  # noqa: E402
from telemetry.otlp.endpoint import parse_endpoint  # noqa: E402
from telemetry.otlp.exporter import ExportOptions  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "traces" / "triton-2.51-add.json"
SPANS_PER_BODY = 512


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def bodies(n: int) -> list[bytes]:
    doc = orjson.loads(FIXTURE.read_bytes())
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    out = []
    for b in range(n):
        batch = []
        for i in range(SPANS_PER_BODY // 3 * 3):
            s = dict(spans[i % len(spans)])
            request = (b * SPANS_PER_BODY + i) // 3 + 1  # a trace id of zero is no trace id
            s["traceId"] = f"{request:032x}"
            s["spanId"] = f"{b * SPANS_PER_BODY + i + 1:016x}"
            batch.append(s)
        doc["resourceSpans"][0]["scopeSpans"][0]["spans"] = batch
        out.append(orjson.dumps(doc))
    return out


class Sink:
    """A forgetful OTLP endpoint: decodes each request, counts its spans, answers 200."""

    def __init__(self) -> None:
        self.spans = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                sink.spans += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def endpoint(self) -> str:
        return f"otlp+http://127.0.0.1:{self.server.server_address[1]}/v1/traces"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batches", type=int, default=60)
    args = p.parse_args()
    payloads = bodies(args.batches)
    total = sum(len(orjson.loads(b)["resourceSpans"][0]["scopeSpans"][0]["spans"]) for b in payloads)

    start = time.perf_counter()
    for body in payloads:
        json_format.Parse(body, ExportTraceServiceRequest())  # ids wrongly read as base64: cost only
    reference = time.perf_counter() - start

    sink = Sink()
    before = rss_mb()
    relay = TraceRelay(
        "127.0.0.1", 0, dict, SpanForwarder(parse_endpoint(sink.endpoint()), ExportOptions(linger=0.05))
    ).start()
    conn = http.client.HTTPConnection("127.0.0.1", relay.receiver.port, timeout=30)
    cpu0, start = time.process_time(), time.perf_counter()
    for body in payloads:
        conn.request("POST", "/v1/traces", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
    relay.drain(60)
    received = relay.counts().spans_received
    deadline = time.monotonic() + 60
    while sink.spans < total and time.monotonic() < deadline:
        time.sleep(0.01)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu0
    peak = rss_mb()
    delivered = sink.spans
    relay.close(5)
    print(f"spans: {total} in {args.batches} Triton-sized bodies ({SPANS_PER_BODY // 3 * 3} spans each)")
    print(f"reference: json_format.Parse alone          {total / reference:>9,.0f} spans/s")
    print(
        f"relay: received {received}, forwarded {delivered} "
        f"{total / elapsed:>9,.0f} spans/s wall, {total / cpu:,.0f} spans per CPU-second "
        f"(whole process: relay, client and the endpoint's decoding; {os.cpu_count()} cores)"
    )
    print(f"RSS: {before:.1f} MB before the relay, {peak:.1f} MB after ({peak - before:+.1f} MB)")


if __name__ == "__main__":
    main()
