"""Model configurations without a Triton: the parts read from the JSON, and the index source's time budget."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import pytest

from exporter.sources.modelconfig import parse_config
from exporter.sources.triton import TritonIndexSource


def test_parse_config_reads_decoupled_backend_parameters_and_cache():
    body = {
        "name": "ensemble",
        "platform": "ensemble",
        "backend": "",
        "model_transaction_policy": {"decoupled": True},
        "response_cache": {"enable": True},
        "parameters": {"REPORT_CUSTOM_METRICS": {"string_value": "true"}, "odd": 3},
    }
    c = parse_config(orjson.dumps(body))
    assert c.decoupled and c.response_cache and c.platform == "ensemble"
    assert c.parameter("REPORT_CUSTOM_METRICS") == "true" and c.parameter("odd") is None
    plain = parse_config(b'{"name": "add", "backend": "python"}')  # 2.51 leaves the policy out when not decoupled
    assert not plain.decoupled and not plain.response_cache and plain.backend == "python"
    with pytest.raises(ValueError):
        parse_config(b"[]")


def test_alike_configurations_are_one_object():
    """1000 versions configured alike hold one configuration, not 1000 (the sidecar keeps every READY one)."""
    a = parse_config(b'{"name": "a", "backend": "python", "input": [{"name": "x"}]}')
    b = parse_config(b'{"name": "b", "backend": "python", "input": [{"name": "y"}]}')
    assert a is b
    assert parse_config(b'{"name": "c", "backend": "onnxruntime"}') is not a


@pytest.fixture
def slow_triton() -> Iterator[str]:
    """An index that answers in 0.9 s, configurations that never answer in time."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            time.sleep(0.9)
            self._send(json.dumps([{"name": "m", "version": "1", "state": "READY"}]).encode())

        def do_GET(self):
            time.sleep(3)
            self._send(b"{}")

        def _send(self, body: bytes) -> None:
            try:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_configuration_reads_stay_within_the_sources_timeout(slow_triton):
    source = TritonIndexSource(slow_triton, 0.5, 1 << 20)
    start = time.monotonic()
    got = source.collect(1.0)
    took = time.monotonic() - start
    assert got.index is not None and got.configs == {}  # the index is delivered; configurations wait
    assert took < 1.12, took  # not the index's 0.9 s plus half the timeout again
