"""The probe's HTTP/1.1 client: one deadline for every request, a size bound on every answer.

The health check must answer before ECS kills it, whatever Triton (or whatever
listens on its port) does. urllib's timeout is per socket operation, so a
server trickling a byte at a time keeps it waiting for minutes; this client
gives every connect, send and receive the time left on one :class:`Deadline`.
Every answer is read under bounds: its header up to :data:`MAX_HEAD_BYTES`,
its body up to :data:`MAX_BODY_BYTES` (or only the part the caller needs), its
JSON up to :data:`_jsonparse.MAX_DEPTH` levels; what breaks a bound is a
:class:`ProtocolError`, which the probe prints as one FAIL line. It is also
where a model name becomes a request path (:func:`segment`).

The probe's error classes live here too, at the bottom of the import chain: the
client raises most of them, and both the checks (``probe.py``) and the smoke
inference (``_infer.py``) raise :class:`Unsynthesisable`. Standard library only
(public modules: the probe must run on whatever Python the Triton image brings),
Python 3.8+.
"""

from __future__ import annotations

import socket
import time

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing takes milliseconds to import; type checkers know the name
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

if TYPE_CHECKING or __package__:  # type checkers see the package import
    from . import _cli, _jsonparse
else:  # imported as a top-level module by health.py, from the folder it was copied to
    import _cli
    import _jsonparse

MAX_HEAD_BYTES = 64 * 1024  # status line and headers (and a chunked body's trailers)
# One answer's body: an index of tens of thousands of model versions fits (about 80 bytes each, more with a
# reason); the JSON reader reads this much in well under a second, holding at most about 200 MB while it does
# (8 MiB of empty arrays, the worst case).
MAX_BODY_BYTES = 8 * 1024 * 1024


# --- start-up cost ------------------------------------------------------------------------
#
# ECS starts the probe as a new process every 30 s in every task, so what it imports is
# most of its cost. It imports socket (which brings enum, functools, collections and
# selectors: unavoidable for TCP with public modules) and nothing else it can do without:
# no json (_jsonparse reads the answers), no urllib.parse unless the URL is unusual
# (split_url), no argparse unless the command line needs it (_cli), threading only to
# check several models at once (probe.run_parallel) or to resolve a host name, and no
# getaddrinfo for "localhost" or an IP address: getaddrinfo runs the idna codec on every
# str host, which imports re, stringprep and unicodedata. tests/unit/triton_side/test_triton_side.py
# compares each shortcut with the standard-library code it stands for, and fails if the
# default run imports any of those modules.


def loads(data: str | bytes) -> object:
    """``json.loads`` with the probe's nesting bound (:func:`_jsonparse.loads`); ValueError when malformed."""
    return _jsonparse.loads(data)


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


def addresses(host: str, port: int, deadline: Deadline) -> list[tuple[int, tuple[object, ...]]]:
    """(family, socket address) to try in turn, as ``getaddrinfo`` lists them; OSError when there are none.

    "localhost" is the loopback addresses (RFC 6761: no resolver asked), IPv4
    first because Triton listens on 0.0.0.0 unless told otherwise, and an IP
    address is itself: neither pays for the idna codec (see "start-up cost").
    A name goes to getaddrinfo in a thread, so a resolver that does not answer
    cannot outlast the deadline.
    """
    if host == "localhost":
        return [(socket.AF_INET, ("127.0.0.1", port)), (socket.AF_INET6, ("::1", port, 0, 0))]
    for family, address in ((socket.AF_INET, (host, port)), (socket.AF_INET6, (host, port, 0, 0))):
        try:
            socket.inet_pton(family, host)
        except (OSError, ValueError):  # not an address of this family (ValueError: a NUL in it)
            continue
        return [(family, address)]
    return _resolve(host, port, deadline)


def _resolve(host: str, port: int, deadline: Deadline) -> list[tuple[int, tuple[object, ...]]]:
    import threading  # names only: localhost and addresses need no thread

    found: list[list[tuple[int, tuple[object, ...]]]] = []
    failed: list[BaseException] = []

    def lookup() -> None:
        try:
            found.append([(i[0], i[4]) for i in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)])
        except BaseException as exc:  # handed to the caller below
            failed.append(exc)

    worker = threading.Thread(target=lookup, name="resolve", daemon=True)  # left to the exit if it never returns
    worker.start()
    worker.join(deadline.left())
    if failed:
        if isinstance(failed[0], OSError):
            raise ResolveError(f"cannot resolve {host!r}: {failed[0].strerror or failed[0]}") from failed[0]
        raise failed[0]
    if not found:
        raise ResolveError(f"cannot resolve {host!r}: no answer from the resolver within {deadline.seconds:g} s")
    return found[0]


def open_tcp(targets: list[tuple[int, tuple[object, ...]]], deadline: Deadline) -> socket.socket:
    """``socket.create_connection`` under the deadline: each of :func:`addresses` in turn, each try bounded by it."""
    last: OSError = OSError("no address to connect to")
    for family, address in targets:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:  # e.g. no IPv6 in this container
            last = exc
            continue
        try:
            sock.settimeout(deadline.left())
            sock.connect(address)
        except OSError as exc:
            sock.close()
            if isinstance(exc, (socket.timeout, TimeoutError)):
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


