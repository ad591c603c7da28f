"""Deep health probe for the Triton container, run by the ECS ``healthCheck``.

``/v2/health/live`` only proves the HTTP server is up and ``/v2/health/ready``
answers a bare 400 without saying which model is wrong. This probe asks Triton
for the state of every model version, checks each one and, if asked, sends one
synthetic inference per model, then exits 0 (healthy), 1 (unhealthy) or 2
(usage error) with one line per problem.

It runs inside the stock Triton image, which has ``python3`` but none of the
sidecar's packages: standard library only, Python 3.8+ (Ubuntu 20.04 images),
started as ``python3 health.py`` (the few lines next to this file) or as
``python -m exporter health``. Every request shares one deadline (default 4 s,
under ECS's 5 s timeout) so a server that accepts connections and never
answers cannot hang the check. See docs/health.md.

ECS starts it as a new process every 30 s in every task, so its start-up is
kept small: no argparse unless the command line needs it (``_cli``), no
dataclasses, logging or concurrent.futures, plain threads for the per-model
checks, and ``random`` and ``ssl`` only when a check uses them.
"""

from __future__ import annotations

import _socket
import _thread
import math
import os
import time

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: typing takes milliseconds to import; type checkers know the name
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any, TypeVar

    T = TypeVar("T")
    R = TypeVar("R")

if TYPE_CHECKING or __package__:  # type checkers see the package import
    from . import _cli
else:  # imported as a top-level module by health.py, from the folder it was copied to
    import _cli

DEFAULT_URL = "http://localhost:8000"
DEFAULT_DEADLINE = 4.0
DEFAULT_JOBS = 4
REASON_MAX = 240  # characters of Triton's reason kept on a line
MAX_RESPONSE_BYTES = 32 * 1024 * 1024  # guard against a runaway body
MAX_SMOKE_BYTES = 64 * 1024 * 1024  # zeros we are willing to send per inference
LIST_MAX = 8  # model versions named on the OK line before "+N more"

# Bytes per element for Triton's binary tensor format; BYTES elements are a
# 4-byte little-endian length followed by the bytes, so an empty string is 4 zero bytes.
DTYPE_SIZES = {
    "BOOL": 1, "UINT8": 1, "INT8": 1,
    "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
    "UINT32": 4, "INT32": 4, "FP32": 4,
    "UINT64": 8, "INT64": 8, "FP64": 8,
    "BYTES": 4,
}  # fmt: skip

# Characters that would corrupt the HTTP request line or be taken as the query or
# fragment. Triton does not decode percent-escapes, so such a name cannot be
# addressed over HTTP at all; everything else (``@``, ``+``, ``%``, non-ASCII) is
# sent verbatim, non-ASCII as raw UTF-8, which Triton matches byte for byte.
_UNSENDABLE = frozenset(" ?#/\\\x7f") | frozenset(chr(c) for c in range(32))


# --- start-up cost ------------------------------------------------------------------------
#
# ECS starts the probe as a new process every 30 s in every task. The json, socket,
# urllib.parse and threading packages each import re, enum or functools (and socket turns
# hundreds of constants into enums; a str host name makes getaddrinfo load the idna codec,
# which imports re and unicodedata): together some 40 ms, many times the probe's own requests.
# The probe uses the C modules those packages are built on instead: _json's scanner (what
# json.loads runs), _socket (what socket.socket subclasses) and _thread (what threading
# wraps), plus a URL reader for the plain ``http://host:port/path`` form. Anything else
# falls back to the package, so the results are the same; tests/test_triton_side.py
# compares each with its package.


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
        import json  # no C scanner, or a byte-order mark or UTF-16/32 for json.loads to detect

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
    import urllib.parse

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
    """The model's inputs cannot be filled in automatically (e.g. a shape tensor)."""


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
                import ssl

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


# --- results ----------------------------------------------------------------------------------


