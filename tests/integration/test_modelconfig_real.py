"""Model configurations (decoupled or not) and the server's version, read from a real Triton 2.51.

Seen on 2.51 (checked here): Triton 2.51 prints no ``nv_inference_first_response_histogram_ms``
at all, not even for a decoupled model with ``--metrics-config histogram_latencies=true``
(the family arrived in 24.11 for decoupled models, in 26.01 for every model). So the
windows below read the configuration from the real server and a first-response
histogram of upstream's exact shape (26.01: every model) from text.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.triton import TritonServer, copy_models
from exporter.config import Settings
from exporter.pipeline import Pipeline
from exporter.series import model_key
from exporter.sources import SourceError
from exporter.sources.triton import TritonIndexSource
from tests.support.helpers import CATALOG, TextSource, documents, model_doc

pytestmark = pytest.mark.triton

STREAM_CONFIG = """name: "stream"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [{ kind: KIND_CPU }]
"""
STREAM_CODE = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy().reshape(-1)[0]
            words = (text.decode() if isinstance(text, bytes) else str(text)).split() or ["x"]
            for i, w in enumerate(words):
                out = pb_utils.Tensor("text_output", np.array([w.encode()], dtype=object))
                last = i == len(words) - 1
                sender.send(pb_utils.InferenceResponse([out]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)
        return None
"""


def add_stream_model(repo: Path) -> None:
    """A decoupled Python model (one response per word, as a streaming LLM answers token by token)."""
    (repo / "stream" / "1").mkdir(parents=True)
    (repo / "stream" / "config.pbtxt").write_text(STREAM_CONFIG)
    (repo / "stream" / "1" / "model.py").write_text(STREAM_CODE)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    work = tmp_path_factory.mktemp("modelconfig")
    repo = copy_models(["add"], work / "models")
    add_stream_model(repo)
    s = TritonServer(repo, workdir=work, extra_args=["--metrics-config", "histogram_latencies=true"])
    s.start()
    try:
        yield s
    finally:
        s.stop()


def stream(server: TritonServer, text: str) -> int:
    """Stream one request (generate_stream, HTTP); the number of responses it got."""
    req = urllib.request.Request(
        f"{server.url}/v2/models/stream/generate_stream", data=json.dumps({"text_input": text}).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read().decode().count("data: ")


def test_decoupled_comes_from_the_model_config_api_once_per_version(server):
    source = TritonIndexSource(server.url, 1.0, 1 << 20)
    got = source.collect(5.0)
    assert got.server_version == "2.51.0"
    configs = got.configs
    assert configs[model_key("stream", "1")].decoupled is True
    assert configs[model_key("add", "1")].decoupled is False
    assert configs[model_key("add", "1")].backend == "python"
    assert source.configs.reads == 2
    for _ in range(3):  # nothing changed: nothing is read again
        assert source.collect(5.0).configs == configs
    assert source.configs.reads == 2
    # unloaded, then loaded again (a reload): read again once it is READY
    server.unload("add")
    assert model_key("add", "1") not in source.collect(5.0).configs
    server.load("add")
    assert source.collect(5.0).configs[model_key("add", "1")].decoupled is False
    assert source.configs.reads == 3


def test_a_failed_index_read_forgets_what_was_read(server):
    source = TritonIndexSource(server.url, 1.0, 1 << 20)
    assert source.collect(5.0).configs
    good = source.url
    source.url = server.url + "/v2/repository/nothing"
    with pytest.raises(SourceError):
        source.collect(5.0)
    assert source.configs.known == {} and source.configs.server_version == ""
    source.url = good
    assert len(source.collect(5.0).configs) == 2 and source.configs.reads == 4


def test_triton_2_51_prints_no_first_response_histogram_even_for_a_decoupled_model(server):
    assert stream(server, "a b c") == 3
    assert "nv_inference_first_response_histogram_ms" not in server.metrics_text()


FIRST_RESPONSE = """# HELP nv_inference_first_response_histogram_ms Duration from request to first response in ms
# TYPE nv_inference_first_response_histogram_ms histogram
{rows}"""


def first_response(counts: dict[str, tuple[int, int, int]]) -> str:
    """Upstream's exact shape (default buckets 100 500 2000 5000 ms): model -> cumulative (<=100, <=500, +Inf)."""
    rows = []
    for model, (a, b, total) in counts.items():
        labels = f'model="{model}",version="1"'
        for le, n in (("100", a), ("500", b), ("2000", total), ("5000", total), ("+Inf", total)):
            rows.append(f'nv_inference_first_response_histogram_ms_bucket{{{labels},le="{le}"}} {n}')
        rows.append(f"nv_inference_first_response_histogram_ms_sum{{{labels}}} {total * 100}")
        rows.append(f"nv_inference_first_response_histogram_ms_count{{{labels}}} {total}")
    return FIRST_RESPONSE.format(rows="\n".join(rows)) + "\n"


def test_26_01_first_response_becomes_ttft_for_the_decoupled_model_and_request_latency_for_the_other(server):
    base = 'nv_inference_request_success{model="add",version="1"} 0\n'
    before = base + first_response({"add": (0, 0, 0), "stream": (0, 0, 0)})
    after = base + first_response({"add": (4, 6, 6), "stream": (1, 3, 3)})
    clock = [0.0]
    index = TritonIndexSource(server.url, 1.0, 1 << 20)
    pipe = Pipeline(Settings(nvml="off"), CATALOG, [TextSource(before, after), index], clock=lambda: clock[0])
    pipe.cycle()
    clock[0] += 10
    docs = documents(pipe.cycle())
    add, stream_doc = model_doc(docs, "add"), model_doc(docs, "stream")
    assert "TimeToFirstToken" not in add and add["RequestLatency"]["Count"] == 6
    assert "RequestLatency" not in stream_doc and stream_doc["TimeToFirstToken"]["Count"] == 3
