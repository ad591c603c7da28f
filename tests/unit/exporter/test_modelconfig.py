"""Model configurations without a Triton: the parts read from the JSON, and the index source's time budget."""

from __future__ import annotations

import orjson
import pytest

from exporter.sources import triton as triton_source
from exporter.sources.modelconfig import parse_config
from exporter.sources.triton import TritonIndexSource
from triton_http import Response, TimedOut


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


class ScriptedTriton:
    """Triton's HTTP answers on a clock of its own: the index takes ``index_s``, the server's metadata no time, a
    configuration read never answers (it costs the whole timeout it was given). No sleeping, so no scheduling
    noise."""

    connect_timeout = 0.5
    max_bytes = 1 << 20

    def __init__(self, index_s: float) -> None:
        self.now = 100.0
        self.index_s = index_s
        self.timeouts: list[tuple[str, float]] = []

    def clock(self) -> float:
        return self.now

    def request(
        self, method: str, url: str, timeout: float, json: object = None, max_bytes: int | None = None, text=None
    ):
        self.timeouts.append((url.rsplit("/v2", 1)[1] or "/", timeout))
        if method == "POST":
            self.now += self.index_s
            body = orjson.dumps([{"name": "m", "version": "1", "state": "READY"}])
            return Response(200, "application/json", body)
        if url.endswith("/v2"):
            return Response(200, "application/json", b'{"name": "triton", "version": "2.51.0"}')
        self.now += timeout
        raise TimedOut(url, f"no answer within {timeout:.2f} s")


def test_configuration_reads_stay_within_the_sources_timeout(monkeypatch) -> None:
    """The configurations get what is left of the source's timeout after the index (half of it), not a timeout
    of their own: an index that takes 0.9 s of 1 s leaves them 0.05 s."""
    triton = ScriptedTriton(index_s=0.9)
    monkeypatch.setattr(triton_source.time, "monotonic", triton.clock)
    source = TritonIndexSource("http://triton:8000", 0.5, 1 << 20, http=triton)  # type: ignore[arg-type]
    source.configs.clock = triton.clock
    start = triton.now
    got = source.collect(1.0)
    assert got.index is not None and got.configs == {}  # the index is delivered; configurations wait
    assert triton.now - start <= 1.0  # not the index's 0.9 s plus half the timeout again (1.4 s)
    assert [path for path, _ in triton.timeouts] == ["/repository/index", "/", "/models/m/versions/1/config"]
    assert triton.timeouts[-1][1] == pytest.approx(0.05)


def test_configurations_are_read_while_the_source_has_time(monkeypatch) -> None:
    """With a fast index the configuration read gets half of what is left."""
    triton = ScriptedTriton(index_s=0.1)
    monkeypatch.setattr(triton_source.time, "monotonic", triton.clock)
    source = TritonIndexSource("http://triton:8000", 0.5, 1 << 20, http=triton)  # type: ignore[arg-type]
    source.configs.clock = triton.clock
    source.collect(1.0)
    assert [path for path, _ in triton.timeouts] == ["/repository/index", "/", "/models/m/versions/1/config"]
    assert triton.timeouts[-1][1] == pytest.approx(0.45)  # half of the 0.9 s left
