"""What a call can fail with: one exception per kind of failure, each a one-line message safe to log."""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?<=//)[^/@\s'\"]*@")


def redact(text: str) -> str:
    """``text`` with the user:password part of every URL in it replaced by ``***``."""
    return _USERINFO.sub("***@", text) if "@" in text else text


class RequestFailed(Exception):
    """A call got no usable answer. ``str()`` is ``"<url>: <reason>"``, the URL without its credentials."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = redact(url)
        self.reason = redact(reason)
        super().__init__(f"{self.url}: {self.reason}")


class CannotConnect(RequestFailed):
    """No connection: refused, a name that does not resolve, the connect timeout, a failed TLS handshake."""


class TimedOut(RequestFailed):
    """Connected, but the answer was not complete before the call's deadline."""


class Redirected(RequestFailed):
    """The server answered a redirect; it is never followed."""

    def __init__(self, url: str, status: int, location: str) -> None:
        self.status = status
        self.location = location
        super().__init__(url, f"answered {status} redirect to {location!r}; redirects are not followed")


class TooLarge(RequestFailed):
    """The body is larger than the call's byte cap (refused without reading the rest)."""


class Broken(RequestFailed):
    """What answered is not a complete HTTP answer: the connection broke, or the bytes are not HTTP."""
