"""OTLP/HTTP trace receiver on localhost: Triton's JSON (and protobuf from any other client) in, never blocking.

Triton posts OTLP/JSON to a plain URL and never retries, so the receiver
answers at once: it parses, hands the request to the relay's bounded queue,
and replies 200 (with ``partial_success`` counting what the queue had no
room for). Bad input (not OTLP, a bad id, a gzip bomb, a huge or slow body)
gets a 4xx with a one-line reason and is counted; the server keeps running.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from telemetry.logs import Conditions, get
from telemetry.otlp.otlpjson import OtlpJsonError, traces_request, traces_response_json

log = get("traces.receiver")

PATH = "/v1/traces"
MAX_BODY_BYTES = 16 * 1024 * 1024  # compressed or not; Triton's batches of 512 spans are ~1 MB of JSON
MAX_HANDLERS = 16  # concurrent requests; more are answered 503 at once
READ_TIMEOUT = 10.0  # seconds a client may take to send its request


class BadRequest(Exception):
    """The request is not one we accept; ``status`` is the HTTP answer, the message its reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class ReceiverStats:
    requests: int = 0
    invalid: int = 0  # answered 4xx
    busy: int = 0  # answered 503: too many at once
    spans: int = 0


def _inflate(body: bytes, limit: int) -> bytes:
    d = zlib.decompressobj(wbits=31)  # gzip only
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise BadRequest(400, f"bad gzip body: {exc}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise BadRequest(413, f"body inflates past {limit} bytes")
    return out


def parse(
    body: bytes, content_type: str, encoding: str, limit: int = MAX_BODY_BYTES
) -> tuple[ExportTraceServiceRequest, bool]:
    """(the request, whether it was JSON); BadRequest when it is not OTLP traces."""
    if encoding == "gzip":
        body = _inflate(body, limit)
    elif encoding not in ("", "identity"):
        raise BadRequest(415, f"Content-Encoding {encoding!r}: use gzip or none")
    kind = content_type.split(";")[0].strip().lower()
    if kind == "application/json":
        try:
            return traces_request(body), True
        except OtlpJsonError as exc:
            raise BadRequest(400, f"not OTLP/JSON traces: {exc}") from None
    if kind == "application/x-protobuf":
        try:
            return ExportTraceServiceRequest.FromString(body), False
        except DecodeError as exc:
            raise BadRequest(400, f"not OTLP protobuf traces: {exc}") from None
    raise BadRequest(415, f"Content-Type {kind!r}: use application/json or application/x-protobuf")


class TraceReceiver:
    """Serves POST /v1/traces on ``host:port`` in daemon threads; ``accept`` returns how many spans it refused."""

    def __init__(self, host: str, port: int, accept: Callable[[ExportTraceServiceRequest], int]) -> None:
        self.accept = accept
        self.stats = ReceiverStats()
        self.conditions = Conditions(log)
        self._slots = threading.BoundedSemaphore(MAX_HANDLERS)
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = READ_TIMEOUT
            server_version = "triton-emf-exporter-relay"

            def do_POST(self) -> None:
                receiver._handle(self)

            def do_GET(self) -> None:
                receiver._send(self, 405, b'{"message":"POST OTLP traces to /v1/traces"}', "application/json")

            def log_message(self, format: str, *args: object) -> None:
                return None  # our own counters and conditions say what matters

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="trace-receiver", daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> TraceReceiver:
        self.thread.start()
        return self

    def close(self) -> None:
        if self.thread.is_alive():  # shutdown() waits for serve_forever(), forever if it never ran
            self.server.shutdown()
        self.server.server_close()

    def _count(self, **add: int) -> None:
        with self._lock:
            for k, v in add.items():
                setattr(self.stats, k, getattr(self.stats, k) + v)

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        if not self._slots.acquire(blocking=False):
            self._count(requests=1, busy=1)
            self._send(h, 503, b'{"message":"relay busy"}', "application/json", close=True)
            return
        try:
            self._serve(h)
        finally:
            self._slots.release()

    def _serve(self, h: BaseHTTPRequestHandler) -> None:
        self._count(requests=1)
        try:
            if h.path.split("?")[0] != PATH:
                raise BadRequest(404, f"POST OTLP traces to {PATH}")
            length = h.headers.get("Content-Length")
            if length is None or not length.isdigit():
                raise BadRequest(411, "Content-Length required")
            if int(length) > MAX_BODY_BYTES:
                raise BadRequest(413, f"body over {MAX_BODY_BYTES} bytes")
            body = h.rfile.read(int(length))
            if len(body) != int(length):
                raise BadRequest(400, "body shorter than its Content-Length")
            request, as_json = parse(
                body, h.headers.get("Content-Type", ""), h.headers.get("Content-Encoding", "").strip().lower()
            )
        except BadRequest as exc:
            self._count(invalid=1)
            self.conditions.set("relay_input", f"trace relay refused a request: HTTP {exc.status}: {exc}")
            self._send(h, exc.status, orjson.dumps({"message": str(exc)}), "application/json", close=True)
            return
        except (OSError, TimeoutError) as exc:  # the client went away or was too slow
            self._count(invalid=1)
            self.conditions.set("relay_input", f"trace relay lost a request: {exc}")
            return
        self.conditions.set("relay_input", None)
        spans = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        self._count(spans=spans)
        refused = self.accept(request)
        message = "relay buffer full: spans dropped" if refused else ""
        if as_json:
            self._send(h, 200, traces_response_json(refused, message), "application/json")
        else:
            resp = ExportTraceServiceResponse()
            if refused:
                resp.partial_success.rejected_spans = refused
                resp.partial_success.error_message = message
            self._send(h, 200, resp.SerializeToString(), "application/x-protobuf")

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str, close: bool = False) -> None:
        try:
            h.send_response(status)
            h.send_header("Content-Type", content_type)
            h.send_header("Content-Length", str(len(body)))
            if close:
                h.send_header("Connection", "close")
                h.close_connection = True
            h.end_headers()
            h.wfile.write(body)
        except OSError:
            h.close_connection = True
