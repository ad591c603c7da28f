"""Several outputs at once (``--output`` given more than once): every batch goes to each sink.

Not a transport of its own (it has no ``--output`` spelling): the daemon
wraps the sinks its outputs name. Each sink keeps its own buffer and its own
drop count, so a slow agent never holds back a file or stdout; what they
dropped is summed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from .base import Sink, SinkClosed


class FanoutSink:
    """Sends every batch to each sink; with no sink, a batch goes nowhere (only OTLP outputs were given)."""

    def __init__(self, sinks: Sequence[Sink]) -> None:
        self.sinks = list(sinks)

    def send(self, events: list[bytes]) -> None:
        closed: SinkClosed | None = None
        for sink in self.sinks:
            try:
                sink.send(events)
            except SinkClosed as exc:  # the others still get the batch; then the fatal error goes up
                closed = closed or exc
        if closed is not None:
            raise closed

    def take_dropped(self) -> int:
        return sum(sink.take_dropped() for sink in self.sinks)

    def close(self, timeout: float) -> None:
        """Each sink in turn, within ``timeout`` overall."""
        deadline = time.monotonic() + timeout
        for sink in self.sinks:
            sink.close(max(0.0, deadline - time.monotonic()))
