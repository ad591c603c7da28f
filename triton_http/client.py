"""The client: one call, one connection, one deadline (see the package's docstring for the rules).

Built on ``http.client``, which parses the answer (status line, headers, chunked or sized bodies, with its
own bounds on a header line and on the number of headers); the socket it reads and writes is wrapped so
that every send and receive gets the time left before the call's deadline.
"""

from __future__ import annotations

import base64
import http.client
import io
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import unquote, urlsplit

import orjson

from .errors import Broken, CannotConnect, Redirected, RequestFailed, TimedOut, TooLarge

if TYPE_CHECKING:
    import ssl

_CHUNK = 65536

ReadInto = Callable[[memoryview], "int | None"]
TextReader = Callable[[ReadInto, int], "str | bytes"]
"""Reads a body of known size through ``readinto``: a str when it came whole as text, else the bytes read
(the exporter's C scanner has one that reads ASCII straight into a str, without a bytes copy beside it)."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    content_type: str
    body: bytes
    text: str | None = None  # the body, when a text reader read it as a str (``body`` is then empty)

    def json(self) -> Any:
        """The body as JSON; ValueError when it is not."""
        return orjson.loads(self.body)


class Client:
    """Calls bounded by ``connect_timeout`` (at most; never past the call's deadline) and ``max_bytes``.

    It holds no connection between calls, so one client may serve several threads at once. ``headers`` go with
    every call (Triton's admin key: :mod:`triton_http.admin`); they are never part of a message."""

    def __init__(
        self,
        connect_timeout: float,
        max_bytes: int,
        user_agent: str = "triton-emf-exporter",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.max_bytes = max_bytes
        self.user_agent = user_agent
        self.headers = dict(headers or {})

    def get(self, url: str, timeout: float, max_bytes: int | None = None) -> Response:
        return self.request("GET", url, timeout, max_bytes=max_bytes)

    def post(self, url: str, timeout: float, json: object = None, max_bytes: int | None = None) -> Response:
        """POST ``json`` (an empty object when None: Triton's POST endpoints take a JSON body)."""
        return self.request("POST", url, timeout, {} if json is None else json, max_bytes)

    def request(
        self,
        method: str,
        url: str,
        timeout: float,
        json: object = None,
        max_bytes: int | None = None,
        *,
        text: TextReader | None = None,
    ) -> Response:
        """The whole answer within ``timeout`` seconds, any status but a redirect; raises RequestFailed.

        ``text`` reads a body of known length (``Response.text`` when it gives a str)."""
        deadline = time.monotonic() + timeout
        cap = self.max_bytes if max_bytes is None else max_bytes
        try:
            target = _target(url)
        except ValueError as exc:
            raise RequestFailed(url, f"not a usable URL ({exc})") from None
        headers = {**self.headers, "User-Agent": self.user_agent, "Accept": "*/*", "Connection": "close"}
        if target.authorization:
            headers["Authorization"] = target.authorization
        body = None
        if json is not None:
            body = orjson.dumps(json)
            headers["Content-Type"] = "application/json"
        sock = _connect(url, target, min(self.connect_timeout, timeout), deadline)
        try:
            return _exchange(url, target, sock, method, body, headers, timeout, deadline, cap, text)
        finally:
            sock.close()


class _Target(NamedTuple):
    scheme: str
    host: str
    port: int
    path: str
    authorization: str


@lru_cache(maxsize=1024)
def _target(url: str) -> _Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http:// or https:// URL with a host")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    auth = ""
    if parts.username is not None or parts.password is not None:
        pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
        try:
            raw = pair.encode("latin-1")
        except UnicodeEncodeError:
            raw = pair.encode("utf-8")
        auth = "Basic " + base64.b64encode(raw).decode("ascii")
    return _Target(parts.scheme, parts.hostname, port, path, auth)


def _connect(url: str, target: _Target, connect_timeout: float, deadline: float) -> socket.socket:
    limit = max(min(connect_timeout, deadline - time.monotonic()), 0.001)
    try:
        sock = socket.create_connection((target.host, target.port), timeout=limit)
    except TimeoutError:
        raise CannotConnect(url, f"connect timed out after {connect_timeout:g}s") from None
    except OSError as exc:
        raise CannotConnect(url, f"cannot connect ({_short(exc)})") from None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if target.scheme == "https":
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock = _tls().wrap_socket(sock, server_hostname=target.host)
    except OSError as exc:  # ssl.SSLError is one
        sock.close()
        raise CannotConnect(url, f"cannot connect ({_short(exc)})") from None
    return sock


def _exchange(
    url: str,
    target: _Target,
    sock: socket.socket,
    method: str,
    body: bytes | None,
    headers: dict[str, str],
    timeout: float,
    deadline: float,
    cap: int,
    text: TextReader | None,
) -> Response:
    conn = http.client.HTTPConnection(target.host, target.port)
    conn.sock = _DeadlineSocket(sock, deadline)  # sendall, makefile and close: all http.client calls of a socket
    try:
        conn.request(method, target.path, body, headers)
    except TimeoutError:
        raise TimedOut(url, f"no answer within {timeout:g}s") from None
    except (http.client.InvalidURL, ValueError) as exc:  # a path or header with control or non-ASCII characters
        raise RequestFailed(url, f"not a usable request ({exc})") from None
    except OSError as exc:
        raise Broken(url, f"connection broke before the answer ({_short(exc)})") from None
    try:
        resp = conn.getresponse()
    except TimeoutError:
        raise TimedOut(url, f"no answer within {timeout:g}s") from None
    except http.client.HTTPException as exc:  # a bad status line, an overlong header, closed without an answer
        raise Broken(url, f"no HTTP answer ({_short(exc)})") from None
    except OSError as exc:
        raise Broken(url, f"connection broke before the answer ({_short(exc)})") from None
    try:
        return _body(url, resp, timeout, cap, text)
    finally:
        resp.close()


def _body(url: str, resp: http.client.HTTPResponse, timeout: float, cap: int, text: TextReader | None) -> Response:
    if 300 <= resp.status < 400:
        raise Redirected(url, resp.status, resp.getheader("Location", "?"))
    if resp.length is not None and resp.length > cap:
        raise TooLarge(url, f"body larger than the {cap} byte cap; refused")
    if resp.length is not None:
        got = _sized(url, resp, timeout, text)
        if isinstance(got, str):
            return Response(resp.status, resp.getheader("Content-Type", ""), b"", got)
        return Response(resp.status, resp.getheader("Content-Type", ""), got)
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            chunk = resp.read1(_CHUNK)
        except TimeoutError:
            raise TimedOut(url, f"body not complete within {timeout:g}s ({size} bytes read)") from None
        except (http.client.HTTPException, OSError) as exc:  # a broken chunked body, a reset
            raise Broken(url, f"connection broke while reading ({_short(exc)})") from None
        if not chunk:
            break
        size += len(chunk)
        if size > cap:
            raise TooLarge(url, f"body larger than the {cap} byte cap; refused")
        chunks.append(chunk)
    return Response(resp.status, resp.getheader("Content-Type", ""), b"".join(chunks))


def _sized(url: str, resp: http.client.HTTPResponse, timeout: float, text: TextReader | None) -> str | bytes:
    """A body of known length read into one buffer of that size: chunks joined at the end held the body
    twice (10 MB at 1000 LLM models), and the chunks' freed heap stayed in the process's RSS."""
    assert resp.length is not None
    try:
        # io.BufferedReader reads straight into one bytes of that length; a text reader, into its str
        body = resp.read(resp.length) if text is None else text(resp.readinto, resp.length)
    except TimeoutError:
        raise TimedOut(url, f"body not complete within {timeout:g}s") from None
    except (http.client.HTTPException, OSError) as exc:  # a reset
        raise Broken(url, f"connection broke while reading ({_short(exc)})") from None
    if resp.length:  # a sized body that ended early: http.client returns what came
        missing = f"IncompleteRead({len(body)} bytes read, {resp.length} more expected)"
        raise Broken(url, f"connection broke while reading ({missing})")
    return body


class _DeadlineSocket:
    """The connection's socket as http.client uses it (``sendall``, ``makefile``, ``close``), with every
    send and receive limited to the time left before ``deadline``. The client closes the real socket."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline

    def arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        self.sock.settimeout(left)

    def sendall(self, data: bytes) -> None:
        self.arm()
        self.sock.sendall(data)

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self), _CHUNK)

    def close(self) -> None:
        pass


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: _DeadlineSocket) -> None:
        self.sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self.sock.arm()
        return self.sock.sock.recv_into(buffer)


_context: ssl.SSLContext | None = None


def _tls() -> ssl.SSLContext:
    """The system's trust store, certificates and host names verified; ssl is imported by the first https
    call only (every URL of a default deployment is http on localhost)."""
    global _context
    if _context is None:
        import ssl

        _context = ssl.create_default_context()
    return _context


def _short(exc: BaseException) -> str:
    """The useful part of a socket or http.client error: '[Errno 111] Connection refused', 'timed out'."""
    text = str(exc)
    m = re.search(r"\[Errno -?\d+\] [^'\")\]]+", text)
    if m:
        return m.group(0).strip()
    if "timed out" in text.lower():
        return "timed out"
    if isinstance(exc, http.client.HTTPException) and not isinstance(exc, http.client.IncompleteRead):
        shown = text if text.isprintable() else repr(text)  # a bad status line is whatever the port sent
        return f"{type(exc).__name__}: {shown}"[:200] if text else type(exc).__name__
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]
