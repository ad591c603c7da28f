"""Misbehaving servers on loopback, for what a real Triton cannot be made to do.

- :class:`FakeHttp`: an HTTP/1.1 server on 127.0.0.1 whose answer is a function
  of the request (``respond``, ``silent``, ``drip``, ``huge``, ``redirect``).
  It records every request it received, so a test can prove that nothing
  reached it.
- :class:`FakeAgent`: a TCP "EMF agent" on 127.0.0.1 that records the lines it
  reads, or accepts and never reads, or closes the first connection mid-write.

Everything binds to 127.0.0.1 and ends when ``close()`` is called (the
fixtures in the tests do that), so no thread outlives its test.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

LOOPBACK = "127.0.0.1"


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Behaviour = Callable[["FakeHttp", socket.socket, Request], None]


def _read_request(conn: socket.socket) -> Request | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
        if len(data) > 1 << 20:
            return None
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = [*lines[0].split(" ", 2), "", ""][:3]
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    length = int(headers.get("content-length", "0") or 0)
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    return Request(method, path, headers, rest[:length])


class FakeHttp:
    """One loopback HTTP server; ``behaviour(server, conn, request)`` writes the answer."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.requests: list[Request] = []
        self.connections = 0
        self.bytes_sent = 0
        self.stopped = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((LOOPBACK, 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._accept = threading.Thread(target=self._serve, name="fake-http", daemon=True)
        self._accept.start()

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            self._conns.append(conn)
            t = threading.Thread(target=self._handle, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _handle(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(30)
            req = _read_request(conn)
            if req is None:
                return
            self.requests.append(req)
            self.behaviour(self, conn, req)

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.bytes_sent += len(data)

    def close(self) -> None:
        self.stopped.set()
        with contextlib.suppress(OSError):
            self.sock.close()
        for c in self._conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
        for t in [self._accept, *self._threads]:
            t.join(2)

    def __enter__(self) -> FakeHttp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def head(
    status: int = 200,
    content_type: str = "text/plain; version=0.0.4",
    length: int | None = None,
    extra: dict[str, str] | None = None,
) -> bytes:
    reason = {200: "OK", 302: "Found", 301: "Moved Permanently", 404: "Not Found", 503: "Service Unavailable"}
    lines = [f"HTTP/1.1 {status} {reason.get(status, 'X')}", f"Content-Type: {content_type}", "Connection: close"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# --- behaviours ---------------------------------------------------------------------------


def respond(body: bytes, status: int = 200, content_type: str = "text/plain; version=0.0.4") -> Behaviour:
    def run(server: FakeHttp, conn: socket.socket, req: Request) -> None:
        server.send(conn, head(status, content_type, len(body)) + body)

    return run


def silent(server: FakeHttp, conn: socket.socket, req: Request) -> None:
    """Accept, read the request, never answer."""
    server.stopped.wait(60)


def drip(body: bytes, every: float = 1.0) -> Behaviour:
    """Headers at once, then one byte of the body every ``every`` seconds."""

    def run(server: FakeHttp, conn: socket.socket, req: Request) -> None:
        server.send(conn, head(200, length=len(body)))
        for i in range(len(body)):
            server.send(conn, body[i : i + 1])
            if server.stopped.wait(every):
                return

    return run


def huge(total: int, line: bytes = b'nv_inference_request_success{model="m",version="1"} 1\n') -> Behaviour:
    """Stream ``total`` bytes of valid-looking exposition text, generated on the fly."""
    chunk = line * max(1, 65536 // len(line))

    def run(server: FakeHttp, conn: socket.socket, req: Request) -> None:
        server.send(conn, head(200, length=total))
        left = total
        while left > 0 and not server.stopped.is_set():
            piece = chunk[: min(left, len(chunk))]
            server.send(conn, piece)  # raises (and ends) once the client hangs up
            left -= len(piece)

    return run


def redirect(location: str, status: int = 302) -> Behaviour:
    def run(server: FakeHttp, conn: socket.socket, req: Request) -> None:
        server.send(conn, head(status, "text/html", 0, {"Location": location}))

    return run


# --- a TCP EMF agent ----------------------------------------------------------------------


@dataclass
class FakeAgent:
    """A loopback TCP listener standing in for the CloudWatch agent.

    mode ``read``: reads and records every newline-terminated line.
    mode ``never_read``: accepts, never reads (a stuck agent).
    ``close_first_after``: the first connection is closed after that many bytes.
    """

    port: int = 0
    mode: str = "read"
    close_first_after: int | None = None
    lines: list[bytes] = field(default_factory=list)
    partial: list[bytes] = field(default_factory=list)
    connections: int = 0

    def __post_init__(self) -> None:
        self.stopped = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self.mode == "never_read":
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.bind((LOOPBACK, self.port))
        self.port = self.sock.getsockname()[1]
        self.sock.listen(8)
        self.sock.settimeout(0.05)
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, name="fake-agent", daemon=True)
        self._accept.start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            self._conns.append(conn)
            t = threading.Thread(target=self._handle, args=(conn, self.connections), daemon=True)
            self._threads.append(t)
            t.start()

    def _handle(self, conn: socket.socket, n: int) -> None:
        if self.mode == "never_read":
            self.stopped.wait(120)
            return
        conn.settimeout(0.1)
        buf = b""
        limit = self.close_first_after if n == 1 else None
        total = 0
        with conn:
            while not self.stopped.is_set():
                want = 65536 if limit is None else max(1, min(65536, limit - total))
                try:
                    chunk = conn.recv(want)
                except TimeoutError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                total += len(chunk)
                buf += chunk
                *done, buf = buf.split(b"\n")
                self.lines += done
                if limit is not None and total >= limit:
                    # Hang up in the middle of a line: the sender sees a reset on its next write.
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    break
        if buf:
            self.partial.append(buf)

    def wait_lines(self, n: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.lines) >= n:
                return True
            time.sleep(0.02)
        return len(self.lines) >= n

    def close(self) -> None:
        self.stopped.set()
        with contextlib.suppress(OSError):
            self.sock.close()
        for c in self._conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                c.close()
        for t in [self._accept, *self._threads]:
            t.join(2)


def closed_port() -> int:
    """A loopback port with nothing listening (connections are refused)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]
