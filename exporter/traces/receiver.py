"""OTLP/HTTP trace receiver: Triton's JSON (and protobuf from any other client) in, on one listening port.

Triton posts OTLP/JSON to a plain URL and never retries, so the receiver
answers at once: it reads the request, parses it, hands it to the relay's
bounded queue and replies 200 (with ``partial_success`` counting what the
queue had no room for).

The port is a boundary: anything in the task's network namespace can reach
it. Every request has one deadline for its head and body together, every
part a size bound, every refusal an HTTP status and a counter by reason, and
nothing a client sends holds memory, a connection or the parser without
bound (:class:`Limits`; docs/reliability.md lists what a client gets at
each limit and which counter counts it):

- one event-loop thread does the I/O of every connection: ``connections``
  are served at once, ``refusing`` more are answered 503 at once, and the
  rest wait in a listen backlog of ``backlog`` (answered, never reset);
- one parser thread parses bodies one at a time, the smallest waiting first:
  Python parses on one core anyway, one parse at a time bounds its memory,
  and Triton's batches (a few hundred KB) pass a flood of large bodies;
- what a body holds is bounded by count, not only by bytes: a protobuf body
  is counted on its wire format before it is built (wire.py);
- the head is read with byte operations that cannot backtrack, no regular
  expression.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import http
import itertools
import logging
import socket
import threading
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from telemetry.logs import Throttled, get
from telemetry.otlp.otlpjson import (
    MAX_DEPTH,
    MAX_VALUES,
    BadId,
    OtlpJsonError,
    TooComplex,
    traces_request,
    traces_response_json,
)

from .spans import SpanRefused, check
from .wire import KINDS, TooMany, WireCounts, WireError, scan

log = get("traces.receiver")

PATH = "/v1/traces"
JSON, PROTOBUF = "application/json", "application/x-protobuf"

# Requests answered 4xx, by the reason label of otlp_relay_requests_invalid_total (docs/reliability.md).
INVALID_REASONS = (
    "not_http",  # 400: the bytes are not an HTTP/1.x request (a bad request line, header line or length)
    "method",  # 405: not POST
    "path",  # 404: not /v1/traces
    "length_required",  # 411: no Content-Length (chunked bodies are not taken)
    "too_large",  # 413 body or inflated body over body_bytes; 431 head over head_bytes
    "unsupported",  # 415: a Content-Type or Content-Encoding the relay does not read
    "not_otlp",  # 400: the body does not decode as OTLP traces
    "bad_id",  # 400: a trace or span id not of its exact length, or all zero
    "over_limit",  # 400: nested too deep, too many values or spans, a model name or version too long
    "timeout",  # 408: head and body not complete within the deadline
    "cut_short",  # no answer possible: the client closed or reset the connection mid-request
)
# Requests answered 503 (500 for "error"), by the reason label of otlp_relay_requests_refused_total.
REFUSED_REASONS = (
    "connections",  # more connections at once than the receiver serves
    "memory",  # the bodies in flight would exceed inflight_bytes
    "parser",  # the body waited longer than parse_wait for the parser
    "error",  # 500: the relay's own failure (logged with its traceback)
)


@dataclass(frozen=True)
class Limits:
    """The receiver's bounds; docs/reliability.md says what a client gets at each."""

    connections: int = 64  # served at once
    refusing: int = 256  # answered 503 at once beyond those; later ones wait in the listen backlog
    backlog: int = 1024  # the listen queue (the kernel caps it at net.core.somaxconn)
    deadline: float = 10.0  # seconds for a request's head and body, from its first byte (or the accept)
    idle: float = 30.0  # seconds a kept-alive connection may wait for its next request (Triton posts every 5 s)
    head_bytes: int = 16 * 1024  # request line and headers
    body_bytes: int = 4 * 1024 * 1024  # a body, and a body once inflated (Triton's 512 spans: ~300 KB)
    inflight_bytes: int = 32 * 1024 * 1024  # bodies read and not yet parsed, every connection together
    parse_wait: float = 5.0  # seconds a body may wait for the parser
    spans: int = 10_000  # spans in one request (X-Ray takes no more in one)
    # Everything else in one request that multiplies memory (wire.py: 2 bytes on the wire, 50 to 250 in memory),
    # counted before it is built. Triton's batch of 512 spans holds 1 resource of 4 attributes, 2,047 events
    # and 855 attributes: each bound admits X-Ray's 10,000 spans of Triton's shape, and the largest request
    # they admit is about 15 MB in memory (the 4 MB of 2 million empty attributes they refuse: 520 MB).
    resource_spans: int = 1_000  # Triton: 1
    resource_attributes: int = 10_000  # Triton: 4 (the relay adds the task's ~20 to each resource)
    scope_spans: int = 10_000  # Triton: 1
    events: int = 50_000  # Triton: at most 4 a span
    links: int = 10_000  # Triton: none
    attributes: int = 50_000  # of spans, events, links, scopes and key-value lists; Triton: at most 5 a span
    values: int = 10_000  # elements of array values; Triton: none
    other: int = 1_000  # any other repeated field (a resource's entity refs and their keys); Triton: none
    json_depth: int = MAX_DEPTH
    json_values: int = MAX_VALUES
    linger: float = 2.0  # seconds a refused request's remaining bytes are read (and dropped) before closing

    def counts(self) -> dict[str, int]:
        """The bound of each kind :func:`wire.scan` counts."""
        return {kind: int(getattr(self, kind)) for kind in KINDS}