class Check:
    """One check's outcome; ``status`` is ok, fail or skip."""

    FIELDS = ("check", "status", "duration_s", "detail", "model", "version", "state", "reason")  # --json's keys
    __slots__ = FIELDS

    def __init__(
        self,
        check: str,
        status: str,
        duration_s: float = 0.0,
        detail: str = "",
        model: str | None = None,
        version: str | None = None,
        state: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.check = check
        self.status = status
        self.duration_s = duration_s
        self.detail = detail
        self.model = model
        self.version = version
        self.state = state
        self.reason = reason

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.FIELDS}

    @property
    def label(self) -> str:
        return f"{self.model}/{self.version}" if self.version else str(self.model)


class Report:
    """Every check of one probe run, in order, and the versions it required."""

    def __init__(self, url: str, deadline_s: float) -> None:
        self.url = url
        self.deadline_s = deadline_s
        self.checks: list[Check] = []
        self.duration_s = 0.0
        self.required: list[str] = []

    @property
    def healthy(self) -> bool:
        return bool(self.checks) and not any(c.status == "fail" for c in self.checks)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check


class Options:
    """The probe's settings, from flags and environment (see :func:`options`)."""

    def __init__(self, json: bool = False, quiet: bool = False) -> None:
        self.url = DEFAULT_URL
        self.models: list[tuple[str, str | None]] | None = None  # None: every version in the index
        self.ignore: list[tuple[str, str | None]] = []
        self.smoke: list[tuple[str, str | None]] | None = None  # None: off; []: every required model
        self.deadline = DEFAULT_DEADLINE
        self.jobs = DEFAULT_JOBS
        self.json = json
        self.quiet = quiet


