"""udp://HOST:PORT: one datagram per event (the CloudWatch agent's EMF listener)."""

from __future__ import annotations

import socket

from ..logs import Conditions
from .base import Output, SinkOptions, log

MAX_UDP_PAYLOAD = 65_507


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


def make(output: Output, options: SinkOptions) -> UdpSink:
    return UdpSink(output.host, output.port)
