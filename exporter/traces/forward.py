"""The relay's forwarder: processed spans to an OTLP endpoint through telemetry's OTLP/HTTP exporter.

Signed with SigV4 (service ``xray``) for ``otlp+https://xray.REGION.amazonaws.com/v1/traces``, plain for
``otlp+http://`` (an OpenTelemetry collector or the CloudWatch agent). The exporter batches within
X-Ray's limits (10,000 spans, 5 MB, 200 KB a span), buffers a bounded number of spans while the
endpoint is away, retries 429/5xx, and counts every span it loses; :meth:`counters` names them as the
relay's ``SpansDropped`` reasons.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, Span

from telemetry.otlp.endpoint import Endpoint
from telemetry.otlp.exporter import ExportOptions, OtlpHttpExporter
from telemetry.otlp.signals import TRACES
from telemetry.otlp.sigv4 import Signer


class SpanForwarder:
    def __init__(self, endpoint: Endpoint, options: ExportOptions | None = None, signer: Signer | None = None) -> None:
        if signer is None and endpoint.signed:
            signer = Signer(endpoint.service, endpoint.region)
        self.exporter: OtlpHttpExporter[Span] = OtlpHttpExporter(TRACES, endpoint, options, signer)

    def submit_spans(self, resource_spans: list[ResourceSpans]) -> None:
        for rs in resource_spans:
            for ss in rs.scope_spans:
                if ss.spans:
                    self.exporter.submit(rs.resource, ss.scope, ss.spans, rs.schema_url, ss.schema_url)

    def counters(self) -> Mapping[str, int]:
        s = self.exporter.stats()
        return {"exported": s.delivered, **s.dropped_by_reason()}

    def close(self, timeout: float) -> None:
        self.exporter.close(timeout)
