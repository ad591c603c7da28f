"""The HTTP client the exporter and model sync share for Triton's APIs (and the task metadata beside it).

Not NVIDIA's ``tritonclient`` (an inference client the tests use): this is a small HTTP/1.1 client whose
every call is bounded, for daemons that must never hang on, or hold memory for, what answers on a port:

- one deadline per call covering connect, send, the status line, the headers and the whole body (a
  socket timeout alone applies per read, so a server dripping a byte a second would never trip it);
- a byte cap on the body, checked against ``Content-Length`` first and while reading;
- no redirects followed (a 3xx is an error naming its target: we talk only to the configured URLs), no
  proxy, netrc or other setting from the environment, no compressed bodies (the cap bounds what we hold);
- no keep-alive (``Connection: close``): an idle connection held between calls makes Triton's graceful
  shutdown wait its whole exit timeout;
- typed errors (:class:`RequestFailed` and its kinds), whose one-line message never holds the password
  of a URL like ``http://user:secret@host`` (it is sent, as Basic authentication, but never shown).

The probe in ``triton_side/`` has its own client: it runs on the Triton image's Python with the standard
library alone.
"""

from .admin import AdminKey, admin_headers, key_from_env, parse_key, refusal_hint
from .client import Client, Response, TextReader
from .errors import Broken, CannotConnect, Redirected, RequestFailed, TimedOut, TooLarge, redact

__all__ = [
    "AdminKey",
    "Broken",
    "CannotConnect",
    "Client",
    "Redirected",
    "RequestFailed",
    "Response",
    "TextReader",
    "TimedOut",
    "TooLarge",
    "admin_headers",
    "key_from_env",
    "parse_key",
    "redact",
    "refusal_hint",
]
