"""file:PATH, for debugging: appends one event per line."""

from __future__ import annotations

from ..logs import Conditions
from .base import Output, SinkOptions, log


class FileSink:
    """Appends to a file (debugging). A full disk drops the batch, counts it and keeps going."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.dropped = 0
        self.conditions = Conditions(log)

    def send(self, events: list[bytes]) -> None:
        if not events:
            return
        try:
            with open(self.path, "ab") as f:
                f.write(b"\n".join([*events, b""]))  # the final newline joined in: no second copy of the batch
            self.conditions.set("file_sink", None)
        except OSError as exc:
            self.dropped += len(events)
            self.conditions.set("file_sink", f"cannot append EMF to {self.path}: {exc.strerror or exc}")

    def take_dropped(self) -> int:
        n, self.dropped = self.dropped, 0
        return n

    def close(self, timeout: float) -> None:
        return None


def make(output: Output, options: SinkOptions) -> FileSink:
    return FileSink(output.path)
