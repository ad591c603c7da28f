"""The relay as a source of the pipeline: phase histograms, the slowest requests, and the relay's own counts.

Everything the relay measured since the last scrape comes out as series
(so the catalog decides what is emitted, like any family) and as per-model
properties: the window's slowest requests with their trace and span ids.
Each of those is also logged once, as a JSON line carrying ``trace_id`` and
``span_id`` (the X-Ray console shows it beside its trace when the log group
is listed in the resource's ``aws.log.group.names``), at most
``MAX_SLOW_LINES`` a window: every model's slowest first, then every
model's second, so each model gets its line before any gets two.
"""

from __future__ import annotations

from telemetry.logs import get

from ..series import EMPTY, LabelSet
from ..sources import Collected, SourceKind
from .receiver import INVALID_REASONS, REFUSED_REASONS
from .relay import TraceRelay
from .sampling import TraceRate
from .spans import ModelRequest

log = get("traces")

RECEIVED = "otlp_relay_spans_received_total"
EXPORTED = "otlp_relay_spans_exported_total"
DROPPED = "otlp_relay_spans_dropped_total"  # label reason
INVALID = "otlp_relay_requests_invalid_total"  # label reason
REFUSED = "otlp_relay_requests_refused_total"  # label reason
UNKNOWN_MODEL = "otlp_relay_spans_unknown_model_total"
OVER_LIMIT = "otlp_relay_over_limit_total"  # label limit: model_versions (spans), slow_request_lines (lines)
UNMATCHED = "otlp_relay_phases_unmatched_total"
MAX_SLOW_LINES = 100  # slow-request log lines a window (the EMF events keep every model's slowest)


class TraceSource:
    name = "traces"
    kind = SourceKind.TRACES

    def __init__(self, relay: TraceRelay, rate: TraceRate | None = None) -> None:
        self.relay = relay
        self.rate = rate
        self.slow_lines_over_limit = 0

    def collect(self, timeout: float) -> Collected:
        if self.rate is not None:
            self.rate.keep(timeout)
        exposition, slowest = self.relay.take()
        logged = self._log_slowest(slowest)
        self.slow_lines_over_limit += sum(len(v) for v in slowest.values()) - logged
        c = self.relay.counts()
        exposition.add(RECEIVED, EMPTY, float(c.spans_received))
        exposition.add(EXPORTED, EMPTY, float(c.spans_exported))
        exposition.add(UNKNOWN_MODEL, EMPTY, float(c.spans_unknown_model))
        exposition.add(UNMATCHED, EMPTY, float(c.phases_unmatched))
        # Every reason from the start, zero or not: the pipeline takes a series it has not seen as its
        # baseline, so a reason first shown at 1 would never be counted.
        for family, reasons, counts in (
            (DROPPED, c.spans_dropped, c.spans_dropped),
            (INVALID, INVALID_REASONS, c.requests_invalid),
            (REFUSED, REFUSED_REASONS, c.requests_refused),
        ):
            for reason in reasons:
                exposition.add(family, LabelSet.of(reason=reason), float(counts.get(reason, 0)))
        exposition.add(OVER_LIMIT, LabelSet.of(limit="model_versions"), float(c.spans_over_limit))
        exposition.add(OVER_LIMIT, LabelSet.of(limit="slow_request_lines"), float(self.slow_lines_over_limit))
        models: dict[str, dict[str, object]] = {
            key: {
                "slowest_traces": [
                    {"trace_id": q.trace_id, "span_id": q.span_id, "ms": round(q.phases.get("request", 0.0), 3)}
                    for q in requests
                ]
            }
            for key, requests in slowest.items()
        }
        return Collected(samples=exposition, models=models)

    @staticmethod
    def _log_slowest(slowest: dict[str, list[ModelRequest]]) -> int:
        """One line per slow request, every model's slowest first, at most MAX_SLOW_LINES; the lines logged."""
        by_rank = [q for rank in range(max(map(len, slowest.values()), default=0)) for q in _ranked(slowest, rank)]
        for q in by_rank[:MAX_SLOW_LINES]:
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
        return min(len(by_rank), MAX_SLOW_LINES)

    def close(self) -> None:
        self.relay.close(2.0)


def _ranked(slowest: dict[str, list[ModelRequest]], rank: int) -> list[ModelRequest]:
    """Each model's ``rank``-th slowest request (0: its slowest), the slowest of them first."""
    found = [requests[rank] for requests in slowest.values() if len(requests) > rank]
    return sorted(found, key=lambda q: q.phases.get("request", 0.0), reverse=True)
