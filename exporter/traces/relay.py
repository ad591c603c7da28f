"""The trace relay: receiver -> bounded queue -> one worker (ECS context, span kinds, phases) -> forwarder.

The receiver thread only parses and enqueues; the worker does the rest, so
a flood of spans costs bounded memory (``MAX_QUEUED_SPANS``; what does not
fit is refused and counted) and never touches the metrics loop. The
forwarder (an OTLP/HTTP exporter with its own bounded buffer and retries)
takes the rewritten spans; without one the relay still measures phases.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans

from telemetry.logs import get

from .receiver import TraceReceiver
from .spans import SpanProcessor
from .window import PhaseWindow

log = get("traces.relay")

MAX_QUEUED_SPANS = 50_000  # received, not yet processed (Triton sends at most 512 a batch)


class Forwarder(Protocol):
    """Where processed spans go (telemetry's OTLP/HTTP exporter); never blocks."""

    def submit_spans(self, resource_spans: list[ResourceSpans]) -> None: ...

    def counters(self) -> Mapping[str, int]:
        """Cumulative counts of what happened to the spans (exported, dropped by reason)."""
        ...

    def close(self, timeout: float) -> None: ...


@dataclass
class RelayStats:
    queued_dropped: int = 0  # refused at the receiver: the queue was full
    processed: int = 0  # spans through the worker


class TraceRelay:
    def __init__(
        self,
        host: str,
        port: int,
        context: Callable[[], Mapping[str, object]],
        forwarder: Forwarder | None = None,
        max_queued_spans: int = MAX_QUEUED_SPANS,
    ) -> None:
        self.forwarder = forwarder
        self.processor = SpanProcessor(context)
        self.window = PhaseWindow()
        self.stats = RelayStats()
        self.max_queued_spans = max_queued_spans
        self._queue: collections.deque[tuple[ExportTraceServiceRequest, int]] = collections.deque()
        self._queued = 0
        self._cond = threading.Condition()
        self._closing = False
        self.receiver = TraceReceiver(host, port, self.accept)
        self._worker = threading.Thread(target=self._run, name="trace-relay", daemon=True)

    def start(self) -> TraceRelay:
        self._worker.start()
        self.receiver.start()
        log.info("trace relay listening on %s:%d", self.receiver.server.server_address[0], self.receiver.port)
        return self

    def accept(self, request: ExportTraceServiceRequest) -> int:
        """Queue a received request; returns the spans refused (all of them when the queue is full)."""
        n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with self._cond:
            if self._queued + n > self.max_queued_spans or self._closing:
                self.stats.queued_dropped += n
                return n
            self._queue.append((request, n))
            self._queued += n
            self._cond.notify()
        return 0

    def drain(self, timeout: float) -> bool:
        """Wait until everything received has been processed (tests, shutdown); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._queued == 0, timeout)

    def close(self, timeout: float) -> None:
        self.receiver.close()
        self.drain(timeout / 2)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._worker.is_alive():
            self._worker.join(timeout / 2)
        if self.forwarder is not None:
            self.forwarder.close(timeout / 2)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closing)
                if not self._queue:
                    return
                request, n = self._queue.popleft()
            try:
                spans = list(request.resource_spans)
                self.window.record(list(self.processor.process(spans)))  # processed outside the window's lock
                if self.forwarder is not None:
                    self.forwarder.submit_spans(spans)
            except Exception:  # one bad request must not end the relay
                log.exception("trace relay could not process a request of %d spans", n)
            with self._cond:
                self._queued -= n
                self.stats.processed += n
                self._cond.notify_all()
