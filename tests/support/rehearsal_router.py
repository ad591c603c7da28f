"""Stand-in for the FireLens log router in the container rehearsal (tests/deploy/test_rehearsal.py).

Fluent Bit is not packaged for Debian, so the rehearsal's ``aws-for-fluent-bit`` base image
runs this script instead (the real pipeline is checked by tests/deploy/test_fluentbit.py). It
listens where the router would, and prints one JSON line per thing it receives, so a test
reads ``docker logs`` and sees what reached the router:

* every ``[INPUT] Name tcp`` of the Fluent Bit configs under ``/fluent-bit/etc`` (the
  project's ``fluentbit/triton.conf`` is copied there by ``fluentbit/Dockerfile``; its
  ``Listen`` and ``Port`` are honoured, so a change in the config moves the listener too):
  ``{"input": "tcp", "listen": "127.0.0.1:25888", "tag": ..., "log": "<one line>"}``;
* FireLens's own forward input on ``0.0.0.0:24224`` (ECS adds it to the generated config):
  ``{"input": "forward", "bytes": N}`` per connection (msgpack is not decoded).

Standard library only: it runs on the rehearsal base's ``python3``. SIGTERM ends it at once
(it runs as PID 1 without an init, like Fluent Bit in the task).
"""

from __future__ import annotations

import json
import re
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path

CONFIG_ROOT = Path("/fluent-bit/etc")
FORWARD = ("0.0.0.0", 24224)


def tcp_inputs(root: Path) -> list[tuple[str, int, str]]:
    """(listen, port, tag) of every classic-format ``[INPUT]`` section with ``Name tcp`` under root."""
    found = []
    for path in sorted(root.rglob("*.conf")):
        for section in re.split(r"^\s*\[", path.read_text(errors="replace"), flags=re.MULTILINE)[1:]:
            head, _, body = section.partition("]")
            if head.strip().upper() != "INPUT":
                continue
            keys = {}
            for line in body.splitlines():
                parts = line.split(None, 1)
                if len(parts) == 2 and not parts[0].startswith("#"):
                    keys[parts[0].lower()] = parts[1].strip()
            if keys.get("name", "").lower() == "tcp":
                found.append((keys.get("listen", "0.0.0.0"), int(keys.get("port", "5170")), keys.get("tag", "tcp")))
    return found


def emit(record: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def serve(listen: str, port: int, handle: Callable[[socket.socket], None]) -> None:
    srv = socket.create_server((listen, port), reuse_port=False)
    emit({"listening": f"{listen}:{port}"})

    def loop() -> None:
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()


def tcp_handler(listen: str, port: int, tag: str) -> Callable[[socket.socket], None]:
    def handle(conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            for raw in lines:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if line:
                    emit({"input": "tcp", "listen": f"{listen}:{port}", "tag": tag, "log": line})

    return handle


def forward_handler(conn: socket.socket) -> None:
    total = 0
    with conn:
        while chunk := conn.recv(65536):
            total += len(chunk)
    if total:
        emit({"input": "forward", "bytes": total})


def main() -> None:
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    for listen, port, tag in tcp_inputs(CONFIG_ROOT):
        serve(listen, port, tcp_handler(listen, port, tag))
    serve(*FORWARD, forward_handler)
    emit({"ready": True})
    done.wait()
    emit({"stopping": "SIGTERM"})


if __name__ == "__main__":
    main()
