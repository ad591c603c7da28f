"""A local OTLP/HTTP endpoint that checks what AWS checks, for tests only (never shipped).

:class:`OtlpEndpoint` listens on 127.0.0.1, over TLS with a throwaway CA
made here (clients trust it through ``AWS_CA_BUNDLE``, as they would a
corporate proxy's) or plain HTTP. A signed endpoint recomputes each
request's SigV4 signature with botocore from the method, path, signed
headers and body it received, and answers 403 on a mismatch, an unknown
key, a wrong service or region, or a stale date, like AWS. It gunzips,
decodes OTLP protobuf or JSON with opentelemetry-proto, records every
request, and answers as scripted, one :class:`Reply` per request (429 with
or without Retry-After, 5xx, 4xx, slow, partial_success, or a dropped
connection); unscripted requests get a plain 200.
"""

from __future__ import annotations

import datetime
import gzip
import hmac
import ipaddress
import re
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from google.protobuf import json_format
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

LOOPBACK = "127.0.0.1"
HOLD_MAX = 60.0  # a held reply never outlives its test by more than this
ACCESS_KEY, SECRET_KEY = "AKIDTESTOTLP0000", "test-secret-key-for-the-local-endpoint"
AUTH = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request,"
    r"\s*SignedHeaders=(?P<signed>[^,]+),\s*Signature=(?P<signature>[0-9a-f]{64})$"
)
SIGNALS: dict[str, tuple[Any, Any, str]] = {  # path -> request, response, partial_success's count field
    "/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse, "rejected_spans"),
    "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse, "rejected_data_points"),
}
SERVICES = {"/v1/traces": "xray", "/v1/metrics": "monitoring"}