def first_line(text: object, limit: int = REASON_MAX) -> str:
    """First non-empty line of Triton's reason, control characters removed, capped."""
    s = str(text or "")
    line = next((ln.strip() for ln in s.splitlines() if ln.strip()), "")
    line = "".join(ch if ch.isprintable() else " " for ch in line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def segment(name: str) -> str | None:
    """A model name as a path segment, or None if no HTTP path can address it.

    Triton matched ``m@x.v2+b`` and ``a%41b`` verbatim and took the raw UTF-8
    bytes of a non-ASCII name, but answered "unknown model" for the
    percent-escaped forms: quoting would break working names, so none is done.
    """
    if not name or any(ch in _UNSENDABLE for ch in name) or name in (".", ".."):
        return None
    return name


def _matches(specs: list[tuple[str, str | None]], name: str, version: str) -> bool:
    return any(n == name and (v is None or v == version) for n, v in specs)


# --- the checks -------------------------------------------------------------------------------


def _timed(report: Report, check: str, fn: Callable[[], tuple[T, str]]) -> tuple[T | None, Check]:
    """Run ``fn`` and turn the probe's errors into a failed Check; returns (value, Check)."""
    t0 = time.monotonic()
    value: T | None
    try:
        value, detail = fn()
        result = Check(check, "ok", time.monotonic() - t0, detail)
    except HealthError as exc:
        value, result = None, Check(check, "fail", time.monotonic() - t0, str(exc))
    report.add(result)
    return value, result


def _live(client: Client) -> tuple[None, str]:
    try:
        resp = client.request("GET", "/v2/health/live")
    except DeadlineExceeded as exc:
        raise DeadlineExceeded(
            f"{exc}: the server accepts connections but does not respond (hung, SIGSTOPped or overloaded)"
        ) from exc
    except ConnectError as exc:
        raise ConnectError(
            f"{exc}: tritonserver is not listening (crashed, still starting, or wrong TRITON_URL)"
        ) from exc
    if resp.status != 200:
        raise ProtocolError(f"GET /v2/health/live answered HTTP {resp.status}: {first_line(resp.error_text())}")
    return None, "HTTP 200"


def _index(client: Client) -> tuple[list[dict[str, Any]], str]:
    resp = client.request("POST", "/v2/repository/index", b"{}", {"Content-Type": "application/json"})
    if resp.status != 200:
        raise ProtocolError(f"POST /v2/repository/index answered HTTP {resp.status}: {first_line(resp.error_text())}")
    body = resp.json()
    if not isinstance(body, list) or not all(isinstance(e, dict) and "name" in e for e in body):
        raise ProtocolError("POST /v2/repository/index did not answer a list of model versions")
    for e in body:
        e["name"], e["version"] = str(e["name"]), str(e.get("version", ""))
    return body, f"{len(body)} model versions listed"


def select(index: list[dict[str, Any]], opts: Options, report: Report) -> list[dict[str, Any]]:
    """Required versions from the index; records a state check for each and returns the READY ones."""
    # Unloaded on purpose (reason "unloaded"), or never loaded: in explicit model-control mode
    # Triton lists such a repository model as {"name": ...} with no version and no state.
    unloaded = {
        (e["name"], e["version"])
        for e in index
        if (e.get("state") == "UNAVAILABLE" and str(e.get("reason", "")).strip() == "unloaded") or "state" not in e
    }
    required: list[dict[str, Any]] = []
    if opts.models is None:
        for e in index:
            if (e["name"], e["version"]) in unloaded:
                continue
            if e.get("state") == "UNLOADING":
                report.add(
                    Check(
                        "state",
                        "skip",
                        0.0,
                        "being unloaded on purpose",
                        e["name"],
                        e["version"],
                        "UNLOADING",
                    )
                )
                continue
            required.append(e)
    else:
        for name, version in opts.models:
            hits = [e for e in index if e["name"] == name and (version is None or e["version"] == version)]
            if version is None and any((e["name"], e["version"]) not in unloaded for e in hits):
                hits = [e for e in hits if (e["name"], e["version"]) not in unloaded]
            if not hits and not _matches(opts.ignore, name, version or ""):
                report.add(
                    Check(
                        "state",
                        "fail",
                        0.0,
                        "not in the repository index (wrong name, or not in the model repository)",
                        name,
                        version,
                        "MISSING",
                    )
                )
                report.required.append(name if version is None else f"{name}/{version}")
            required += [e for e in hits if e not in required]
    required = [e for e in required if not _matches(opts.ignore, e["name"], e["version"])]
    ready = []
    for e in required:
        name, version, state = e["name"], e["version"], str(e.get("state", "UNKNOWN"))
        report.required.append(f"{name}/{version}" if version else name)
        reason = first_line(e.get("reason", "")) or None
        if state == "READY":
            report.add(Check("state", "ok", 0.0, "READY", name, version, state))
            ready.append(e)
        elif state == "LOADING":
            report.add(
                Check(
                    "state",
                    "fail",
                    0.0,
                    "still loading (normal during the ECS startPeriod; stuck if it lasts longer)",
                    name,
                    version,
                    state,
                    reason,
                )
            )
        elif "state" not in e:
            detail = "in the repository but never loaded (explicit model control: add it to --load-model)"
            report.add(Check("state", "fail", 0.0, detail, name, version or None, "NOT LOADED"))
        elif state == "UNAVAILABLE" and reason == "unloaded":
            report.add(
                Check(
                    "state",
                    "fail",
                    0.0,
                    "unloaded on purpose, but required (load it, or drop it from --models/HEALTH_MODELS)",
                    name,
                    version,
                    state,
                    reason,
                )
            )
        else:
            report.add(Check("state", "fail", 0.0, reason or "not ready", name, version, state, reason))
    return ready


def _ready(client: Client, name: str, version: str) -> tuple[None, str]:
    seg = segment(name)
    if seg is None:
        raise Unsynthesisable("name cannot be sent in an HTTP path; READY in the index")
    resp = client.request("GET", f"/v2/models/{seg}/versions/{version}/ready")
    if resp.status != 200:
        raise ProtocolError(
            f"index says READY but the ready endpoint answered HTTP {resp.status}: "
            f"{first_line(resp.error_text()) or 'no reason given'}"
        )
    return None, "HTTP 200"


def build_infer(meta: dict[str, Any], config: dict[str, Any] | None) -> tuple[bytes, int]:
    """Request body (JSON header + zero tensors) and the JSON header length.

    Inputs come from the model's metadata: every input that the config does not
    mark optional, its datatype, its shape with each variable (-1) dimension,
    batch included, set to 1. Data are zeros in Triton's binary tensor format,
    which is also an empty string for BYTES, and outputs are asked for in binary
    so a large output does not cost a JSON rendering.
    """
    config = config or {}
    if (config.get("model_transaction_policy") or {}).get("decoupled"):
        raise Unsynthesisable("decoupled model: Triton's HTTP infer endpoint cannot serve it")
    conf_inputs = {i.get("name"): i for i in config.get("input") or [] if isinstance(i, dict)}
    batched = int(config.get("max_batch_size") or 0) > 0
    inputs, total = [], 0
    for inp in meta.get("inputs") or []:
        name, dtype, shape = inp.get("name"), str(inp.get("datatype", "")), inp.get("shape")
        conf = conf_inputs.get(name, {})
        if conf.get("optional"):
            continue
        if conf.get("is_shape_tensor"):
            raise Unsynthesisable(f"input {name} is a shape tensor; its values cannot be guessed")
        if dtype not in DTYPE_SIZES:
            raise Unsynthesisable(f"input {name} has datatype {dtype!r}, which cannot be synthesised")
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            raise Unsynthesisable(f"input {name} has no usable shape in the metadata")
        dims = [1 if d < 0 else d for d in shape]
        if batched and "dims" in conf and len(shape) == len(conf["dims"]) + 1:
            dims[0] = 1  # the batch dimension: one request of batch size 1
        size = math.prod(dims) * DTYPE_SIZES[dtype]
        total += size
        inputs.append({"name": name, "datatype": dtype, "shape": dims, "parameters": {"binary_data_size": size}})
    if not inputs:
        raise Unsynthesisable("the model has no required inputs in its metadata")
    if total > MAX_SMOKE_BYTES:
        raise Unsynthesisable(f"inputs would need {total} bytes (limit {MAX_SMOKE_BYTES})")
    params: dict[str, object] = {"binary_data_output": True}
    if config.get("sequence_batching"):
        import random  # only sequence models need it

        params.update(sequence_id=random.randint(1 << 40, 1 << 48), sequence_start=True, sequence_end=True)
    import json  # only a smoke inference writes JSON

    header = json.dumps({"id": "triton-health", "inputs": inputs, "parameters": params}).encode()
    return header + bytes(total), len(header)


def _smoke(client: Client, name: str, version: str, explicit: bool) -> tuple[str, str]:
    """Returns (status, detail): ok, or skip for a model whose inputs cannot be synthesised."""
    seg = segment(name)
    try:
        if seg is None:
            raise Unsynthesisable("name cannot be sent in an HTTP path")
        base = f"/v2/models/{seg}/versions/{version}"
        meta_resp = client.request("GET", base)
        if meta_resp.status != 200:
            raise ProtocolError(f"metadata answered HTTP {meta_resp.status}: {first_line(meta_resp.error_text())}")
        meta = meta_resp.json()
        conf_resp = client.request("GET", base + "/config")
        config = conf_resp.json() if conf_resp.status == 200 else None
        if not isinstance(meta, dict) or (config is not None and not isinstance(config, dict)):
            raise ProtocolError("metadata or config is not a JSON object")
        body, header_len = build_infer(meta, config)
    except Unsynthesisable as exc:
        if explicit:
            raise
        return "skip", str(exc)
    t0 = time.monotonic()
    resp = client.request(
        "POST",
        base + "/infer",
        body,
        {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(header_len)},
    )
    ms = (time.monotonic() - t0) * 1000
    if resp.status != 200:
        raise ProtocolError(
            f"inference answered HTTP {resp.status}: {first_line(resp.error_text()) or 'no reason given'}"
        )
    n = resp.headers.get("inference-header-content-length")
    try:
        out = loads(resp.body[: int(n)] if n else resp.body)
    except ValueError as exc:
        raise ProtocolError("inference answered 200 with an unreadable body") from exc
    outputs = out.get("outputs") if isinstance(out, dict) else None
    if not outputs:
        raise ProtocolError("inference answered 200 without outputs")
    return "ok", f"HTTP 200 with {len(outputs)} output(s) in {ms:.0f} ms"


def _version_checks(client: Client, e: dict[str, Any], smoke: bool, explicit: bool) -> list[Check]:
    name, version = e["name"], e["version"]
    out: list[Check] = []
    t0 = time.monotonic()
    try:
        _, detail = _ready(client, name, version)
        out.append(Check("ready", "ok", time.monotonic() - t0, detail, name, version, "READY"))
    except Unsynthesisable as exc:
        out.append(Check("ready", "skip", time.monotonic() - t0, str(exc), name, version, "READY"))
    except HealthError as exc:
        out.append(Check("ready", "fail", time.monotonic() - t0, str(exc), name, version, "READY"))
        if smoke:
            out.append(Check("smoke", "skip", 0.0, "not ready", name, version))
        return out
    if smoke:
        t0 = time.monotonic()
        try:
            status, detail = _smoke(client, name, version, explicit)
        except HealthError as exc:
            status, detail = "fail", str(exc)
        out.append(Check("smoke", status, time.monotonic() - t0, detail, name, version, "READY"))
    return out


def run_parallel(fn: Callable[[T], R], items: Sequence[T], jobs: int) -> list[R]:
    """``fn`` of every item, results in order, at most ``jobs`` at a time; a call's exception is raised here.

    What ``ThreadPoolExecutor.map`` does (every call runs, the first failing
    one in order raises), on _thread: see "start-up cost" above.
    """
    if jobs <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    results: dict[int, R] = {}
    errors: dict[int, BaseException] = {}
    todo = iter(range(len(items)))
    lock = _thread.allocate_lock()

    def work(done: _thread.LockType) -> None:
        try:
            while True:
                with lock:
                    i = next(todo, None)
                if i is None:
                    return
                try:
                    results[i] = fn(items[i])
                except BaseException as exc:  # handed to the caller below, as pool.map would
                    errors[i] = exc
        finally:
            done.release()

    workers = []
    for _ in range(min(jobs, len(items))):
        done = _thread.allocate_lock()
        done.acquire()
        _thread.start_new_thread(work, (done,))
        workers.append(done)
    for done in workers:
        done.acquire()  # released when that worker has finished
    if errors:
        raise errors[min(errors)]
    return [results[i] for i in range(len(items))]


def probe(opts: Options, start: float | None = None) -> Report:
    """Run every check under one deadline and return the report (never raises HealthError)."""
    t_start = time.monotonic() if start is None else start
    deadline = Deadline(opts.deadline, t_start)
    report = Report(url=opts.url, deadline_s=opts.deadline)
    client = Client(opts.url, deadline)
    try:
        _, live = _timed(report, "live", lambda: _live(client))
        if live.status != "ok":
            return report
        index, idx = _timed(report, "index", lambda: _index(client))
        if idx.status != "ok" or index is None:
            return report
        ready = select(index, opts, report)
        if opts.models is None and not report.required:
            report.add(
                Check(
                    "index",
                    "fail",
                    0.0,
                    "no model version to check: the repository index is empty or everything is ignored or unloaded",
                )
            )
        smoke_all = opts.smoke == []
        smoke_specs = opts.smoke or []
        for name, version in smoke_specs:
            known = any(  # a required version that is not READY already has its own failure line
                c.check == "state" and c.model == name and (version is None or c.version == version)
                for c in report.checks
            )
            if not known and not _matches(opts.ignore, name, version or ""):
                report.add(
                    Check(
                        "smoke",
                        "fail",
                        0.0,
                        "smoke inference asked for, but the model is not among the required models",
                        name,
                        version,
                    )
                )
        jobs = []
        for e in ready:
            wanted = smoke_all or _matches(smoke_specs, e["name"], e["version"])
            jobs.append((e, opts.smoke is not None and wanted, not smoke_all and wanted))
        results = run_parallel(lambda job: _version_checks(client, *job), jobs, opts.jobs)
        flat = [c for r in results for c in r]
        report.checks += [c for c in flat if c.check == "ready"] + [c for c in flat if c.check == "smoke"]
        return report
    finally:
        report.duration_s = time.monotonic() - t_start


# --- output -------------------------------------------------------------------------------------


def _describe(c: Check) -> str:
    if c.model is None:
        return f"FAIL {c.check}: {c.detail}"
    who = f"model {c.model!r}" + (f" version {c.version}" if c.version else "")
    if c.check == "state":
        tail = f": {c.reason}" if c.reason and c.reason not in c.detail else ""
        return f"FAIL {who} is {c.state}: {c.detail}{tail}"
    return f"FAIL {who} ({c.state or 'state unknown'}) {c.check} check: {c.detail}"


def _names(labels: list[str]) -> str:
    shown = ", ".join(labels[:LIST_MAX])
    return shown + (f", +{len(labels) - LIST_MAX} more" if len(labels) > LIST_MAX else "")


def render_text(report: Report) -> str:
    """Lines for a human: one per failing check, then one summary line."""
    fails = [c for c in report.checks if c.status == "fail"]
    ready_ok = [c.label for c in report.checks if c.check == "ready" and c.status != "fail"]
    smoke = [c for c in report.checks if c.check == "smoke"]
    smoke_ok = sum(c.status == "ok" for c in smoke)
    skipped = [c for c in smoke if c.status == "skip"]
    took = f"{report.duration_s:.2f} s"
    if not fails:
        parts = [
            f"OK triton {report.url}: live",
            f"{len(ready_ok)} model version(s) ready ({_names(ready_ok)})",
        ]
        if smoke:
            parts.append(f"smoke inference ok for {smoke_ok}")
        if skipped:
            parts.append(
                "skipped "
                + "; ".join(f"{c.label}: {c.detail}" for c in skipped[:3])
                + (f"; +{len(skipped) - 3} more" if len(skipped) > 3 else "")
            )
        return ", ".join(parts) + f"; {took}"
    lines = [_describe(c) for c in fails]
    what = _names([c.label if c.model else c.check for c in fails])
    if any(c.check == "live" for c in fails):
        summary = f"UNHEALTHY triton {report.url}: server not answering; {took}"
    else:
        summary = (
            f"UNHEALTHY triton {report.url}: {len(fails)} failed check(s) ({what}); "
            f"{len(ready_ok)} of {len(report.required)} required model version(s) ready; {took}"
        )
    return "\n".join([*lines, summary])


def render_json(report: Report) -> str:
    import json  # only --json needs it

    doc = {
        "healthy": report.healthy,
        "url": report.url,
        "deadline_s": report.deadline_s,
        "duration_s": round(report.duration_s, 4),
        "required": report.required,
        "failed": sum(c.status == "fail" for c in report.checks),
        "checks": [dict(c.as_dict(), duration_s=round(c.duration_s, 4)) for c in report.checks],
        "summary": render_text(report).splitlines()[-1],
    }
    return json.dumps(doc, ensure_ascii=False)


# --- command line -----------------------------------------------------------------------------


def parse_specs(text: str, what: str) -> list[tuple[str, str | None]]:
    """``add,text/2`` → [("add", None), ("text", "2")]; a version follows the last slash."""
    specs: list[tuple[str, str | None]] = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, version = item.rpartition("/")
        if not sep:
            specs.append((item, None))
        elif name and version.isdigit():
            specs.append((name, version))
        else:
            raise UsageError(f"{what}: {item!r} is not MODEL or MODEL/VERSION")
    return specs


PROG = "health.py"
DESCRIPTION = (
    "Deep health check for a Triton container: liveness, every required model version "
    "READY, optional smoke inference. Exit 0 healthy, 1 unhealthy, 2 usage error. "
    "Flags win over the environment variables named in brackets."
)
FLAGS = (
    _cli.Flag("--url", "--triton-url", help=f"Triton HTTP endpoint [TRITON_URL] (default {DEFAULT_URL})"),
    _cli.Flag(
        "--models",
        kind=_cli.APPEND,
        metavar="M[,M/V...]",
        help="models that must be ready, MODEL or MODEL/VERSION, comma-separated [HEALTH_MODELS] "
        "(default: every version in the repository index except those unloaded on purpose)",
    ),
    _cli.Flag(
        "--ignore", kind=_cli.APPEND, metavar="M[,M/V...]", help="models or versions never checked [HEALTH_IGNORE]"
    ),
    _cli.Flag(
        "--smoke",
        kind=_cli.OPTIONAL,
        const="all",
        metavar="all|M[,M/V...]",
        help="send one synthetic inference to every required model (no value or 'all') or to "
        "the named ones [HEALTH_SMOKE]",
    ),
    _cli.Flag("--no-smoke", kind=_cli.SWITCH, help="no smoke inference, whatever HEALTH_SMOKE says"),
    _cli.Flag(
        "--deadline",
        metavar="SECONDS",
        help=f"overall time limit [HEALTH_DEADLINE] (default {DEFAULT_DEADLINE:g}, under ECS's 5 s)",
    ),
    _cli.Flag("--jobs", metavar="N", help=f"concurrent per-model checks [HEALTH_JOBS] (default {DEFAULT_JOBS})"),
    _cli.Flag("--json", kind=_cli.SWITCH, help="print one JSON document with every check"),
    _cli.Flag("--quiet", kind=_cli.SWITCH, help="print nothing when healthy"),
)


def options(argv: Sequence[str] | None, env: Mapping[str, str] | None = None) -> Options:
    """Merge flags and environment variables (flags win); UsageError on bad values, _cli.Exit after --help."""
    env = os.environ if env is None else env
    ns = _cli.parse(FLAGS, argv, PROG, DESCRIPTION)

    def pick(flag: object, var: str) -> str | None:
        return _cli.pick(flag, var, env)

    opts = Options(json=bool(ns["json"]), quiet=bool(ns["quiet"]))
    opts.url = (pick(ns["url"], "TRITON_URL") or DEFAULT_URL).strip()
    models = pick(ns["models"], "HEALTH_MODELS")
    if models is not None:
        opts.models = parse_specs(models, "--models/HEALTH_MODELS")
        if not opts.models:
            raise UsageError("--models/HEALTH_MODELS names no model")
    ignore = pick(ns["ignore"], "HEALTH_IGNORE")
    opts.ignore = parse_specs(ignore, "--ignore/HEALTH_IGNORE") if ignore else []
    smoke = None if ns["no_smoke"] else pick(ns["smoke"], "HEALTH_SMOKE")
    if smoke is not None:
        low = smoke.strip().lower()
        if low in ("all", "*", "1", "true", "yes", "on"):
            opts.smoke = []
        elif low not in ("0", "false", "no", "off", "none"):
            opts.smoke = parse_specs(smoke, "--smoke/HEALTH_SMOKE")
    for attr, var, flag, conv, lo, hi in (
        ("deadline", "HEALTH_DEADLINE", ns["deadline"], float, 0.0, 3600.0),
        ("jobs", "HEALTH_JOBS", ns["jobs"], int, 1, 64),
    ):
        raw = pick(flag, var)
        if raw is None:
            continue
        try:
            value = conv(raw)
        except ValueError as exc:
            raise UsageError(f"{attr} ({var}) must be a number, got {raw!r}") from exc
        if not (lo < value <= hi) or (isinstance(value, float) and math.isnan(value)):
            raise UsageError(f"{attr} ({var}) must be above {lo:g} and at most {hi:g}, got {raw!r}")
        setattr(opts, attr, value)
    Client(opts.url, Deadline(1))  # validates the URL
    return opts


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for ``python3 health.py`` and ``python -m exporter health``; returns the exit code."""
    start = time.monotonic()
    try:
        opts = options(argv)
    except _cli.Exit as exc:
        return exc.status
    except _cli.UsageError as exc:
        return _cli.usage_error(PROG, exc)
    try:
        report = probe(opts, start)
    except Exception as exc:  # a probe bug must still give ECS a clear "unhealthy" line
        print(f"UNHEALTHY triton {opts.url}: probe error {type(exc).__name__}: {first_line(exc)}", flush=True)
        return 1
    if not (opts.quiet and report.healthy):
        print(render_json(report) if opts.json else render_text(report), flush=True)
    return 0 if report.healthy else 1
