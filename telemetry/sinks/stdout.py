"""stdout: the default, for the awslogs driver or FireLens to pick up."""

from __future__ import annotations

import contextlib
import errno
import sys
from typing import BinaryIO

from .base import Output, SinkClosed, SinkOptions, log


class StreamSink:
    """stdout (default) or any binary stream; flushed once per batch."""

    def __init__(self, stream: BinaryIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout.buffer
        self.dropped = 0

    def send(self, events: list[bytes]) -> None:
        if not events:
            return
        try:
            self.stream.write(b"\n".join([*events, b""]))  # the final newline joined in: no second copy of the batch
            self.stream.flush()
        except BrokenPipeError:
            raise SinkClosed("stdout was closed by its reader (EPIPE)") from None
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise SinkClosed("stdout was closed by its reader (EPIPE)") from None
            self.dropped += len(events)
            log.warning("cannot write EMF to stdout: %s", exc)

    def take_dropped(self) -> int:
        n, self.dropped = self.dropped, 0
        return n

    def close(self, timeout: float) -> None:
        with contextlib.suppress(OSError):
            self.stream.flush()


def make(output: Output, options: SinkOptions) -> StreamSink:
    return StreamSink()