def make_ca(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost: (ca bundle, cert, key) files."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "otlp test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # key_cert_sign, crl_sign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(LOOPBACK))]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


@dataclass
class Reply:
    """How to answer one request (after the signature and decoding checks, which come first)."""

    status: int = 200
    retry_after: str | None = None
    delay: float = 0.0  # seconds before answering
    hold: threading.Event | None = None  # answer only once the test sets it (or after HOLD_MAX s)
    rejected: int = 0  # partial_success count
    message: str = ""  # partial_success error_message
    hang_up: bool = False  # close the connection without an answer
    body: bytes = b""  # for an error status


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes  # as received
    data: bytes = b""  # uncompressed
    request: Any = None  # the decoded Export*ServiceRequest
    status: int = 0  # what was answered (0: hung up)
    error: str = ""  # why it was refused
    at: float = field(default_factory=time.monotonic)

    def units(self) -> int:
        """Spans or data points in the request."""
        if self.request is None:
            return 0
        if isinstance(self.request, ExportTraceServiceRequest):
            return sum(len(ss.spans) for rs in self.request.resource_spans for ss in rs.scope_spans)
        return sum(
            len(getattr(m, m.WhichOneof("data")).data_points)
            for rm in self.request.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
        )


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        owner = self.server.owner
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        got = Received(self.path, {k: v for k, v in self.headers.items()}, body)
        reply = owner.next_reply()
        error = owner.check_signature(got) if owner.signed else ""
        if error:
            return self._answer(got, 403, f'{{"message":"{error}"}}'.encode(), "application/json", error)
        try:
            got.data = gzip.decompress(body) if self.headers.get("Content-Encoding") == "gzip" else body
            request_type, response_type, field_name = SIGNALS[self.path]
            got.request = request_type()
            if "json" in self.headers.get("Content-Type", ""):
                json_format.Parse(got.data, got.request)
            else:
                got.request.ParseFromString(got.data)
        except Exception as exc:
            return self._answer(got, 400, str(exc).encode(), "text/plain", f"undecodable: {exc}")
        if reply.delay:
            time.sleep(reply.delay)
        if reply.hold is not None:
            reply.hold.wait(HOLD_MAX)
        if reply.hang_up:
            owner.record(got)
            self.close_connection = True
            return
        if reply.status != 200:
            headers = {"Retry-After": reply.retry_after} if reply.retry_after else {}
            return self._answer(got, reply.status, reply.body or b"scripted", "text/plain", "scripted", headers)
        response = response_type()
        if reply.rejected or reply.message:
            setattr(response.partial_success, field_name, reply.rejected)
            response.partial_success.error_message = reply.message
        if "json" in self.headers.get("Content-Type", ""):
            return self._answer(got, 200, json_format.MessageToJson(response).encode(), "application/json")
        return self._answer(got, 200, response.SerializeToString(), "application/x-protobuf")

    def _answer(
        self,
        got: Received,
        status: int,
        body: bytes,
        ctype: str,
        error: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        got.status, got.error = status, error
        self.server.owner.record(got)
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: OtlpEndpoint


class OtlpEndpoint:
    """One local OTLP endpoint; ``url(path)`` to post to, ``script(...)`` the answers, ``received`` what came."""

    def __init__(
        self,
        directory: Path,
        tls: bool = True,
        signed: bool = True,
        region: str = "us-east-1",
        keys: dict[str, str] | None = None,
    ) -> None:
        self.tls = tls
        self.signed = signed
        self.region = region
        self.keys = keys if keys is not None else {ACCESS_KEY: SECRET_KEY}
        self.ca_bundle, self.cert, self.key = make_ca(directory) if tls else (Path(), Path(), Path())
        self.replies: deque[Reply] = deque()
        self.received: list[Received] = []
        self.lock = threading.Lock()
        self.port = 0
        self.server: _Server | None = None
        self.start()

    def url(self, path: str = "/v1/traces") -> str:
        return f"{'https' if self.tls else 'http'}://{LOOPBACK}:{self.port}{path}"

    def endpoint(self, path: str = "/v1/traces") -> str:
        """The ``otlp+...`` spelling the exporter takes."""
        return f"otlp+{self.url(path)}"

    def start(self) -> None:
        """Listen (again, on the same port after :meth:`stop`)."""
        server = _Server((LOOPBACK, self.port), _Handler)
        server.owner = self
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.cert, self.key)
            server.socket = context.wrap_socket(server.socket, server_side=True)
        self.port = server.server_address[1]
        self.server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def stop(self) -> None:
        """Stop listening: connections are refused until :meth:`start`."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    close = stop

    def script(self, *replies: Reply) -> None:
        with self.lock:
            self.replies.extend(replies)

    def next_reply(self) -> Reply:
        with self.lock:
            return self.replies.popleft() if self.replies else Reply()

    def record(self, got: Received) -> None:
        with self.lock:
            self.received.append(got)

    def accepted(self) -> list[Received]:
        """The requests answered 200."""
        with self.lock:
            return [r for r in self.received if r.status == 200]

    def check_signature(self, got: Received) -> str:
        """Why the SigV4 signature is not valid ("" when it is), recomputed with botocore."""
        headers = {k.lower(): v for k, v in got.headers.items()}
        m = AUTH.match(headers.get("authorization", ""))
        if not m:
            return "MissingAuthenticationToken: no SigV4 Authorization header"
        secret = self.keys.get(m["key"])
        if secret is None:
            return "UnrecognizedClientException: unknown access key"
        signed = m["signed"].split(";")
        missing = [h for h in ("host", "x-amz-date", "content-type") if h not in signed]
        if missing or any(h not in headers for h in signed):
            return f"IncompleteSignature: signed headers {signed}"
        amz_date = headers["x-amz-date"]
        when = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC)
        if abs((datetime.datetime.now(datetime.UTC) - when).total_seconds()) > 300 or amz_date[:8] != m["date"]:
            return "InvalidSignatureException: Signature expired or date mismatch"
        path = got.path.split("?")[0]
        if m["region"] != self.region or m["service"] != SERVICES.get(path):
            return f"InvalidSignatureException: credential scope {m['region']}/{m['service']} is wrong here"
        request = AWSRequest(
            method="POST",
            url=f"{'https' if self.tls else 'http'}://{headers['host']}{got.path}",
            data=got.body,
            headers={h: headers[h] for h in signed},
        )
        request.context["timestamp"] = amz_date
        auth = SigV4Auth(Credentials(m["key"], secret, headers.get("x-amz-security-token")), m["service"], m["region"])
        expected = auth.signature(auth.string_to_sign(request, auth.canonical_request(request)), request)
        if not hmac.compare_digest(expected, m["signature"]):
            return "InvalidSignatureException: the request signature we calculated does not match the one provided"
        return ""
