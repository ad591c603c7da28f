"""Where EMF lines go: stdout, a TCP or UDP agent endpoint, or a file.

The loop must never stall on its output. The TCP sink therefore hands
events to a sender thread through a bounded FIFO: a dead, slow or
never-reading agent fills the buffer, the oldest events are dropped and
counted (``EventsDropped``), and the loop carries on. When the agent comes
back the buffer is delivered in order. One event per line.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import BinaryIO, Protocol
from urllib.parse import urlsplit

from .logs import Conditions, get


@dataclass(frozen=True)
class Output:
    """Where a daemon's EMF goes (its ``--output``)."""

    kind: str  # stdout | tcp | udp | file
    host: str = ""
    port: int = 0
    path: str = ""

    def __str__(self) -> str:
        if self.kind in ("tcp", "udp"):
            return f"{self.kind}://{self.host}:{self.port}"
        return f"file:{self.path}" if self.kind == "file" else self.kind


def parse_output(text: str) -> Output:
    """``stdout``, ``tcp://HOST:PORT``, ``udp://HOST:PORT`` or ``file:PATH``; ValueError says what is wrong."""
    text = text.strip()
    if text in ("", "stdout", "-"):
        return Output("stdout")
    if text.startswith("file:"):
        path = text[5:]
        if not path:
            raise ValueError("file: needs a path, e.g. file:/tmp/emf.log")
        return Output("file", path=path)
    parts = urlsplit(text)
    if parts.scheme in ("tcp", "udp"):
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or not port:
            raise ValueError(f"{parts.scheme} output needs host and port, e.g. {parts.scheme}://127.0.0.1:25888")
        return Output(parts.scheme, host=parts.hostname, port=port)
    raise ValueError("use stdout, tcp://HOST:PORT, udp://HOST:PORT or file:PATH")


log = get("sink")

MAX_UDP_PAYLOAD = 65_507
SEND_TIMEOUT = 2.0  # per socket send on TCP: an agent that stops reading is declared stuck after this
BACKOFF_START, BACKOFF_MAX = 0.2, 30.0


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


class StreamSink:
    """stdout (default) or any binary stream; flushed once per batch."""

    def __init__(self, stream: BinaryIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout.buffer
        self.dropped = 0

    def send(self, events: list[bytes]) -> None:
        if not events:
            return
        try:
            self.stream.write(b"\n".join(events) + b"\n")
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
                f.write(b"\n".join(events) + b"\n")
            self.conditions.set("file_sink", None)
        except OSError as exc:
            self.dropped += len(events)
            self.conditions.set("file_sink", f"cannot append EMF to {self.path}: {exc.strerror or exc}")

    def take_dropped(self) -> int:
        n, self.dropped = self.dropped, 0
        return n

    def close(self, timeout: float) -> None:
        return None


class UdpSink:
    """One datagram per event; oversize events are dropped and counted."""

    def __init__(self, host: str, port: int) -> None:
        self.addr = (host, port)
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.dropped = 0
        self.conditions = Conditions(log)

    def send(self, events: list[bytes]) -> None:
        for event in events:
            if len(event) > MAX_UDP_PAYLOAD:
                self.dropped += 1
                continue
            try:
                self.sock.sendto(event, self.addr)
                self.conditions.set("udp_sink", None)
            except OSError as exc:
                self.dropped += 1
                self.conditions.set("udp_sink", f"cannot send EMF to udp://{self.addr[0]}:{self.addr[1]}: {exc}")

    def take_dropped(self) -> int:
        n, self.dropped = self.dropped, 0
        return n

    def close(self, timeout: float) -> None:
        self.sock.close()


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


def make_sink(output: Output, buffer_events: int, connect_timeout: float) -> Sink:
    if output.kind == "tcp":
        return TcpSink(output.host, output.port, buffer_events, connect_timeout)
    if output.kind == "udp":
        return UdpSink(output.host, output.port)
    if output.kind == "file":
        return FileSink(output.path)
    return StreamSink()
