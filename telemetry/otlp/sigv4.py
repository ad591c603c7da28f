"""SigV4 for OTLP posts: the signature covers the exact bytes sent (the gzipped body) and its headers.

Credentials come from botocore's standard chain (environment, shared files,
the ECS task role through the container credentials endpoint, instance
metadata), resolved on first use rather than at start, so a sidecar whose
role is not readable yet still starts. botocore refreshes temporary
credentials itself; each request signs with one frozen snapshot of them. No
credentials is :class:`CredentialsMissing`, which the exporter counts as a
failed export.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest

CredentialsSource = Callable[[], Any]  # -> botocore Credentials (or anything with get_frozen_credentials) or None


class CredentialsMissing(Exception):
    """No AWS credentials could be found (or read) to sign with."""


def default_credentials() -> Any:
    """The standard AWS chain, as boto3 resolves it."""
    import botocore.session

    return botocore.session.get_session().get_credentials()


class Signer:
    """Signs a POST for one service and region; credentials are looked up until found, then reused."""

    def __init__(self, service: str, region: str, credentials: CredentialsSource | None = None) -> None:
        self.service = service
        self.region = region
        self.source = credentials or default_credentials
        self.credentials: Any = None
        self.lock = threading.Lock()

    def _frozen(self) -> Any:
        with self.lock:
            if self.credentials is None:
                try:
                    self.credentials = self.source()
                except Exception as exc:  # botocore raises many kinds (metadata unreachable, bad profile...)
                    raise CredentialsMissing(f"AWS credentials could not be loaded: {exc}") from exc
                if self.credentials is None:
                    raise CredentialsMissing(
                        "no AWS credentials found (environment, shared files, ECS task role or instance role)"
                    )
            creds = self.credentials
        try:
            frozen = creds.get_frozen_credentials() if hasattr(creds, "get_frozen_credentials") else creds
        except Exception as exc:  # a refresh failed (container credentials endpoint down)
            raise CredentialsMissing(f"AWS credentials could not be refreshed: {exc}") from exc
        if not frozen.access_key or not frozen.secret_key:
            raise CredentialsMissing("AWS credentials are incomplete (no access key or secret key)")
        return frozen

    def sign(self, url: str, headers: Mapping[str, str], body: bytes) -> dict[str, str]:
        """The headers to send: ``headers`` plus X-Amz-Date, Authorization (and the session token if any)."""
        request = AWSRequest(method="POST", url=url, data=body, headers=dict(headers))
        SigV4Auth(self._frozen(), self.service, self.region).add_auth(request)
        return dict(request.headers.items())
