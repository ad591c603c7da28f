"""The probe's HTTP/1.1 client: one deadline for every request, and the start-up shortcuts it needs.

The health check must answer before ECS kills it, whatever Triton does. urllib's
timeout is per socket operation, so a server trickling a byte at a time keeps it
waiting for minutes; this client gives every connect, send and receive the time
left on one :class:`Deadline` and checks it between reads. It is also where the
probe avoids the packages that cost milliseconds to import (see "start-up cost"
below), and where a model name becomes a request path (:func:`segment`).

The probe's error classes live here too, at the bottom of the import chain: the
client raises most of them, and both the checks (``probe.py``) and the smoke
inference (``_infer.py``) raise :class:`Unsynthesisable`. Standard library only,
Python 3.8+.
"""

from __future__ import annotations

import _socket
import math
import time

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing takes milliseconds to import; type checkers know the name
if TYPE_CHECKING:
    from collections.abc import Callable

if TYPE_CHECKING or __package__:  # type checkers see the package import
    from . import _cli
else:  # imported as a top-level module by health.py, from the folder it was copied to
    import _cli

MAX_RESPONSE_BYTES = 32 * 1024 * 1024  # guard against a runaway body


# --- start-up cost ------------------------------------------------------------------------
#
# ECS starts the probe as a new process every 30 s in every task. The json, socket,
# urllib.parse and threading packages each import re, enum or functools (and socket turns
# hundreds of constants into enums; a str host name makes getaddrinfo load the idna codec,
# which imports re and unicodedata): together some 40 ms, many times the probe's own requests.
# The probe uses the C modules those packages are built on instead: _json's scanner (what
# json.loads runs), _socket (what socket.socket subclasses) and _thread (what threading
# wraps, in probe.run_parallel), plus a URL reader for the plain ``http://host:port/path``
# form. Anything else falls back to the package, so the results are the same;
# tests/test_triton_side.py compares each with its package.


class _JsonContext:
    """The settings json.JSONDecoder hands to _json's scanner: json.loads's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": -math.inf, "Infinity": math.inf, "NaN": math.nan}.__getitem__


def _json_scanner() -> Callable[[str, int], tuple[object, int]] | None:
    try:
        from _json import make_scanner
    except ImportError:  # not CPython: loads() uses json.loads
        return None
    return make_scanner(_JsonContext())  # type: ignore[arg-type]  # typeshed wants a JSONDecoder; these are its fields


_scan_json = _json_scanner()


def loads(data: str | bytes) -> object:
    """``json.loads`` on the C scanner json.loads itself runs; ValueError when malformed."""
    unusual = isinstance(data, bytes) and (data[:1] in (b"\xef", b"\xfe", b"\xff") or b"\0" in data[:4])
    if _scan_json is None or unusual:
        import json  # no C scanner, or a byte-order mark or UTF-16/32 for json.loads to detect (~5 ms: re, enum)

        return json.loads(data)
    text = data.decode("utf-8", "surrogatepass") if isinstance(data, bytes) else data  # as json.loads decodes
    start, n = 0, len(text)
    while start < n and text[start] in " \t\n\r":
        start += 1
    try:
        value, end = _scan_json(text, start)
    except StopIteration:
        raise ValueError(f"no JSON value at character {start}") from None
    while end < n and text[end] in " \t\n\r":
        end += 1
    if end != n:
        raise ValueError(f"extra data after the JSON value at character {end}")
    return value


_SCHEMES = ("http", "https")
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")
_PATH_CHARS = frozenset(chr(c) for c in range(0x21, 0x7F)) - frozenset("?#\\[]@%")


def split_url(url: str) -> tuple[str, str | None, int | None, str]:
    """(scheme, host name, port, path) as ``urllib.parse.urlsplit`` reads them; ValueError for a bad port.

    Reads ``scheme://host[:port][/path]`` with a plain host name or IPv4
    address itself and hands anything else (IPv6 brackets, user info, a query,
    percent signs, non-ASCII, spaces) to urlsplit.
    """
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    host, _, port = netloc.partition(":")
    if (
        sep
        and scheme.lower() in _SCHEMES
        and host
        and set(host) <= _HOST_CHARS
        and (not port or (port.isdigit() and port.isascii()))
        and set(path) <= _PATH_CHARS
    ):
        number = int(port) if port else None
        if number is not None and number > 65535:
            raise ValueError("Port out of range 0-65535")
        return scheme.lower(), host.lower(), number, slash + path
    import urllib.parse  # only for URLs the fast path leaves to it: ~6 ms (re, enum, ipaddress)

    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # unbalanced IPv6 brackets and the like: no host to read
        return "", None, None, ""
    return parts.scheme, parts.hostname, parts.port, parts.path


def open_tcp(host: str, port: int, deadline: Deadline) -> _socket.socket:
    """``socket.create_connection`` on _socket: each address in turn, each try bounded by the deadline."""
    # getaddrinfo runs the idna codec on every str host; an ASCII name needs none of it.
    name: str | bytes = host.encode("ascii") if host.isascii() else host
    last: OSError = OSError(f"no address for {host}")
    for family, kind, proto, _, address in _socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(deadline.left())
            sock.connect(address)
        except OSError as exc:
            sock.close()
            if isinstance(exc, (_socket.timeout, TimeoutError)):
                raise  # the deadline is spent: no time for the next address
            last = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise last


# --- errors -------------------------------------------------------------------------------


class HealthError(Exception):
    """Base class for the probe's own errors."""