class ResolveError(ConnectError):
    """The host name in the URL did not resolve, or not within the deadline."""


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
    """One HTTP answer: its status, headers and body (or the part of the body that was asked for)."""

    __slots__ = ("body", "headers", "status", "what")

    def __init__(self, status: int, headers: dict[str, str], body: bytes, what: str = "the answer") -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.what = what  # the request, for messages: "POST /v2/repository/index"

    def json(self) -> object:
        """The body as JSON; ProtocolError (a FAIL line, never a traceback) when it is not, or nests too deep."""
        try:
            return loads(self.body.decode("utf-8"))
        except _jsonparse.TooDeep as exc:
            raise ProtocolError(f"{self.what} answered HTTP {self.status} with {exc}: refused") from exc
        except ValueError as exc:  # UnicodeDecodeError included
            raise ProtocolError(
                f"{self.what} answered HTTP {self.status} with a body that is not JSON: {self.body[:80]!r}"
            ) from exc

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
    """Minimal HTTP/1.1 client over a plain socket.

    urllib's timeout applies per socket operation, so a server trickling one
    byte per second would keep it alive forever; here every connect, send and
    recv gets the time left on the shared deadline. Its own socket also lets a
    non-ASCII model name go out as UTF-8, which http.client refuses to put in
    a request line.
    """

    def __init__(self, url: str, deadline: Deadline, headers: dict[str, str] | None = None) -> None:
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
        self.headers = dict(headers or {})  # sent with every request (Triton's admin key)
        self.targets: list[tuple[int, tuple[object, ...]]] | None = None  # resolved once, by the first request

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        wanted: Callable[[Mapping[str, str]], int | None] | None = None,
    ) -> Response:
        """Send one request with ``Connection: close`` and return the Response.

        ``wanted`` reads the answer's headers and says how many bytes of its
        body the caller needs (None: all of it): reading stops there, so a large
        answer whose head is enough (an inference's JSON header before its
        binary outputs) is neither refused nor held.
        """
        lines = [
            f"{method} {self.prefix}{path} HTTP/1.1",
            f"Host: {self.host_header}",
            "Connection: close",
            "User-Agent: triton-health",
            "Accept: */*",
        ]
        if body is not None or method == "POST":
            lines.append(f"Content-Length: {len(body or b'')}")
        lines += [f"{k}: {v}" for k, v in {**self.headers, **(headers or {})}.items()]
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + (body or b"")
        what = f"{self.host}:{self.port}"
        if self.targets is None:
            self.targets = addresses(self.host, self.port, self.deadline)
        try:
            sock = open_tcp(self.targets, self.deadline)
        except (socket.timeout, TimeoutError) as exc:  # distinct classes before Python 3.10
            raise DeadlineExceeded(f"no TCP connection to {what} within {self.deadline.seconds:g} s") from exc
        except OSError as exc:
            raise ConnectError(f"cannot connect to {what}: {exc.strerror or exc}") from exc
        try:
            if self.https:
                import ssl  # ~10 ms with re: only an https URL pays it

                sock.settimeout(self.deadline.left())
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(self.deadline.left())
            sock.sendall(data)  # the timeout bounds the whole sendall since Python 3.5
            return _Reader(sock, self.deadline, f"{method} {path}", wanted).response()
        except (socket.timeout, TimeoutError) as exc:
            raise DeadlineExceeded(f"no answer from {what} within {self.deadline.seconds:g} s") from exc
        except OSError as exc:
            raise ConnectError(f"connection to {what} failed: {exc.strerror or exc}") from exc
        finally:
            sock.close()


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n >= 1024 * 1024 else f"{n // 1024} KiB"


class _Reader:
    """Reads one answer from a socket under the deadline and the size bounds."""

    def __init__(
        self,
        sock: socket.socket,
        deadline: Deadline,
        what: str,
        wanted: Callable[[Mapping[str, str]], int | None] | None,
    ) -> None:
        self.sock = sock
        self.deadline = deadline
        self.what = what
        self.wanted = wanted

    def _recv(self) -> bytes:
        self.sock.settimeout(self.deadline.left())
        return self.sock.recv(65536)

    def _refuse(self, why: str) -> ProtocolError:
        return ProtocolError(f"{self.what}: {why}")

    def response(self) -> Response:
        buf = bytearray()
        while True:
            chunk = self._recv()
            if not chunk:
                raise self._refuse("connection closed before an HTTP answer" if not buf else "answer cut short")
            scanned = max(0, len(buf) - 3)
            buf += chunk
            end = buf.find(b"\r\n\r\n", scanned)
            if end >= 0:
                break
            if len(buf) > MAX_HEAD_BYTES:
                raise self._refuse(f"answer's header longer than {_size(MAX_HEAD_BYTES)}: refused")
        if end > MAX_HEAD_BYTES:
            raise self._refuse(f"answer's header longer than {_size(MAX_HEAD_BYTES)}: refused")
        try:
            status, headers = _parse_head(bytes(buf[:end]))
        except ProtocolError as exc:
            raise self._refuse(str(exc)) from None
        if status in (204, 304) or 100 <= status < 200:
            return Response(status, headers, b"", self.what)
        wanted = self.wanted(headers) if self.wanted is not None else None
        try:
            body = _Body(headers, wanted)
        except ProtocolError as exc:
            raise self._refuse(str(exc)) from None
        data = bytes(buf[end + 4 :])
        try:
            while not body.feed(data):
                data = self._recv()
                if not data:
                    body.end()
                    break
        except ProtocolError as exc:
            raise self._refuse(str(exc)) from None
        return Response(status, headers, body.value(), self.what)


