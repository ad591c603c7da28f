"""Requests for the LLM sample models (``vllm_model``, ``tensorrt_llm``), for the demo and the tests.

Both models derive every metric they publish from the request (their
docstrings in demo/models/*/1/model.py give the rules): prompt tokens are
the words of the text, generated tokens the ``max_tokens`` asked for, and
``vllm_model`` takes its time to first token, inter-token latency and tool
call time from the request too. So a test can predict every token delta and
every histogram bucket of what it sent.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Sequence
from typing import Any

from .triton import LLM_MODELS, TritonServer

TRT, VLLM = LLM_MODELS


def vllm_inputs(
    text: str,
    max_tokens: int | None = None,
    ttft_ms: float | None = None,
    itl_ms: float | None = None,
    tool_ms: float | None = None,
) -> list[dict]:
    """One ``vllm_model`` request; the optional inputs left out take the model's defaults."""
    inputs = [{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": [text]}]
    if max_tokens is not None:
        inputs.append({"name": "max_tokens", "datatype": "INT32", "shape": [1], "data": [max_tokens]})
    for name, value in (("ttft_ms", ttft_ms), ("itl_ms", itl_ms), ("tool_ms", tool_ms)):
        if value is not None:
            inputs.append({"name": name, "datatype": "FP32", "shape": [1], "data": [value]})
    return inputs


def trt_inputs(texts: Sequence[str], max_tokens: Sequence[int] | None = None) -> list[dict]:
    """One ``tensorrt_llm`` request carrying one sequence per text (the batch dimension)."""
    inputs = [{"name": "text_input", "datatype": "BYTES", "shape": [len(texts), 1], "data": list(texts)}]
    if max_tokens is not None:
        inputs.append({"name": "max_tokens", "datatype": "INT32", "shape": [len(texts), 1], "data": list(max_tokens)})
    return inputs


def vllm(server: TritonServer, text: str, **kwargs: Any) -> str:
    """Send one request to ``vllm_model``; returns the generated text (raises unless HTTP 200)."""
    status, body = server.infer(VLLM, vllm_inputs(text, **kwargs))
    if status != 200:
        raise AssertionError(f"{VLLM} answered {status}: {body}")
    return body["outputs"][0]["data"][0]  # type: ignore[index]


def trt(server: TritonServer, texts: Sequence[str], max_tokens: Sequence[int] | None = None) -> list[str]:
    """Send one request to ``tensorrt_llm``; returns one generated text per sequence."""
    status, body = server.infer(TRT, trt_inputs(texts, max_tokens))
    if status != 200:
        raise AssertionError(f"{TRT} answered {status}: {body}")
    return body["outputs"][0]["data"]  # type: ignore[index]


# Per model: (Triton's own counter, the model's counter that counts the same thing inside execute()).
_SAME_COUNT = {
    VLLM: ("nv_inference_request_success", "vllm:request_params_n_count"),
    TRT: ("nv_inference_request_success", "nv_llm_input_token_len_count"),  # lengths: once per request
}


def wait_counted(server: TritonServer, timeout: float = 10.0) -> None:
    """Wait until Triton's own per-model counters include every request answered so far.

    Seen on Triton 2.51: Triton updates ``nv_inference_*`` just after the
    response is on its way, so a scrape right after a request can miss it
    while the model's own families (updated inside ``execute()``) already
    count it. Here each LLM sample model's request (or sequence) count is
    known twice; equal means settled. Models not loaded are skipped.
    """
    deadline = time.monotonic() + timeout
    while True:
        text = server.metrics_text()
        behind = []
        for model, (core, own) in _SAME_COUNT.items():
            found = [
                re.search(
                    rf'^{re.escape(name)}{{model="{model}",(?:response_metric_type="[a-z_]+",)?'
                    rf'version="1"}} (\S+)$',
                    text,
                    re.M,
                )
                for name in (core, own)
            ]
            values = [float(m.group(1)) for m in found if m]
            if len(values) == 2 and values[0] != values[1]:
                behind.append(model)
        if not behind:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"Triton's counters of {behind} did not catch up in {timeout}s")
        time.sleep(0.01)


PROMPTS = (
    "What is the capital of France?",
    "Summarise the following paragraph in one short sentence for a busy reader please",
    "hi",
    "Write a haiku about GPUs running hot at night in a quiet data centre",
    "What is the capital of France?",  # asked again: a prompt cache hit
)


def traffic(server: TritonServer, stop: threading.Event) -> None:
    """A steady, varied load on both LLM models until ``stop`` is set (the demo's LLM half)."""
    for i in itertools.count():
        if stop.is_set():
            return
        prompt = PROMPTS[i % len(PROMPTS)]
        vllm(
            server,
            prompt,
            max_tokens=16 + 8 * (i % 4),
            ttft_ms=(25, 45, 65, 120, 300)[i % 5],
            itl_ms=(18, 22, 30)[i % 3],
            tool_ms=30.0 if i % 4 == 0 else 0.0,
        )
        rows = 3 + i % 4  # more than the batcher's 4 active slots half the time: some wait
        trt(server, [PROMPTS[(i + j) % len(PROMPTS)] for j in range(rows)], [128 + 64 * j for j in range(rows)])
        stop.wait(0.05)