class UsageError(HealthError, _cli.UsageError):
    """Bad flag or environment value: exit code 2."""


class DeadlineExceeded(HealthError):
    """The shared deadline ran out before Triton answered."""


class ConnectError(HealthError):
    """The TCP connection to Triton could not be made or broke."""


class ProtocolError(HealthError):
    """Triton answered something that is not the HTTP/JSON we expect."""


class Unsynthesisable(HealthError):
    """The model's inputs cannot be filled in automatically (e.g. a shape tensor).

    Reported as skipped, unless the model was named in ``--smoke``; also raised
    for a model whose name no HTTP path can address (:func:`segment`).
    """


# --- deadline and a tiny HTTP/1.1 client ----------------------------------------------------


class Deadline:
    """One budget for the whole probe; every socket operation gets what is left."""

    def __init__(self, seconds: float, start: float | None = None) -> None:
        self.seconds = seconds
        self.end = (time.monotonic() if start is None else start) + seconds

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def left(self) -> float:
        """Remaining seconds, or DeadlineExceeded when none are left."""
        rem = self.remaining()
        if rem <= 0:
            raise DeadlineExceeded(f"deadline of {self.seconds:g} s exceeded")
        return rem


class Response:
    """One HTTP answer, read whole."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> object:
        try:
            return loads(self.body.decode("utf-8"))
        except ValueError as exc:  # UnicodeDecodeError included
            raise ProtocolError(f"HTTP {self.status} with a body that is not JSON: {self.body[:80]!r}") from exc

    def error_text(self) -> str:
        """Triton's ``{"error": ...}`` message, or the raw body."""
        text = self.body.decode("utf-8", "replace").strip()
        try:
            obj = loads(text)
        except ValueError:
            return text
        error = obj.get("error") if isinstance(obj, dict) else None
        return error if isinstance(error, str) else text


