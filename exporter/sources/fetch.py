"""One call of the shared HTTP client (``triton_http``) on a source's behalf: its errors as SourceError.

The client bounds the call (deadline, byte cap, no redirects, no proxy) and keeps credentials out of its
messages; a source only needs the one-line reason, which the pipeline reports as ``SourceUp`` 0.
"""

from __future__ import annotations

from triton_http import Client, RequestFailed, Response, TextReader

from . import SourceError


def fetch(
    http: Client,
    method: str,
    url: str,
    timeout: float,
    json: object = None,
    max_bytes: int | None = None,
    text: TextReader | None = None,
) -> Response:
    """The whole answer within ``timeout`` seconds; raises SourceError with the client's one-line reason."""
    try:
        return http.request(method, url, timeout, json, max_bytes, text=text)
    except RequestFailed as exc:
        raise SourceError(str(exc)) from None
