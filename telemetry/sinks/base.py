"""What every transport shares: the Sink protocol, its one fatal error, the address type, the logger."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..logs import get

log = get("sink")


class SinkClosed(Exception):
    """The reader of our output went away for good (stdout closed: EPIPE)."""


class Sink(Protocol):
    def send(self, events: list[bytes]) -> None:
        """Queue or write a batch; never blocks for long."""
        ...

    def take_dropped(self) -> int:
        """Events dropped since the last call."""
        ...

    def close(self, timeout: float) -> None:
        """Deliver what can be delivered within ``timeout``; count the rest as dropped."""
        ...


@dataclass(frozen=True)
class Output:
    """Where a daemon's telemetry goes (its ``--output``): a transport's name and address."""

    kind: str  # a key of telemetry.sinks.TRANSPORTS: stdout | tcp | udp | file
    host: str = ""
    port: int = 0
    path: str = ""

    def __str__(self) -> str:
        if self.kind in ("tcp", "udp"):
            return f"{self.kind}://{self.host}:{self.port}"
        return f"file:{self.path}" if self.kind == "file" else self.kind


@dataclass(frozen=True)
class SinkOptions:
    """The daemon settings a transport may use."""

    buffer_events: int = 20_000  # events a buffering transport holds while its endpoint is away
    connect_timeout: float = 1.0