class Client:
    """Minimal HTTP/1.1 client over a raw socket.

    urllib's timeout applies per socket operation, so a server trickling one
    byte per second would keep it alive forever; here every connect, send and
    recv gets the time left on the shared deadline and the read loop checks it
    between reads. Raw sockets also let a non-ASCII model name go out as UTF-8,
    which http.client refuses to put in a request line.
    """

    def __init__(self, url: str, deadline: Deadline) -> None:
        try:
            scheme, hostname, port, path = split_url(url)
        except ValueError as exc:
            raise UsageError(f"bad port in Triton URL {url!r}") from exc
        if scheme not in _SCHEMES or not hostname:
            raise UsageError(f"Triton URL must look like http://host:port, got {url!r}")
        self.url = url.rstrip("/")
        self.https = scheme == "https"
        self.host = hostname
        self.port = port or (443 if self.https else 80)
        self.prefix = path.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if port is None else f"{host}:{self.port}"
        self.deadline = deadline

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> Response:
        """Send one request with ``Connection: close`` and return the whole Response."""
        lines = [
            f"{method} {self.prefix}{path} HTTP/1.1",
            f"Host: {self.host_header}",
            "Connection: close",
            "User-Agent: triton-health",
            "Accept: */*",
        ]
        if body is not None or method == "POST":
            lines.append(f"Content-Length: {len(body or b'')}")
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + (body or b"")
        what = f"{self.host}:{self.port}"
        try:
            sock = open_tcp(self.host, self.port, self.deadline)
        except (_socket.timeout, TimeoutError) as exc:  # distinct classes before Python 3.10
            raise DeadlineExceeded(f"no TCP connection to {what} within {self.deadline.seconds:g} s") from exc
        except OSError as exc:
            raise ConnectError(f"cannot connect to {what}: {exc.strerror or exc}") from exc
        try:
            if self.https:
                import socket  # https only: ssl wraps a socket.socket (and imports socket anyway)
                import ssl  # ~10 ms with socket, enum and re: only an https URL pays it

                sock = socket.socket(fileno=sock.detach())
                sock.settimeout(self.deadline.left())
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(self.deadline.left())
            sock.sendall(data)  # the timeout bounds the whole sendall since Python 3.5
            return self._read(sock)
        except (_socket.timeout, TimeoutError) as exc:
            raise DeadlineExceeded(f"no answer from {what} within {self.deadline.seconds:g} s") from exc
        except OSError as exc:
            raise ConnectError(f"connection to {what} failed: {exc.strerror or exc}") from exc
        finally:
            sock.close()

    def _read(self, sock: _socket.socket) -> Response:
        buf = bytearray()
        head: tuple[int, dict[str, str], int] | None = None
        while True:
            if head is None:
                end = buf.find(b"\r\n\r\n")
                if end >= 0:
                    head = _parse_head(bytes(buf[:end]), end + 4)
            if head is not None:
                status, headers, start = head
                body = _complete_body(headers, bytes(buf[start:]), status)
                if body is not None:
                    return Response(status, headers, body)
            sock.settimeout(self.deadline.left())
            chunk = sock.recv(65536)
            if not chunk:
                if head is None:
                    raise ProtocolError("connection closed before an HTTP answer")
                status, headers, start = head
                if "content-length" in headers or "chunked" in headers.get("transfer-encoding", ""):
                    raise ProtocolError("connection closed in the middle of the answer")
                return Response(status, headers, bytes(buf[start:]))
            buf += chunk
            if len(buf) > MAX_RESPONSE_BYTES:
                raise ProtocolError(f"answer larger than {MAX_RESPONSE_BYTES} bytes")


def _parse_head(raw: bytes, body_start: int) -> tuple[int, dict[str, str], int]:
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ProtocolError(f"not an HTTP answer: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers, body_start


def _complete_body(headers: dict[str, str], data: bytes, status: int) -> bytes | None:
    """The body once all of it has arrived, else None (read more)."""
    if status in (204, 304) or 100 <= status < 200:
        return b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return _dechunk(data)
    length = headers.get("content-length")
    if length is not None:
        try:
            n = int(length)
        except ValueError as exc:
            raise ProtocolError(f"bad Content-Length {length!r}") from exc
        return data[:n] if len(data) >= n else None
    return None  # read until the server closes


def _dechunk(data: bytes) -> bytes | None:
    out = bytearray()
    pos = 0
    while True:
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            return None
        try:
            size = int(data[pos:eol].split(b";")[0], 16)
        except ValueError as exc:
            raise ProtocolError("bad chunked encoding") from exc
        if size == 0:
            return bytes(out) if data.find(b"\r\n\r\n", eol) >= 0 or data.endswith(b"\r\n") else None
        start = eol + 2
        if len(data) < start + size + 2:
            return None
        out += data[start : start + size]
        pos = start + size + 2


# --- model names in request paths -------------------------------------------------------

# Characters that would corrupt the HTTP request line or be taken as the query or
# fragment. Triton does not decode percent-escapes, so such a name cannot be
# addressed over HTTP at all; everything else (``@``, ``+``, ``%``, non-ASCII) is
# sent verbatim, non-ASCII as raw UTF-8, which Triton matches byte for byte.
_UNSENDABLE = frozenset(" ?#/\\\x7f") | frozenset(chr(c) for c in range(32))


def segment(name: str) -> str | None:
    """A model name as a path segment, or None if no HTTP path can address it.

    Triton matched ``m@x.v2+b`` and ``a%41b`` verbatim and took the raw UTF-8
    bytes of a non-ASCII name, but answered "unknown model" for the
    percent-escaped forms: quoting would break working names, so none is done.
    """
    if not name or any(ch in _UNSENDABLE for ch in name) or name in (".", ".."):
        return None
    return name