DEFAULT_LIMITS = Limits()


class BadRequest(Exception):
    """The request is not one we accept: ``status`` the HTTP answer, ``reason`` the counter's label."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class _Refused(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class _CutShort(Exception):
    pass


@dataclass(frozen=True)
class ReceiverCounts:
    """Cumulative counts since the receiver started (``connections``: open now)."""

    spans: int  # in requests that were checked and handed to the relay
    answered: int  # requests that got an HTTP answer, whatever its status
    invalid: dict[str, int]
    refused: dict[str, int]
    connections: int


def _inflate(body: bytes, limit: int) -> bytes:
    d = zlib.decompressobj(wbits=31)  # gzip only
    try:
        out = d.decompress(body, limit + 1)
    except zlib.error as exc:
        raise BadRequest(400, "not_otlp", f"bad gzip body: {exc}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise BadRequest(413, "too_large", f"body inflates past {limit} bytes")
    return out


def _kind(content_type: str) -> str:
    return content_type.split(";")[0].strip().lower()


class Parsed(NamedTuple):
    request: ExportTraceServiceRequest  # checked
    as_json: bool  # it came as OTLP/JSON (answered in JSON)
    counts: WireCounts  # what it holds, and its size in memory


def _counted(wire: bytes, limits: Limits) -> WireCounts:
    try:
        return scan(wire, limits.counts())
    except TooMany as exc:
        raise BadRequest(400, "over_limit", f"OTLP over the limits: {exc}") from None
    except WireError as exc:
        raise BadRequest(400, "not_otlp", f"not OTLP protobuf traces: {exc}") from None


def parse(body: bytes, content_type: str, encoding: str, limits: Limits = DEFAULT_LIMITS) -> Parsed:
    """The checked request; BadRequest when it is not OTLP traces within the limits.

    A protobuf body is counted on the wire before it is parsed (wire.py), so one that holds too much is
    refused before any of it is built; a JSON body, already bounded by its values, is counted once parsed."""
    if encoding == "gzip":
        body = _inflate(body, limits.body_bytes)
    elif encoding not in ("", "identity"):
        raise BadRequest(415, "unsupported", f"Content-Encoding {encoding!r}: use gzip or none")
    kind = _kind(content_type)
    if kind == JSON:
        try:
            request = traces_request(body, limits.json_depth, limits.json_values)
        except BadId as exc:
            raise BadRequest(400, "bad_id", f"bad id: {exc}") from None
        except TooComplex as exc:
            raise BadRequest(400, "over_limit", f"OTLP/JSON over the limits: {exc}") from None
        except OtlpJsonError as exc:
            raise BadRequest(400, "not_otlp", f"not OTLP/JSON traces: {exc}") from None
        counts = _counted(request.SerializeToString(), limits)
    elif kind == PROTOBUF:
        counts = _counted(body, limits)
        try:
            request = ExportTraceServiceRequest.FromString(body)
        except (DecodeError, RecursionError) as exc:
            raise BadRequest(400, "not_otlp", f"not OTLP protobuf traces: {exc}") from None
    else:
        raise BadRequest(415, "unsupported", f"Content-Type {kind!r}: use {JSON} or {PROTOBUF}")
    try:
        check(request.resource_spans)
    except SpanRefused as exc:
        what = "bad id" if exc.reason == "bad_id" else "over the limits"
        raise BadRequest(400, exc.reason, f"{what}: {exc}") from None
    return Parsed(request, kind == JSON, counts)


# --- HTTP/1.1, the small part a receiver of OTLP needs -----------------------------------------------------

# The head is read with bytes methods, one pass each, and no regular expression: a pattern such as
# ``[ \t]*(.*?)[ \t]*`` backtracks, and one header line of 16,000 spaces held the event loop 1.1 s.
_UPPER = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_TOKEN = b"!#$%&'*+-.^_`|~0123456789" + _UPPER + _UPPER.lower()  # a header name's characters (RFC 9110 tchar)
_VISIBLE = bytes(range(0x21, 0x7F))  # a request target's
_PRINTABLE = bytes(range(0x20, 0x7F))  # the first line's, before it is complete
MAX_METHOD, MAX_TARGET = 16, 8192
MAX_HEADERS = 100


def _only(data: bytes | bytearray, allowed: bytes) -> bool:
    """Whether every byte of ``data`` is one of ``allowed`` (an empty ``data`` is)."""
    return not data.translate(None, allowed)


def _lines(data: bytes) -> list[bytes]:
    """``data`` split at each line end (LF, or CR LF); a CR with no LF after it stays."""
    *ended, last = data.split(b"\n")
    return [line[:-1] if line.endswith(b"\r") else line for line in ended] + [last]


def _head_end(buf: bytes | bytearray) -> tuple[int, int] | None:
    """Where the first empty line (LF or CR LF, after LF or CR LF) starts and ends, or None before it came."""
    lf = buf.find(b"\n")
    while lf >= 0:
        start = lf - 1 if lf and buf[lf - 1] == 0x0D else lf
        if buf[lf + 1 : lf + 2] == b"\n":
            return start, lf + 2
        if buf[lf + 1 : lf + 3] == b"\r\n":
            return start, lf + 3
        lf = buf.find(b"\n", lf + 1)
    return None


def _starts_like_http(buf: bytes | bytearray) -> bool:
    """Whether the first line so far (up to 8,300 bytes, complete or not) can begin an HTTP request: a capital
    letter, then printable characters (a CR last, its LF still to come)."""
    lf = buf.find(b"\n")
    line = buf if lf < 0 else buf[: lf - 1 if lf and buf[lf - 1] == 0x0D else lf]
    line = line[:8300]
    if line.endswith(b"\r"):
        line = line[:-1]
    return bool(line) and line[0] in _UPPER and _only(line, _PRINTABLE)


def _request_line(line: bytes) -> tuple[str, str, int]:
    """(method, path without its query, HTTP minor version); BadRequest unless it is ``METHOD TARGET HTTP/1.x``."""
    parts = line.split(b" ")
    if len(parts) == 3:
        method, target, version = parts
        if (
            0 < len(method) <= MAX_METHOD
            and _only(method, _UPPER)
            and 0 < len(target) <= MAX_TARGET
            and _only(target, _VISIBLE)
            and version in (b"HTTP/1.0", b"HTTP/1.1")
        ):
            return method.decode(), target.split(b"?")[0].decode(), version[-1] - 0x30
    raise BadRequest(400, "not_http", "not an HTTP/1.x request line")


def _header(line: bytes) -> tuple[str, str]:
    """(lower-case name, value without the spaces and tabs around it); BadRequest unless it is ``name: value``."""
    name, colon, value = line.partition(b":")
    if not colon or not name or not _only(name, _TOKEN):
        raise BadRequest(400, "not_http", f"bad header line {line[:40]!r}")
    return name.decode().lower(), value.strip(b" \t").decode("latin-1")


@dataclass
class _Head:
    method: str
    path: str
    minor: int
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        return "close" not in connection if self.minor == 1 else "keep-alive" in connection


def _parse_head(raw: bytes, limits: Limits) -> _Head:
    lines = _lines(raw)
    method, path, minor = _request_line(lines[0])
    if len(lines) > MAX_HEADERS + 1:
        raise BadRequest(431, "too_large", f"more than {MAX_HEADERS} header lines")
    head = _Head(method, path, minor)
    for line in lines[1:]:
        name, value = _header(line)
        if name in ("content-length", "content-type") and head.headers.get(name, value) != value:
            raise BadRequest(400, "not_http", f"two different {name} headers")
        head.headers[name] = value if name not in head.headers else f"{head.headers[name]}, {value}"
    return head


def _body_length(head: _Head, limits: Limits) -> int:
    """The body's length once the head says the request is one we take; BadRequest otherwise."""
    if head.method != "POST":
        raise BadRequest(405, "method", f"{head.method}: POST OTLP traces to {PATH}")
    if head.path != PATH:
        raise BadRequest(404, "path", f"POST OTLP traces to {PATH}")
    if "transfer-encoding" in head.headers:
        raise BadRequest(411, "length_required", "send a Content-Length (chunked bodies are not taken)")
    length = head.headers.get("content-length")
    if length is None:
        raise BadRequest(411, "length_required", "Content-Length required")
    if not length.isascii() or not length.isdigit() or len(length) > 18:
        raise BadRequest(400, "not_http", f"bad Content-Length {length[:20]!r}")
    if int(length) > limits.body_bytes:
        raise BadRequest(413, "too_large", f"body of {int(length)} bytes; at most {limits.body_bytes} bytes")
    content_type = head.headers.get("content-type", "")
    if _kind(content_type) not in (JSON, PROTOBUF):
        raise BadRequest(415, "unsupported", f"Content-Type {content_type!r}: use {JSON} or {PROTOBUF}")
    if head.headers.get("content-encoding", "").strip().lower() not in ("", "identity", "gzip"):
        raise BadRequest(415, "unsupported", "Content-Encoding: use gzip or none")
    return int(length)


