"""The relay as a source of the pipeline: phase histograms, the slowest requests, and the relay's own counts.

Everything the relay measured since the last scrape comes out as series
(so the catalog decides what is emitted, like any family) and as per-model
properties: the window's slowest requests with their trace and span ids.
Each of those is also logged once, as a JSON line carrying ``trace_id`` and
``span_id``: the X-Ray console shows it beside its trace when the log group
is listed in the resource's ``aws.log.group.names``.
"""

from __future__ import annotations

from telemetry.logs import get

from ..series import EMPTY, LabelSet
from ..sources import Collected, SourceKind
from .relay import TraceRelay
from .sampling import TraceRate

log = get("traces")

RECEIVED = "otlp_relay_spans_received_total"
EXPORTED = "otlp_relay_spans_exported_total"
DROPPED = "otlp_relay_spans_dropped_total"  # label reason
INVALID = "otlp_relay_requests_invalid_total"
UNMATCHED = "otlp_relay_phases_unmatched_total"


class TraceSource:
    name = "traces"
    kind = SourceKind.TRACES

    def __init__(self, relay: TraceRelay, rate: TraceRate | None = None) -> None:
        self.relay = relay
        self.rate = rate

    def collect(self, timeout: float) -> Collected:
        if self.rate is not None:
            self.rate.keep(timeout)
        exposition, slowest = self.relay.window.take()
        r = self.relay
        exposition.add(RECEIVED, EMPTY, float(r.receiver.stats.spans))
        exposition.add(INVALID, EMPTY, float(r.receiver.stats.invalid + r.receiver.stats.busy))
        exposition.add(UNMATCHED, EMPTY, float(r.processor.unmatched))
        drops = {"queue_full": r.stats.queued_dropped}
        exported = 0
        if r.forwarder is not None:
            counts = dict(r.forwarder.counters())
            exported = counts.pop("exported", 0)
            drops.update(counts)
        exposition.add(EXPORTED, EMPTY, float(exported))
        for reason, n in drops.items():
            exposition.add(DROPPED, LabelSet.of(reason=reason), float(n))
        models: dict[str, dict[str, object]] = {}
        for key, requests in slowest.items():
            models[key] = {
                "slowest_traces": [
                    {"trace_id": q.trace_id, "span_id": q.span_id, "ms": round(q.phases.get("request", 0.0), 3)}
                    for q in requests
                ]
            }
            for q in requests:
                log.info(
                    "slow request: model=%s version=%s request_ms=%.3f trace_id=%s span_id=%s",
                    q.model,
                    q.version,
                    q.phases.get("request", 0.0),
                    q.trace_id,
                    q.span_id,
                    extra={
                        "fields": {
                            "trace_id": q.trace_id,
                            "span_id": q.span_id,
                            "model": q.model,
                            "version": q.version,
                            "phases_ms": {k: round(v, 3) for k, v in q.phases.items()},
                            **({"request_id": q.request_id} if q.request_id else {}),
                        }
                    },
                )
        return Collected(samples=exposition, models=models)

    def close(self) -> None:
        self.relay.close(2.0)
        if self.rate is not None:
            self.rate.session.close()
