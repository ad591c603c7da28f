"""Triton's admin key: the header that opens the APIs Triton restricts.

Triton runs with ``--http-restricted-api=<groups>:triton-admin-key=<key>`` (and ``--grpc-restricted-protocol``
for the same groups on gRPC): without the header, a request to the repository API (load and unload, whose
``file:`` parameters carry code), the model configuration, statistics, trace and logging settings or shared
memory is answered 403. The load balancer reaches Triton's HTTP port, so those APIs must be closed there;
the sidecars inside the task know the key (``TRITON_ADMIN_KEY``, injected by ECS from Secrets Manager) and
send it. Seen on the bundled Triton (tests/integration/test_restricted_api_real.py):

- HTTP answers ``403 {"error":"This API is restricted, expecting header 'triton-admin-key'"}``; the header's
  name is matched without regard to case, its value exactly;
- gRPC expects the header under ``triton-grpc-protocol-<name>`` and answers UNAVAILABLE without it;
- the key does not appear in Triton's log (its start-up table of options leaves the restriction out).

The key is a secret: it never goes into a flag (``ps`` and ``DescribeTaskDefinition`` show those), a log
line, an error message or a ``repr``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

HEADER = "triton-admin-key"
ENV = "TRITON_ADMIN_KEY"
GRPC_HEADER = f"triton-grpc-protocol-{HEADER}"
# The API groups only the task's own sidecars may call: everything but health, metadata and inference.
RESTRICTED = ("model-repository", "model-config", "statistics", "trace", "logging", "shared-memory")
_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~+/")
MIN_LENGTH, MAX_LENGTH = 16, 256


@dataclass(frozen=True)
class AdminKey:
    """The key, hidden from ``repr`` and ``str`` (settings are logged and printed)."""

    value: str = field(repr=False)

    def __str__(self) -> str:
        return "<admin key hidden>"

    def headers(self) -> dict[str, str]:
        return {HEADER: self.value}


def admin_headers(key: AdminKey | None) -> dict[str, str]:
    """What every call to Triton's HTTP API sends: the key's header, or nothing where Triton has no key."""
    return key.headers() if key else {}


def parse_key(raw: str) -> AdminKey:
    """An admin key from its text; ValueError (never showing the text) when it cannot be one.

    Letters, digits and ``-_.~+/`` only, 16 to 256 of them: the key lands in Triton's command line through
    the shell (``"$TRITON_ADMIN_KEY"``) and in an HTTP header, where blanks, quotes, ``,``, ``:`` and ``=``
    would change its meaning."""
    if not MIN_LENGTH <= len(raw) <= MAX_LENGTH:
        raise ValueError(f"{ENV} must be {MIN_LENGTH} to {MAX_LENGTH} characters long (it has {len(raw)})")
    if not _KEY_CHARS.issuperset(raw):
        raise ValueError(f"{ENV} may hold letters, digits and -_.~+/ only")
    return AdminKey(raw)


def key_from_env(environ: Mapping[str, str]) -> AdminKey | None:
    """The key in ``TRITON_ADMIN_KEY``, or None when it is unset or empty (Triton without restrictions)."""
    raw = environ.get(ENV, "")
    return parse_key(raw) if raw else None


def refusal_hint(status: int, body: bytes, key: AdminKey | None) -> str:
    """A sentence saying what to do when Triton refused a restricted API, else ``""``."""
    if status != 403 or b"restricted" not in body[:512]:
        return ""
    if key is None:
        return f"; Triton restricts this API (--http-restricted-api): set {ENV} to the task's admin key"
    return f"; Triton restricts this API and refused the key in {ENV}: it differs from the one Triton was given"
