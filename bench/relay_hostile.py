"""The trace relay's findings of issues 26 and 36, measured on the real command: RSS, EMF events, log lines, answers.

Each scenario starts its own ``python -m exporter`` (interval 1 s, EMF to a file, the relay on, forwarding
to a local OTLP endpoint that counts spans) next to a small stand-in for Triton's HTTP API (models ``add``
and ``slow``), attacks the relay the way the issue describes, and prints what it cost:

    bigname    one span whose model name is 4 MiB: RSS of the exporter before and after
    unknown    one request naming 2,500 models Triton does not serve: fake model EMF events, log lines
    drip       16 clients sending their body one byte a second for 20 s, a client posting Triton's batch meanwhile
    parallel   300 requests at once: answered (by status), reset, timed out; what the exporter counted
    dupspan    two spans with the same span id and duration, different trace ids: SourceUp of traces after
    garbage    bytes that are not HTTP: the answer's first line; what the exporter counted
    ids        a 15-byte, a 3-byte, an empty and an all-zero id: answers, spans the endpoint received
    cutshort   bodies cut short, with and without a reset: lines on stderr that are not JSON
    attrs      (issue 36) a 4 MB protobuf body of 2 million empty resource attributes, once and 8 at once: RSS
    header     (issue 36) a header line of 16,000 spaces: how long its answer, and a request behind it, take

    .venv/bin/python bench/relay_hostile.py [--tree DIR] [SCENARIO ...]

``--tree`` runs the exporter of another checkout (``git archive house | tar -x -C /tmp/house``) so the
same harness measures the code before and after a change. Not a unit test: docs/reliability.md records
its figures.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gzip
import http.client
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from demo.payloads import triton_metrics  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "traces" / "triton-2.51-add.json"
MODELS = ("add", "slow")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A ThreadingHTTPServer on loopback in a daemon thread."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.port = int(self.httpd.server_address[1])
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Quiet(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        return None

    def answer(self, body: bytes, ctype: str = "application/json", status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def fake_triton() -> Server:
    step = [1]

    class Handler(Quiet):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                step[0] += 1
                self.answer(triton_metrics(list(MODELS), step[0]).encode(), "text/plain; version=0.0.4")
            elif self.path == "/v2":
                self.answer(b'{"name":"triton","version":"2.51.0","extensions":[]}')
            elif self.path.endswith("/config"):
                self.answer(b'{"backend":"python","model_transaction_policy":{"decoupled":false}}')
            else:
                self.answer(b"{}", status=404)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path == "/v2/repository/index":
                self.answer(orjson.dumps([{"name": m, "version": "1", "state": "READY"} for m in MODELS]))
            else:
                self.answer(b"{}", status=404)

    return Server(Handler)


class Sink:
    """A forgetful OTLP endpoint: counts the spans it receives and keeps their trace ids' first bytes."""

    def __init__(self) -> None:
        self.spans = 0
        self.bad_ids = 0  # spans whose ids X-Ray would not take (wrong length, all zero)
        self.lock = threading.Lock()
        sink = self

        class Handler(Quiet):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                spans = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
                bad = sum(1 for s in spans if len(s.trace_id) != 16 or len(s.span_id) != 8 or not any(s.trace_id))
                with sink.lock:
                    sink.spans += len(spans)
                    sink.bad_ids += bad
                self.answer(b"", "application/x-protobuf")

        self.server = Server(Handler)


