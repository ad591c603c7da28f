"""Where telemetry goes: one transport per module, registered once in :data:`TRANSPORTS`.

A transport is a module with a ``Sink`` class (send a batch without
blocking for long, count what it drops, close within a deadline) and a
``make(output, options)`` function; adding one is a file here plus one row
below (its ``--output`` spelling, how to parse it, its maker). The EMF
encoder and the daemons know only the :class:`Sink` protocol.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from . import file, stdout, tcp, udp
from .base import Output, Sink, SinkClosed, SinkOptions
from .fanout import FanoutSink
from .file import FileSink
from .stdout import StreamSink
from .tcp import TcpSink
from .udp import UdpSink

__all__ = [
    "TRANSPORTS", "FanoutSink", "FileSink", "Output", "Sink", "SinkClosed", "SinkOptions", "StreamSink", "TcpSink",
    "Transport", "UdpSink", "make_sink", "make_sinks", "parse_output",
]  # fmt: skip


@dataclass(frozen=True)
class Transport:
    """How an ``--output`` value names a transport, and how its sink is made.

    ``address``: ``none`` (the bare name), ``hostport`` (``NAME://HOST:PORT``)
    or ``path`` (``NAME:PATH``).
    """

    address: str
    make: Callable[[Output, SinkOptions], Sink]

    def spelling(self, name: str) -> str:
        return {"none": name, "hostport": f"{name}://HOST:PORT", "path": f"{name}:PATH"}[self.address]


TRANSPORTS: dict[str, Transport] = {
    "stdout": Transport("none", stdout.make),
    "tcp": Transport("hostport", tcp.make),
    "udp": Transport("hostport", udp.make),
    "file": Transport("path", file.make),
}


def parse_output(text: str) -> Output:
    """An ``--output`` value as an :class:`Output`; ValueError says what is wrong."""
    text = text.strip()
    if text in ("", "-"):
        return Output("stdout")
    name, sep, rest = text.partition(":")
    transport = TRANSPORTS.get(name)
    if transport is not None and transport.address == "none" and not sep:
        return Output(name)
    if transport is not None and transport.address == "path" and sep:
        if not rest:
            raise ValueError(f"{name}: needs a path, e.g. {name}:/tmp/emf.log")
        _appendable(rest)
        return Output(name, path=rest)
    if transport is not None and transport.address == "hostport" and rest.startswith("//"):
        parts = urlsplit(text)
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or not port:
            raise ValueError(f"{name} output needs host and port, e.g. {name}://127.0.0.1:25888")
        return Output(name, host=parts.hostname, port=port)
    spellings = [t.spelling(n) for n, t in TRANSPORTS.items()]
    raise ValueError(f"use {', '.join(spellings[:-1])} or {spellings[-1]}")


def _appendable(path: str) -> None:
    """Refuse at start a path no event could be appended to (a missing folder, a folder, no write permission):
    the sink would start and then drop every event."""
    full = os.path.abspath(path)
    folder = os.path.dirname(full)
    if os.path.isdir(full):
        raise ValueError(f"{path} is a directory, not a file")
    if not os.path.isdir(folder):
        raise ValueError(f"directory {folder} does not exist")
    if not os.access(full if os.path.exists(full) else folder, os.W_OK):
        raise ValueError(f"{path}: this process may not write {'it' if os.path.exists(full) else 'into ' + folder}")


def make_sink(output: Output, buffer_events: int, connect_timeout: float) -> Sink:
    """The sink for ``output`` (a kind :func:`parse_output` produced)."""
    return TRANSPORTS[output.kind].make(output, SinkOptions(buffer_events, connect_timeout))


def make_sinks(outputs: Sequence[Output], buffer_events: int, connect_timeout: float) -> Sink:
    """One sink for several outputs: the output's own sink when there is one, else a fan-out (maybe empty)."""
    sinks = [make_sink(o, buffer_events, connect_timeout) for o in outputs]
    return sinks[0] if len(sinks) == 1 else FanoutSink(sinks)
