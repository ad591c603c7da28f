"""The one HTTP client the sources share: bounded in time and size, no surprises.

- One ``requests.Session``, ``trust_env`` off so no proxy or netrc from the
  environment redirects our traffic, redirects not followed (a 3xx is an
  error: we talk only to the configured URLs).
- No keep-alive (``Connection: close``): an idle connection held between
  scrapes made Triton's graceful shutdown wait its whole exit timeout
  ("Found 1 HTTP service connections", 30 s in the task definition) and then
  exit with "Exit timeout expired". One new connection a cycle costs nothing
  at a 60 s interval.
- ``requests``' read timeout applies per socket read, so a server that
  drips one byte per second would never trip it. ``fetch`` enforces one
  overall deadline: it reads with ``read1`` and shrinks the socket timeout
  to the time left before every read.
- Bodies are capped (``max_bytes``) while streaming, so a 200 MB answer is
  refused after ``max_bytes`` are read, not after it is all in memory.
- Credentials in a URL (``http://user:secret@host``) are sent as configured
  but never written into an error message: :func:`redact` replaces them.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import dataclass

import requests

from . import SourceError


@dataclass
class Response:
    status: int
    content_type: str
    body: bytes


_USERINFO = re.compile(r"(?<=//)[^/@\s'\"]*@")


def redact(text: str) -> str:
    """``text`` with the user:password part of every URL in it replaced by ``***``."""
    return _USERINFO.sub("***@", text) if "@" in text else text


def make_session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    session.headers["User-Agent"] = "triton-emf-exporter"
    session.headers["Accept-Encoding"] = "identity"  # the byte cap then bounds what we hold
    session.headers["Connection"] = "close"  # never hold Triton's shutdown (see above)
    return session


def fetch(
    session: requests.Session,
    method: str,
    url: str,
    timeout: float,
    connect_timeout: float,
    max_bytes: int,
    json_body: object | None = None,
) -> Response:
    """One request with an overall deadline; raises SourceError with a one-line reason."""
    try:
        return _fetch(session, method, url, timeout, connect_timeout, max_bytes, json_body)
    except SourceError as exc:
        raise SourceError(redact(str(exc))) from None


def _fetch(
    session: requests.Session,
    method: str,
    url: str,
    timeout: float,
    connect_timeout: float,
    max_bytes: int,
    json_body: object | None,
) -> Response:
    deadline = time.monotonic() + timeout
    try:
        resp = session.request(
            method,
            url,
            json=json_body,
            stream=True,
            allow_redirects=False,
            timeout=(min(connect_timeout, timeout), timeout),
        )
    except requests.exceptions.ConnectTimeout:
        raise SourceError(f"{url}: connect timed out after {min(connect_timeout, timeout):g}s") from None
    except requests.exceptions.ConnectionError as exc:
        raise SourceError(f"{url}: cannot connect ({_short(exc)})") from None
    except requests.exceptions.Timeout:
        raise SourceError(f"{url}: no answer within {timeout:g}s") from None
    except requests.exceptions.RequestException as exc:
        raise SourceError(f"{url}: {_short(exc)}") from None
    try:
        if 300 <= resp.status_code < 400:
            raise SourceError(
                f"{url}: answered {resp.status_code} redirect to "
                f"{resp.headers.get('Location', '?')!r}; redirects are not followed"
            )
        chunks: list[bytes] = []
        size = 0
        raw = resp.raw
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SourceError(f"{url}: body not complete within {timeout:g}s ({size} bytes read)")
            _set_read_timeout(raw, left)
            try:
                chunk = raw.read1(65536)
            except Exception as exc:  # urllib3 wraps socket timeouts and resets in several types
                if time.monotonic() >= deadline or "timed out" in str(exc).lower():
                    raise SourceError(f"{url}: body not complete within {timeout:g}s ({size} bytes read)") from None
                raise SourceError(f"{url}: connection broke while reading ({_short(exc)})") from None
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise SourceError(f"{url}: body larger than the {max_bytes} byte cap; refused")
            chunks.append(chunk)
        return Response(resp.status_code, resp.headers.get("Content-Type", ""), b"".join(chunks))
    finally:
        resp.close()


def _set_read_timeout(raw: object, seconds: float) -> None:
    conn = getattr(raw, "connection", None) or getattr(raw, "_connection", None)
    sock = getattr(conn, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.settimeout(max(seconds, 0.001))


def _short(exc: BaseException) -> str:
    """The useful part of a requests/urllib3 error: '[Errno 111] Connection refused', 'timed out'."""
    text = str(exc)
    m = re.search(r"\[Errno -?\d+\] [^'\")\]]+", text)
    if m:
        return m.group(0).strip()
    if "timed out" in text.lower():
        return "timed out"
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]
