"""The trace relay: receiver -> bounded queue -> one worker (ECS context, span kinds, phases) -> forwarder.

The receiver only reads, checks and enqueues; the worker does the rest, so a
flood of spans costs bounded memory (``MAX_QUEUED_SPANS``, and
``MAX_QUEUED_BYTES`` of the requests' estimated size in memory; what does
not fit is refused and counted) and never touches the metrics loop. The
forwarder (an OTLP/HTTP exporter with its own bounded buffer and retries)
takes the rewritten spans; without one the relay still measures phases.
:meth:`TraceRelay.counts` is every count in one
snapshot, for the relay's source.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans

from telemetry.logs import Throttled, get

from ..series import Exposition
from .receiver import DEFAULT_LIMITS, Limits, TraceReceiver
from .spans import ModelRequest, SpanProcessor
from .window import Listed, PhaseWindow

log = get("traces.relay")

MAX_QUEUED_SPANS = 50_000  # received, not yet processed (Triton sends at most 512 a batch)
MAX_QUEUED_BYTES = 32 * 1024 * 1024  # the same requests' estimated size in memory (Triton's batch: ~450 KB)


class Forwarder(Protocol):
    """Where processed spans go (telemetry's OTLP/HTTP exporter); never blocks."""

    def submit_spans(self, resource_spans: list[ResourceSpans]) -> None: ...

    def counters(self) -> Mapping[str, int]:
        """Cumulative counts of what happened to the spans (exported, dropped by reason)."""
        ...

    def close(self, timeout: float) -> None: ...


@dataclass(frozen=True)
class RelayCounts:
    """Everything the relay counted since it started, at one moment (``connections``: open now)."""

    spans_received: int  # in requests that passed the receiver's checks
    spans_exported: int  # the endpoint accepted them
    spans_dropped: dict[str, int]  # lost on the way to the endpoint, by reason
    spans_unknown_model: int  # model spans of versions the repository index does not list: not measured
    spans_over_limit: int  # model spans beyond the window's bound on model versions: not measured
    phases_unmatched: int  # compute spans whose model span never came
    requests_answered: int
    requests_invalid: dict[str, int]  # answered 4xx, by reason
    requests_refused: dict[str, int]  # answered 503 (500: the relay's own error), by reason
    connections: int


class TraceRelay:
    def __init__(
        self,
        host: str,
        port: int,
        context: Callable[[], Mapping[str, object]],
        forwarder: Forwarder | None = None,
        max_queued_spans: int = MAX_QUEUED_SPANS,
        listed: Callable[[], Listed] = lambda: None,
        limits: Limits = DEFAULT_LIMITS,
        max_queued_bytes: int = MAX_QUEUED_BYTES,
    ) -> None:
        """``listed``: the model versions Triton's repository index lists (None until it has been read)."""
        self.forwarder = forwarder
        self.listed = listed
        self.processor = SpanProcessor(context)
        self.window = PhaseWindow()
        self.max_queued_spans = max_queued_spans
        self.max_queued_bytes = max_queued_bytes
        self._queue: collections.deque[tuple[ExportTraceServiceRequest, int, int]] = collections.deque()
        self._queued = 0
        self._queued_bytes = 0
        self._dropped = {"queue_full": 0, "error": 0}
        self._cond = threading.Condition()
        self._closing = False
        self._throttled = Throttled(log)
        self.receiver = TraceReceiver(host, port, self.accept, limits)
        self._worker = threading.Thread(target=self._run, name="trace-relay", daemon=True)

    @property
    def port(self) -> int:
        return self.receiver.port

    def start(self) -> TraceRelay:
        self._worker.start()
        self.receiver.start()
        log.info("trace relay listening on %s:%d", self.receiver.host, self.receiver.port)
        return self

    def accept(self, request: ExportTraceServiceRequest, size: int) -> int:
        """Queue a checked request of ``size`` bytes in memory (the receiver's estimate, wire.WireCounts.memory:
        its protobuf size says nothing of the objects it holds); returns the spans refused (all of them when
        the queue is full)."""
        n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with self._cond:
            if (
                self._queued + n > self.max_queued_spans
                or self._queued_bytes + size > self.max_queued_bytes
                or self._closing
            ):
                self._dropped["queue_full"] += n
                return n
            self._queue.append((request, n, size))
            self._queued += n
            self._queued_bytes += size
            self._cond.notify()
        return 0

    def counts(self) -> RelayCounts:
        r = self.receiver.counts()
        forwarded = dict(self.forwarder.counters()) if self.forwarder is not None else {}
        exported = forwarded.pop("exported", 0)
        with self._cond:
            dropped = {**self._dropped, **forwarded}
        return RelayCounts(
            spans_received=r.spans,
            spans_exported=exported,
            spans_dropped=dropped,
            spans_unknown_model=self.window.unknown_model,
            spans_over_limit=self.window.models_over_limit,
            phases_unmatched=self.processor.unmatched,
            requests_answered=r.answered,
            requests_invalid=r.invalid,
            requests_refused=r.refused,
            connections=r.connections,
        )

    def take(self) -> tuple[Exposition, dict[str, list[ModelRequest]]]:
        """The window's phase histograms and slowest requests (see PhaseWindow.take); never raises."""
        return self.window.take(self.listed())

    def drain(self, timeout: float) -> bool:
        """Wait until everything received has been processed (tests, shutdown); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._queued == 0, timeout)

    def close(self, timeout: float) -> None:
        self.receiver.close(timeout / 4)
        self.drain(timeout / 4)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._worker.is_alive():
            self._worker.join(timeout / 4)
        if self.forwarder is not None:
            self.forwarder.close(timeout / 4)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closing)
                if not self._queue:
                    return
                request, n, size = self._queue.popleft()
            self._process(request, n)
            with self._cond:
                self._queued -= n
                self._queued_bytes -= size
                self._cond.notify_all()

    def _process(self, request: ExportTraceServiceRequest, n: int) -> None:
        """Measure, then forward; a failure to measure costs the measurement, never the spans."""
        spans = list(request.resource_spans)
        try:
            self.window.record(list(self.processor.process(spans)), self.listed())
        except Exception:  # the window has reset itself; the next request is measured again
            self._throttled.log(
                "measure", logging.ERROR, f"trace relay could not measure a request of {n} spans", exc_info=True
            )
        if self.forwarder is None:
            return
        try:
            self.forwarder.submit_spans(spans)
        except Exception:
            with self._cond:
                self._dropped["error"] += n
            self._throttled.log(
                "forward", logging.ERROR, f"trace relay could not forward a request of {n} spans", exc_info=True
            )