class Exporter:
    def __init__(self, tree: Path, workdir: Path, sink: Sink, triton: Server) -> None:
        self.port = free_port()
        self.emf = workdir / "emf.jsonl"
        self.stderr_path = workdir / "stderr.log"
        self.stderr = open(self.stderr_path, "w")  # noqa: SIM115
        url = f"http://127.0.0.1:{triton.port}"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "exporter",
                "--interval",
                "1",
                "--startup-wait",
                "10",
                "--triton-url",
                url,
                "--triton-metrics-url",
                f"{url}/metrics",
                "--nvml",
                "off",
                "--output",
                f"file:{self.emf}",
                "--traces-to",
                f"otlp+http://127.0.0.1:{sink.server.port}/v1/traces",
                "--traces-listen",
                f"127.0.0.1:{self.port}",
            ],
            cwd=tree,
            stderr=self.stderr,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise SystemExit(f"the exporter did not start: {self.stderr_path.read_text()[-2000:]}") from None
                time.sleep(0.1)
        self.wait_cycles(2)

    def rss_mb(self, field: str = "VmRSS") -> float:
        """Resident memory now (``VmHWM``: its peak since the exporter started)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def docs(self) -> list[dict[str, object]]:
        if not self.emf.exists():
            return []
        out = []
        for line in self.emf.read_bytes().splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                out.append(orjson.loads(line))
        return out

    def task_docs(self) -> list[dict[str, object]]:
        return [d for d in self.docs() if "model" not in d and "gpu" not in d and "source" not in d]

    def wait_cycles(self, n: int) -> None:
        start = len(self.task_docs())
        deadline = time.monotonic() + 30 + 5 * n
        while len(self.task_docs()) < start + n and time.monotonic() < deadline:
            time.sleep(0.1)

    def counted(self, *names: str) -> int:
        return int(sum(float(d.get(n, 0) or 0) for d in self.task_docs() for n in names))  # type: ignore[arg-type]

    def stop(self) -> str:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()
        return self.stderr_path.read_text(errors="replace")


def post(port: int, body: bytes, ctype: str = "application/json", timeout: float = 30.0) -> int | str:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        conn.request("POST", "/v1/traces", body, {"Content-Type": ctype})
        resp = conn.getresponse()
        resp.read()
        conn.close()
        return resp.status
    except (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, http.client.RemoteDisconnected):
        return "reset"
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return type(exc).__name__


def model_span(model: str, trace: str, span: str, ms: float = 5.0) -> dict[str, object]:
    start = time.time_ns()
    end = start + int(ms * 1e6)
    return {
        "traceId": trace,
        "spanId": span,
        "name": model[:40],
        "kind": 2,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "attributes": [
            {"key": "triton.model_name", "value": {"stringValue": model}},
            {"key": "triton.model_version", "value": {"intValue": "1"}},
        ],
        "events": [
            {"name": "REQUEST_START", "timeUnixNano": str(start)},
            {"name": "REQUEST_END", "timeUnixNano": str(end)},
        ],
    }


def otlp(*spans: dict[str, object]) -> bytes:
    scope = {"scope": {"name": "triton-server"}, "spans": list(spans)}
    return orjson.dumps({"resourceSpans": [{"resource": {}, "scopeSpans": [scope]}]})


def not_json_lines(stderr: str) -> list[str]:
    out = []
    for line in stderr.splitlines():
        try:
            if not isinstance(orjson.loads(line), dict):
                out.append(line)
        except orjson.JSONDecodeError:
            out.append(line)
    return out


# --- scenarios: each returns lines to print ---------------------------------------------------------------


def bigname(x: Exporter, sink: Sink) -> list[str]:
    before = x.rss_mb()
    status = post(x.port, otlp(model_span("m" * (4 << 20), "1" * 32, "1" * 16)))
    x.wait_cycles(3)
    return [f"4 MiB model name: answered {status}; exporter RSS {before:.0f} MB before, {x.rss_mb():.0f} MB after"]


def unknown(x: Exporter, sink: Sink) -> list[str]:
    before = len(x.docs())
    fakes = [model_span(f"fake{i:04d}", f"{i + 1:032x}", f"{i + 1:016x}") for i in range(2500)]
    status = post(x.port, otlp(*fakes))
    x.wait_cycles(3)
    fake_events = sum(1 for d in x.docs()[before:] if str(d.get("model", "")).startswith("fake"))
    stderr = x.stderr_path.read_text(errors="replace")
    slow = [line for line in stderr.splitlines() if "slow request: model=fake" in line]
    longest = max((len(line) for line in stderr.splitlines()), default=0)
    return [
        f"2,500 unknown models: answered {status}; fake model EMF events {fake_events}; "
        f"slow-request log lines for them {len(slow)}; longest stderr line {longest:,} bytes; "
        f"counted as unknown model {x.counted('SpansUnknownModel')}"
    ]


def drip(x: Exporter, sink: Sink, clients: int = 16, seconds: float = 20.0) -> list[str]:
    stop = threading.Event()
    drip_answers: list[bytes] = []

    def dripper() -> None:
        head = b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
        try:
            with socket.create_connection(("127.0.0.1", x.port)) as s:
                s.settimeout(seconds + 15)
                s.sendall(head)  # the headers at once, then the body one byte a second
                for byte in b" " * 100000:
                    if stop.is_set():
                        break
                    s.sendall(bytes([byte]))
                    if stop.wait(1.0):
                        break
                try:
                    drip_answers.append(s.recv(40).split(b"\r\n")[0])
                except OSError as exc:
                    drip_answers.append(type(exc).__name__.encode())
        except OSError as exc:
            drip_answers.append(type(exc).__name__.encode())

    threads = [threading.Thread(target=dripper, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    body = FIXTURE.read_bytes()
    statuses: Counter[object] = Counter()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        statuses[post(x.port, body)] += 1
        time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join(20)
    x.wait_cycles(2)
    return [
        f"{clients} drippers for {seconds:.0f} s: the legitimate client got {dict(statuses)}; "
        f"drippers got {dict(Counter(a.decode(errors='replace') for a in drip_answers))}; "
        f"counted invalid {x.counted('TraceRequestsInvalid')}, refused {x.counted('TraceRequestsRefused')}"
    ]


def parallel(x: Exporter, sink: Sink, n: int = 300) -> list[str]:
    body = FIXTURE.read_bytes()
    results: list[object] = []
    go = threading.Event()
    lock = threading.Lock()

    def client() -> None:
        go.wait()
        r = post(x.port, body, timeout=30)
        with lock:
            results.append(r)

    threads = [threading.Thread(target=client) for _ in range(n)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(60)
    x.wait_cycles(3)
    tally = Counter(results)
    return [
        f"{n} parallel requests: {dict(tally)}; counted invalid {x.counted('TraceRequestsInvalid')}, "
        f"refused {x.counted('TraceRequestsRefused')}, spans received {x.counted('SpansReceived')} "
        f"(= 9 x {x.counted('SpansReceived') // 9} requests)"
    ]


def dupspan(x: Exporter, sink: Sink) -> list[str]:
    spans = [model_span("add", f"{t:032x}", "00f067aa0ba902b7", ms=7.0) for t in (1, 2, 3, 4)]
    for s in spans:
        s["startTimeUnixNano"] = spans[0]["startTimeUnixNano"]
        s["endTimeUnixNano"] = spans[0]["endTimeUnixNano"]
        s["events"] = spans[0]["events"]
    status = post(x.port, otlp(*spans))
    x.wait_cycles(1)
    post(x.port, otlp(*spans))
    x.wait_cycles(4)
    up = [d.get("SourceUp") for d in x.docs() if d.get("source") == "traces"][-4:]
    stderr = x.stderr_path.read_text(errors="replace")
    return [
        f"duplicate span id and duration: answered {status}; SourceUp of traces in the last 4 cycles {up}; "
        f"'source traces failed' lines {stderr.count('TypeError')}"
    ]


def garbage(x: Exporter, sink: Sink) -> list[str]:
    answers = []
    for data in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", b"SSH-2.0-OpenSSH_9.6\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", x.port)) as s:
            s.settimeout(10)
            s.sendall(data)
            try:
                answers.append(s.recv(200).split(b"\n")[0].strip().decode(errors="replace"))
            except OSError as exc:
                answers.append(type(exc).__name__)
    x.wait_cycles(2)
    return [f"not HTTP: first lines answered {answers}; counted invalid {x.counted('TraceRequestsInvalid')}"]


def ids(x: Exporter, sink: Sink) -> list[str]:
    out = []
    good_span = "0102030405060708"
    proto = ExportTraceServiceRequest()
    proto.resource_spans.add().scope_spans.add().spans.add(trace_id=b"abc", span_id=bytes.fromhex(good_span), name="x")
    cases: list[tuple[str, bytes, str]] = [
        ("15-byte trace id", otlp({"trace_id": base64.b64encode(b"\x01" * 15).decode(), "spanId": good_span}), "json"),
        ("3-byte protobuf trace id", proto.SerializeToString(), "proto"),
        ("empty span id", otlp({"traceId": "ab" * 16, "spanId": ""}), "json"),
        ("all-zero trace id", otlp({"traceId": "0" * 32, "spanId": good_span}), "json"),
    ]
    for name, body, kind in cases:
        ctype = "application/json" if kind == "json" else "application/x-protobuf"
        out.append(f"{name}: {post(x.port, body, ctype)}")
    x.wait_cycles(3)
    return [f"ids: {'; '.join(out)}; spans with bad ids the endpoint received {sink.bad_ids}"]


def cutshort(x: Exporter, sink: Sink) -> list[str]:
    head = b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    for data in (head + b'{"resou', head[:30], b"POST /v1/tr"):
        for rst in (False, True):
            s = socket.create_connection(("127.0.0.1", x.port))
            s.sendall(data)
            if rst:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            time.sleep(0.05)
            s.close()
    x.wait_cycles(2)
    return []  # the stderr check runs for every scenario


def _len_delimited(field: int, payload: bytes) -> bytes:
    n, length = len(payload), b""
    while n >= 0x80:
        length += bytes([n & 0x7F | 0x80])
        n >>= 7
    return bytes([field << 3 | 2]) + length + bytes([n]) + payload


def empty_attributes(n: int) -> bytes:
    """An ExportTraceServiceRequest of one resource with ``n`` empty attributes: 2 bytes each on the wire."""
    return _len_delimited(1, _len_delimited(1, b"\x0a\x00" * n))


def attrs(x: Exporter, sink: Sink) -> list[str]:
    body = empty_attributes(2_000_000)
    before = x.rss_mb()
    status = post(x.port, body, "application/x-protobuf", timeout=120)
    x.wait_cycles(3)
    one = f"peak {x.rss_mb('VmHWM'):.0f} MB, {x.rss_mb():.0f} MB after"
    statuses: list[object] = []
    threads = [
        threading.Thread(target=lambda: statuses.append(post(x.port, body, "application/x-protobuf", timeout=120)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    x.wait_cycles(3)
    return [
        f"2,000,000 empty resource attributes ({len(body):,} bytes): answered {status}; RSS {before:.0f} MB before, "
        f"{one}; 8 at once: answered {dict(Counter(statuses))}, peak {x.rss_mb('VmHWM'):.0f} MB, "
        f"{x.rss_mb():.0f} MB after; counted invalid {x.counted('TraceRequestsInvalid')}; "
        f"a legitimate batch then: {post(x.port, FIXTURE.read_bytes())}"
    ]


def _timed_request(port: int, data: bytes) -> tuple[float, bytes]:
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.settimeout(30)
        s.sendall(data)
        answer = s.recv(100)
    return time.perf_counter() - start, answer.split(b"\r\n")[0]


def header(x: Exporter, sink: Sink) -> list[str]:
    body = FIXTURE.read_bytes()
    head = b"POST /v1/traces HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
    hostile = head + b"A:x" + b" " * 16_000 + b"y\r\nConnection: close\r\n\r\n" + body
    plain = head + b"Connection: close\r\n\r\n" + body
    out = []
    for name, data in (("plain", plain), ("16,000 spaces", hostile)):
        seconds, line = min(_timed_request(x.port, data) for _ in range(3))
        out.append(f"{name}: {line.decode()} in {seconds * 1000:.1f} ms")
    behind: list[float] = []
    first = threading.Thread(target=lambda: _timed_request(x.port, hostile))
    first.start()
    time.sleep(0.01)  # the hostile head is on the loop; a plain request comes right behind it
    behind.append(_timed_request(x.port, plain)[0])
    first.join(30)
    return [f"header line: {'; '.join(out)} (the best of 3); a plain request behind it: {behind[0] * 1000:.1f} ms"]


SCENARIOS: dict[str, Callable[[Exporter, Sink], list[str]]] = {
    "bigname": bigname,
    "unknown": unknown,
    "drip": drip,
    "parallel": parallel,
    "dupspan": dupspan,
    "garbage": garbage,
    "ids": ids,
    "cutshort": cutshort,
    "attrs": attrs,
    "header": header,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="checkout whose exporter to run")
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS), help=", ".join(SCENARIOS))
    args = parser.parse_args()
    unknown_names = set(args.scenarios) - set(SCENARIOS)
    if unknown_names:
        parser.error(f"unknown scenario(s) {sorted(unknown_names)}; one of {', '.join(SCENARIOS)}")
    print(f"tree: {args.tree}")
    for name in args.scenarios:
        with tempfile.TemporaryDirectory() as tmp:
            triton, sink = fake_triton(), Sink()
            x = Exporter(args.tree, Path(tmp), sink, triton)
            try:
                lines = SCENARIOS[name](x, sink)
            finally:
                stderr = x.stop()
                triton.close()
                sink.server.close()
            bad = not_json_lines(stderr)
            tracebacks = sum(1 for line in bad if line.startswith("Traceback"))
            for line in lines:
                print(f"  {name:9} {line}")
            print(f"  {name:9} stderr: {len(stderr.splitlines())} lines, {len(bad)} not JSON ({tracebacks} tracebacks)")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
