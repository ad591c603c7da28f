"""tcp://HOST:PORT: newline-delimited events to an agent (CloudWatch agent, Fluent Bit's tcp input).

The loop must never stall on its output, so events go to a sender thread
through a bounded FIFO: a dead, slow or never-reading agent fills the
buffer, the oldest events are dropped and counted (``EventsDropped``), and
the loop carries on. When the agent comes back the buffer is delivered in
order.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
import time

from ..logs import Conditions
from .base import Output, SinkOptions, log

SEND_TIMEOUT = 2.0  # per socket send: an agent that stops reading is declared stuck after this
BACKOFF_START, BACKOFF_MAX = 0.2, 30.0


class TcpSink:
    """Newline-delimited events to a TCP agent, from a sender thread with a bounded FIFO."""

    def __init__(
        self, host: str, port: int, capacity: int, connect_timeout: float = 1.0, send_timeout: float = SEND_TIMEOUT
    ) -> None:
        self.addr = (host, port)
        self.capacity = capacity
        self.connect_timeout = connect_timeout
        self.send_timeout = send_timeout
        self.queue: collections.deque[bytes] = collections.deque()
        self.cond = threading.Condition()
        self.dropped = 0
        self.delivered = 0
        self.closing = False
        self.backing_off = False
        self.sock: socket.socket | None = None
        self.conditions = Conditions(log)
        self.thread = threading.Thread(target=self._run, name="tcp-sink", daemon=True)
        self.thread.start()

    def send(self, events: list[bytes]) -> None:
        with self.cond:
            for event in events:
                if len(self.queue) >= self.capacity:
                    self.queue.popleft()
                    self.dropped += 1
                self.queue.append(event)
            if not self.backing_off:  # a sender waiting out a backoff is woken only by close()
                self.cond.notify()

    def pending(self) -> int:
        with self.cond:
            return len(self.queue)

    def take_dropped(self) -> int:
        with self.cond:
            n, self.dropped = self.dropped, 0
            return n

    def close(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            self.closing = True
            self.cond.notify()
        self.thread.join(max(0.0, deadline - time.monotonic()))
        with self.cond:
            if self.queue:
                self.dropped += len(self.queue)
                log.warning("tcp sink closed with %d events undelivered", len(self.queue))
                self.queue.clear()
        self._disconnect()

    # --- sender thread ------------------------------------------------------------------

    def _run(self) -> None:
        backoff = BACKOFF_START
        while True:
            with self.cond:
                while not self.queue and not self.closing:
                    self.cond.wait()
                if not self.queue:
                    return  # closing and nothing left
                event = self.queue[0]
            try:
                sock = self.sock or self._connect()
                sock.sendall(event + b"\n")
            except OSError as exc:
                self._disconnect()
                self.conditions.set(
                    "tcp_sink",
                    f"EMF agent tcp://{self.addr[0]}:{self.addr[1]} unavailable: "
                    f"{exc.strerror or exc}; buffering (capacity {self.capacity} events)",
                )
                with self.cond:
                    if self.closing:
                        return
                    self.backing_off = True
                    self.cond.wait(backoff)  # woken early only by close()
                    self.backing_off = False
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            backoff = BACKOFF_START
            self.conditions.set("tcp_sink", None)
            with self.cond:
                if self.queue and self.queue[0] is event:
                    self.queue.popleft()
                    self.delivered += 1

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self.addr, timeout=self.connect_timeout)
        sock.settimeout(self.send_timeout)
        self.sock = sock
        return sock

    def _disconnect(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None


def make(output: Output, options: SinkOptions) -> TcpSink:
    return TcpSink(output.host, output.port, options.buffer_events, options.connect_timeout)
