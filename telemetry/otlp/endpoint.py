"""Where OTLP goes: ``otlp+https://HOST/PATH`` is signed with SigV4, ``otlp+http://HOST/PATH`` is not.

A signature needs an AWS service and region. An AWS endpoint names both in
its host (``xray.us-west-2.amazonaws.com``); any other host (a test
endpoint, a VPC endpoint's DNS name, a proxy) takes the region from
``AWS_REGION`` and the service from the OTLP path (``/v1/traces`` goes to
X-Ray, ``/v1/metrics`` to CloudWatch), so a wrong guess is refused at start,
not at the first export.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

SCHEMES = {"otlp+https": True, "otlp+http": False}  # scheme -> signed
# service.region.amazonaws.com[.cn], and the FIPS spellings (xray-fips.us-east-1...)
AWS_HOST = re.compile(
    r"^(?P<service>[a-z0-9-]+?)(?:-fips)?\.(?P<region>[a-z]{2}(?:-[a-z]+)+-\d+)\.amazonaws\.com(?:\.cn)?$"
)
SERVICE_BY_PATH = {"/v1/traces": "xray", "/v1/metrics": "monitoring"}
REGION = re.compile(r"^[a-z]{2}(?:-[a-z]+)+-\d+$")
EXAMPLES = "e.g. otlp+https://xray.us-east-1.amazonaws.com/v1/traces or otlp+http://127.0.0.1:4318/v1/traces"


@dataclass(frozen=True)
class Endpoint:
    """A parsed OTLP endpoint: the URL posted to, and for a signed one the SigV4 service and region."""

    url: str  # https://... or http://..., what is posted to
    signed: bool
    service: str = ""  # SigV4 service name (xray, monitoring); "" when unsigned
    region: str = ""

    def __str__(self) -> str:
        return f"otlp+{self.url}"


def parse_endpoint(text: str, environ: Mapping[str, str] | None = None) -> Endpoint:
    """An endpoint string as an :class:`Endpoint` (a settings converter); ValueError says what is wrong."""
    env = os.environ if environ is None else environ
    text = text.strip()
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise ValueError(f"an OTLP endpoint starts with otlp+https:// (SigV4-signed) or otlp+http://, {EXAMPLES}")
    signed = SCHEMES[scheme.lower()]
    url = f"{scheme.lower().removeprefix('otlp+')}://{rest}"
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ValueError(f"{text}: bad port") from None
    if not parts.hostname:
        raise ValueError(f"{text}: needs a host, {EXAMPLES}")
    if not parts.path or parts.path == "/":
        raise ValueError(f"{text}: needs the OTLP path (/v1/traces or /v1/metrics)")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"{text}: no query, fragment or user name expected")
    if not signed:
        return Endpoint(url, False)
    service, region = "", ""
    aws = AWS_HOST.match(parts.hostname.lower())
    if aws:
        service, region = aws.group("service"), aws.group("region")
    service = service or SERVICE_BY_PATH.get(parts.path.rstrip("/"), "")
    if not service:
        raise ValueError(
            f"{text}: cannot tell the SigV4 service: the host is not an AWS endpoint (SERVICE.REGION.amazonaws.com) "
            f"and the path is neither /v1/traces (xray) nor /v1/metrics (monitoring)"
        )
    region = region or env.get("AWS_REGION", "").strip()
    if not region:
        raise ValueError(f"{text}: cannot tell the AWS region: not in the host name and AWS_REGION is not set")
    if not REGION.match(region):
        raise ValueError(f"{text}: {region!r} is not an AWS region (AWS_REGION)")
    return Endpoint(url, True, service, region)