def _response(status: int, body: bytes, content_type: str, close: bool, retry_after: int = 0) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}",
        "Server: triton-emf-exporter-relay",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
    ]
    if retry_after:
        lines.append(f"Retry-After: {retry_after}")
    if status == 405:
        lines.append("Allow: POST")
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class _Conn:
    """One connection's streams and the bytes read from it but not yet used."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buf = bytearray()

    async def fill(self, until: float) -> bool:
        """Read what has come into ``buf``; False at the end of the stream, TimeoutError at ``until``."""
        remaining = until - asyncio.get_running_loop().time()
        if remaining <= 0:
            raise TimeoutError
        async with asyncio.timeout(remaining):
            chunk = await self.reader.read(65536)
        if not chunk:
            return False
        self.buf += chunk
        return True

    async def take(self, n: int, until: float) -> bytes:
        while len(self.buf) < n:
            if not await self.fill(until):
                raise _CutShort
        with memoryview(self.buf) as view:
            out = bytes(view[:n])
        del self.buf[:n]
        return out

    async def send(self, data: bytes, timeout: float) -> None:
        self.writer.write(data)
        async with asyncio.timeout(timeout):
            await self.writer.drain()


class _ParseQueue:
    """One parse at a time on its own thread, the smallest body first; a body waits at most ``wait`` seconds."""

    def __init__(self, executor: ThreadPoolExecutor, wait: float) -> None:
        self.executor = executor
        self.wait = wait
        self._waiting: list[tuple[int, int, Callable[[], Any], asyncio.Future[None], asyncio.Future[Any]]] = []
        self._order = itertools.count()
        self.busy = False

    async def run(self, size: int, job: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        started: asyncio.Future[None] = loop.create_future()
        done: asyncio.Future[Any] = loop.create_future()
        heapq.heappush(self._waiting, (size, next(self._order), job, started, done))
        self._next()
        try:
            await asyncio.wait_for(asyncio.shield(started), self.wait)
        except TimeoutError:
            if not started.done():
                started.cancel()  # skipped when its turn comes
                raise _Refused("parser", f"the parser is busy: waited {self.wait:g} s") from None
        return await done

    def _next(self) -> None:
        while not self.busy and self._waiting:
            _, _, job, started, done = heapq.heappop(self._waiting)
            if started.cancelled():
                continue
            started.set_result(None)
            self.busy = True
            running = asyncio.get_running_loop().run_in_executor(self.executor, job)
            running.add_done_callback(functools.partial(self._finished, done=done))

    def _finished(self, running: asyncio.Future[Any], done: asyncio.Future[Any]) -> None:
        self.busy = False
        if not done.cancelled():
            if running.cancelled():
                done.cancel()
            elif running.exception() is not None:
                done.set_exception(running.exception())  # type: ignore[arg-type]
            else:
                done.set_result(running.result())
        self._next()


class TraceReceiver:
    """Serves POST /v1/traces on ``host:port``; ``accept`` takes a checked request and its estimated size in
    memory, and returns the spans it refused (its queue was full)."""

    def __init__(
        self,
        host: str,
        port: int,
        accept: Callable[[ExportTraceServiceRequest, int], int],
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.accept = accept
        self.limits = limits
        self._sock = socket.create_server((host, port), backlog=limits.backlog)  # OSError when taken
        self._sock.setblocking(False)
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(self._loop_error)
        self._parser = ThreadPoolExecutor(1, thread_name_prefix="trace-parser")
        self._parse_queue = _ParseQueue(self._parser, limits.parse_wait)
        self._thread = threading.Thread(target=self._run, name="trace-receiver", daemon=True)
        self._throttled = Throttled(log)
        self._lock = threading.Lock()  # the counts: the loop and the parser thread both write them
        self._spans = 0
        self._answered = 0
        self._invalid = dict.fromkeys(INVALID_REASONS, 0)
        self._refused = dict.fromkeys(REFUSED_REASONS, 0)
        self._open = 0  # connections, served or being refused
        self._serving = 0
        self._inflight = 0  # body bytes read and not yet parsed
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    @property
    def host(self) -> str:
        return str(self._sock.getsockname()[0])

    def start(self) -> TraceReceiver:
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        if self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout)
            except Exception:  # a connection that will not end must not hold the exporter's exit
                log.debug("trace receiver shutdown incomplete", exc_info=True)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
        self._sock.close()
        self._parser.shutdown(wait=False, cancel_futures=True)
        # A parse still running hands its result to the loop when it ends: the loop stays open for it.
        if not self._thread.is_alive() and not self._parse_queue.busy and not self._loop.is_closed():
            self._loop.close()

    def counts(self) -> ReceiverCounts:
        with self._lock:
            return ReceiverCounts(self._spans, self._answered, dict(self._invalid), dict(self._refused), self._open)

    # --- the loop ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        accepting = self._loop.create_task(self._accept())
        try:
            self._loop.run_forever()
        finally:
            accepting.cancel()

    async def _shutdown(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.wait(tasks, timeout=2.0) if tasks else None

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        self._throttled.log("loop", logging.ERROR, f"trace receiver: {context.get('message')}", exc_info=exc)

    async def _accept(self) -> None:
        slots = asyncio.Semaphore(self.limits.connections + self.limits.refusing)
        loop = asyncio.get_running_loop()
        while True:
            await slots.acquire()
            try:
                sock, _ = await loop.sock_accept(self._sock)
            except OSError as exc:  # out of file descriptors, or the client left: it waits in the backlog
                slots.release()
                self._throttled.log("accept", logging.WARNING, f"trace relay cannot accept a connection: {exc}")
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._connection(sock))
            self._tasks.add(task)

            def done(t: asyncio.Task[None]) -> None:
                self._tasks.discard(t)
                slots.release()

            task.add_done_callback(done)

    async def _connection(self, sock: socket.socket) -> None:
        self._open += 1
        conn: _Conn | None = None
        try:
            reader, writer = await asyncio.open_connection(sock=sock)
            conn = _Conn(reader, writer)
            if self._serving < self.limits.connections:
                self._serving += 1
                try:
                    await self._serve(conn)
                finally:
                    self._serving -= 1
            else:
                self._count("refused", "connections")
                message = f"relay busy: more than {self.limits.connections} connections at once; retry"
                self._report("connections", 503, message)
                await self._answer_and_close(conn, 503, message, retry_after=1)
        except asyncio.CancelledError:
            raise
        except Exception:
            self._count("refused", "error")
            self._throttled.log("error", logging.ERROR, "trace relay failed on a connection", exc_info=True)
            if conn is not None:
                await self._answer_and_close(conn, 500, "the relay failed on this request (logged)")
        finally:
            self._open -= 1
            if conn is not None:
                await self._close(conn)
            else:
                sock.close()

    async def _serve(self, conn: _Conn) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.deadline  # a new connection: from the accept
        while await self._request(conn, deadline):
            # Kept alive, the connection keeps its slot while it waits: Triton's, posting every few seconds,
            # is never pushed out by a crowd of new ones.
            try:
                if not conn.buf and not await conn.fill(loop.time() + self.limits.idle):
                    return
            except TimeoutError:
                return  # idle too long: closed, nothing refused
            deadline = loop.time() + self.limits.deadline

    async def _request(self, conn: _Conn, deadline: float) -> bool:
        """Read, parse and answer one request; True to keep the connection for the next."""
        inflight = 0
        try:
            head = await self._read_head(conn, deadline)
            if head is None:
                return False
            length = _body_length(head, self.limits)
            if self._inflight + length > self.limits.inflight_bytes:
                raise _Refused("memory", f"relay busy: {self.limits.inflight_bytes} bytes of bodies in flight")
            self._inflight += length
            inflight = length
            if head.headers.get("expect", "").lower() == "100-continue":
                await conn.send(b"HTTP/1.1 100 Continue\r\n\r\n", self.limits.deadline)
            body = await conn.take(length, deadline)
            refused, as_json = await self._parse_queue.run(length, functools.partial(self._parse, body, head))
        except BadRequest as exc:
            self._count("invalid", exc.reason)
            self._report(exc.reason, exc.status, str(exc))
            await self._answer_and_close(conn, exc.status, str(exc))
            return False
        except _Refused as exc:
            self._count("refused", exc.reason)
            self._report(exc.reason, 503, str(exc))
            await self._answer_and_close(conn, 503, str(exc), retry_after=1)
            return False
        except TimeoutError:
            message = f"request not complete within {self.limits.deadline:g} s"
            self._count("invalid", "timeout")
            self._report("timeout", 408, message)
            await self._answer_and_close(conn, 408, message)
            return False
        except (_CutShort, ConnectionError, OSError) as exc:
            self._count("invalid", "cut_short")
            self._report("cut_short", 0, f"the client left mid-request ({type(exc).__name__})")
            return False
        finally:
            self._inflight -= inflight
        message = "relay queue full: spans dropped" if refused else ""
        if as_json:
            answer = traces_response_json(refused, message)
        else:
            resp = ExportTraceServiceResponse()
            if refused:
                resp.partial_success.rejected_spans = refused
                resp.partial_success.error_message = message
            answer = resp.SerializeToString()
        self._count("answered")
        try:
            await conn.send(
                _response(200, answer, JSON if as_json else PROTOBUF, not head.keep_alive), self.limits.deadline
            )
        except (TimeoutError, OSError):
            return False
        return head.keep_alive

    async def _read_head(self, conn: _Conn, deadline: float) -> _Head | None:
        """The request's head, or None when the client closed before sending a byte."""
        while True:
            end = _head_end(conn.buf)
            if end is not None:
                break
            if conn.buf and not _starts_like_http(conn.buf):
                raise BadRequest(400, "not_http", "not an HTTP request")
            if len(conn.buf) > self.limits.head_bytes:
                raise BadRequest(431, "too_large", f"request head over {self.limits.head_bytes} bytes")
            if not await conn.fill(deadline):
                if conn.buf:
                    raise _CutShort
                return None
        if end[0] > self.limits.head_bytes:
            raise BadRequest(431, "too_large", f"request head over {self.limits.head_bytes} bytes")
        raw = bytes(conn.buf[: end[0]])
        del conn.buf[: end[1]]
        return _parse_head(raw, self.limits)

    def _parse(self, body: bytes, head: _Head) -> tuple[int, bool]:
        """On the parser thread: check the body and hand it to the relay; (spans refused, whether JSON)."""
        encoding = head.headers.get("content-encoding", "").strip().lower()
        parsed = parse(body, head.headers.get("content-type", ""), encoding, self.limits)
        with self._lock:
            self._spans += parsed.counts.counts["spans"]
        return self.accept(parsed.request, parsed.counts.memory), parsed.as_json

    async def _answer_and_close(self, conn: _Conn, status: int, message: str, retry_after: int = 0) -> None:
        """Answer ``status`` and close; what the client still sends is read and dropped for a moment first,
        so that it reads the answer instead of a reset."""
        self._count("answered")
        body = orjson.dumps({"code": status, "message": message})
        try:
            await conn.send(_response(status, body, JSON, True, retry_after), self.limits.linger)
            if conn.writer.can_write_eof():
                conn.writer.write_eof()
            until = asyncio.get_running_loop().time() + self.limits.linger
            dropped = 0
            while dropped <= self.limits.body_bytes + self.limits.head_bytes:
                remaining = until - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                async with asyncio.timeout(remaining):
                    chunk = await conn.reader.read(65536)
                if not chunk:
                    break
                dropped += len(chunk)
        except (TimeoutError, OSError):
            pass

    @staticmethod
    async def _close(conn: _Conn) -> None:
        conn.writer.close()
        try:
            async with asyncio.timeout(1.0):
                await conn.writer.wait_closed()
        except (TimeoutError, OSError):
            conn.writer.transport.abort()

    def _count(self, what: str, reason: str = "") -> None:
        with self._lock:
            if what == "answered":
                self._answered += 1
            elif what == "invalid":
                self._invalid[reason] += 1
            else:
                self._refused[reason] += 1

    def _report(self, reason: str, status: int, message: str) -> None:
        """One warning per reason a minute at most: a client can repeat a bad request at will."""
        answer = f"HTTP {status}" if status else "no answer"
        self._throttled.log(
            reason, logging.WARNING, f"trace relay refused a request ({reason}, {answer}): {message[:300]}"
        )