def _parse_head(raw: bytes) -> tuple[int, dict[str, str]]:
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    code = parts[1] if len(parts) > 1 else ""
    if not parts[0].startswith("HTTP/") or len(code) != 3 or not (code.isascii() and code.isdigit()):
        raise ProtocolError(f"not an HTTP answer: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    return int(code), headers


_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")


class _Body:
    """One answer's body as it arrives: by Content-Length, chunked, or until the server closes.

    ``feed`` takes the bytes read so far and says whether the body is complete
    (or as long as ``wanted``); more than :data:`MAX_BODY_BYTES` is refused.
    A chunked body is decoded as it comes, each byte once.
    """

    def __init__(self, headers: Mapping[str, str], wanted: int | None) -> None:
        self.wanted = wanted
        self.data = bytearray()
        self.length: int | None = None
        self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if not self.chunked and "content-length" in headers:
            text = headers["content-length"]
            if not (text.isascii() and text.isdigit()) or len(text) > 18:
                raise ProtocolError(f"bad Content-Length {text[:40]!r}")
            self.length = int(text)
            if self.length > MAX_BODY_BYTES and (wanted is None or wanted > MAX_BODY_BYTES):
                raise ProtocolError(
                    f"answer of {self.length} bytes, over the probe's limit of {_size(MAX_BODY_BYTES)}: refused"
                )
        self.raw = bytearray()  # chunked: bytes not decoded yet
        self.state = "size"  # chunked: size, data, crlf, trailer, done
        self.remaining = 0  # chunked: bytes left in the current chunk

    def _enough(self) -> bool:
        if self.wanted is not None and len(self.data) >= self.wanted:
            return True
        if self.length is not None:
            return len(self.data) >= self.length
        if len(self.data) > MAX_BODY_BYTES:
            raise ProtocolError(f"answer larger than the probe's limit of {_size(MAX_BODY_BYTES)}: refused")
        return False

    def feed(self, data: bytes) -> bool:
        """Add what was read; True when the body is complete (or as long as wanted)."""
        if not self.chunked:
            self.data += data
            return self._enough()
        self.raw += data
        pos, raw = 0, self.raw
        while True:
            if self.state == "size":
                eol = raw.find(b"\r\n", pos)
                if eol < 0:
                    if len(raw) - pos > 1024:
                        raise ProtocolError("bad chunked encoding: a chunk-size line over 1 KiB")
                    break
                size = bytes(raw[pos:eol]).split(b";", 1)[0].strip()
                if not size or len(size) > 15 or not _HEX_DIGITS.issuperset(size):
                    raise ProtocolError(f"bad chunked encoding: chunk size {size[:20]!r}")
                self.remaining = int(size, 16)
                pos = eol + 2
                self.state = "data" if self.remaining else "trailer"
            elif self.state == "data":
                take = min(self.remaining, len(raw) - pos)
                if not take:
                    break
                self.data += raw[pos : pos + take]
                pos += take
                self.remaining -= take
                if not self.remaining:
                    self.state = "crlf"
                if self._enough():
                    return True
            elif self.state == "crlf":
                if len(raw) - pos < 2:
                    break
                if raw[pos : pos + 2] != b"\r\n":
                    raise ProtocolError("bad chunked encoding: no CRLF after a chunk")
                pos += 2
                self.state = "size"
            else:  # trailer: a field per line, then a blank line
                eol = raw.find(b"\r\n", pos)
                if eol < 0:
                    if len(raw) - pos > MAX_HEAD_BYTES:
                        raise ProtocolError(f"trailer longer than {_size(MAX_HEAD_BYTES)}: refused")
                    break
                blank = eol == pos
                pos = eol + 2
                if blank:
                    self.state = "done"
            if self.state == "done":
                del raw[:pos]
                return True
        del raw[:pos]
        return False

    def end(self) -> None:
        """The server closed the connection: fine if the body was complete, else ProtocolError."""
        if self.chunked:
            if self.state not in ("trailer", "done"):  # a last chunk with no blank line after it is accepted
                raise ProtocolError("connection closed in the middle of the answer")
        elif self.length is not None and len(self.data) < self.length:
            raise ProtocolError("connection closed in the middle of the answer")

    def value(self) -> bytes:
        """The body, cut at Content-Length and at what was wanted."""
        ends = [n for n in (self.wanted, self.length) if n is not None]
        return bytes(self.data[: min(ends)] if ends else self.data)


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
