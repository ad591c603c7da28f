"""Coverage lines against a real Triton 2.51: what each model cannot produce, and why, said once.

One server with ``--metrics-config counter_latencies=false`` and a response cache
(``--cache-config local,size=1048576``) serving: ``add`` with ``response_cache { enable: true }``;
``llm``, a model of a Python-based backend named ``vllm`` (as the real vLLM backend is: a
``model.py`` in ``<backends>/vllm/``) without ``REPORT_CUSTOM_METRICS``, so it publishes no
vLLM family, as the real backend does then; and ``stream``, a decoupled model.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from demo.triton import TritonServer, _pytriton_root, copy_models, prepare_backends
from exporter.summary import render_summary
from tests.support.helpers import Capture, pipeline_for

from .test_modelconfig_real import add_stream_model

pytestmark = pytest.mark.triton

VLLM_BACKEND = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            text = pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", text)]))
        return out
"""
LLM_CONFIG = """name: "llm"
backend: "vllm"
max_batch_size: 0
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [{ kind: KIND_CPU }]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    work = tmp_path_factory.mktemp("coverage")
    repo = copy_models(["add"], work / "models")
    config = repo / "add" / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")
    (repo / "llm" / "1").mkdir(parents=True)
    (repo / "llm" / "config.pbtxt").write_text(LLM_CONFIG)
    add_stream_model(repo)
    backend = prepare_backends(work) / "vllm"
    backend.mkdir()
    (backend / "model.py").write_text(VLLM_BACKEND)
    s = TritonServer(
        repo,
        workdir=work,
        extra_args=[
            "--metrics-config",
            "counter_latencies=false",
            "--cache-config",
            "local,size=1048576",
            f"--cache-directory={_pytriton_root() / 'caches'}",
        ],
    )
    s.start()
    try:
        assert {v["name"] for v in s.index() if v.get("state") == "READY"} == {"add", "llm", "stream"}, s.log_text()
        yield s
    finally:
        s.stop()


@pytest.fixture
def coverage_log() -> Iterator[Capture]:
    with Capture.on("exporter.coverage") as capture:
        yield capture


def lines_for(capture: Capture, model: str) -> list[str]:
    return [m for m in capture.messages() if m.startswith(f"model {model!r} ")]


def test_one_line_per_model_names_what_it_cannot_produce_and_why(server, coverage_log):
    pipe = pipeline_for(server)
    first = pipe.cycle()
    add = first.coverage
    assert len(add) == 3
    (llm,) = lines_for(coverage_log, "llm")
    assert "PromptTokens, GenerationTokens" in llm
    assert "(the vLLM backend publishes its metrics only with REPORT_CUSTOM_METRICS=true" in llm
    (plain,) = lines_for(coverage_log, "add")
    assert "RequestLatencyP50, RequestLatencyP95, RequestLatencyP99 (response cache on" in plain
    assert (
        "RequestLatencyAvg" in plain
        and "ComputeOutputLatencyAvg (counter_latencies is off (--metrics-config counter_latencies=false))" in plain
    )
    # 2.51 is 24.10: no first-response histogram for a model that is not decoupled before 26.01 ...
    assert "RequestLatency (Triton 24.10 is too old: nv_inference_first_response_histogram_ms of a model that " in plain
    assert "TimeToFirstToken" not in plain  # ... and a model that is not decoupled has no time to first token
    (stream,) = lines_for(coverage_log, "stream")
    assert "TimeToFirstToken (Triton 24.10 is too old" in stream and "needs 24.11+" in stream
    assert "RequestLatency (" not in stream
    # said once: nothing new while nothing changes
    pipe.cycle()
    assert len(coverage_log.messages()) == 3
    # --once says the same, each reason once with the versions it concerns; the LLM table counts what each
    # LLM model does not produce
    text = render_summary(pipe.cycle())
    section = text.split("not produced, and why:\n")[1]
    vllm = "the vLLM backend publishes its metrics only with REPORT_CUSTOM_METRICS=true"
    assert section.count(vllm) == 1 and "PromptTokens, GenerationTokens" in section and "llm/1" in section
    assert section.count("counter_latencies is off") == 1 and "add/1" in section and "stream/1" in section
    table = text.split("LLM serving")[1].split("not produced, and why")[0]
    assert "llm" in table and "stream" in table
    pipe.close()


def test_a_model_that_comes_back_is_said_again(server, coverage_log):
    pipe = pipeline_for(server)
    pipe.cycle()
    assert len(lines_for(coverage_log, "add")) == 1
    server.unload("add")
    try:
        assert not any(c.model == "add" for c in pipe.cycle().coverage.values())
    finally:
        server.load("add")
    pipe.cycle()
    assert len(lines_for(coverage_log, "add")) == 2
    pipe.close()
