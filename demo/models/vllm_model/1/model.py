"""A stand-in for a vLLM-backend model: no LLM, the vLLM backend's metric families.

It publishes, through ``pb_utils.MetricFamily``, the families the vLLM backend
publishes with ``REPORT_CUSTOM_METRICS`` on (same names, types, labels
``model``/``version`` and buckets), plus two custom families of its own
(``app:prompt_cache_hits_total``, ``app:tool_call_seconds``; the exporter's
``catalog/example.toml`` reads them).

Every number is deterministic from the request, so tests can predict them:

- prompt tokens = the words (whitespace-separated) of ``text_input``;
- generated tokens = ``max_tokens`` (default 16); the answer is that many words;
- time to first token = ``ttft_ms`` (default 0): the model really sleeps that
  long, then observes exactly that value; the other tokens follow every
  ``itl_ms`` (default 20) on a simulated clock (observed, not slept), so
  ``time_per_output_token`` gets ``max_tokens - 1`` observations of ``itl_ms``
  and ``e2e_request_latency`` one of ``ttft_ms + (max_tokens - 1) * itl_ms``;
- a prompt this model instance has answered before is a prompt cache hit;
- ``tool_ms`` > 0: the request "calls a tool" that takes that long (slept,
  observed as given).

Python 3.8+ (it runs in the Triton image's Python backend stub).
"""

import gc
import json
import math
import time

import numpy as np
import triton_python_backend_utils as pb_utils

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5]
E2E_BUCKETS = [1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
N_BUCKETS = [1.0, 2.0, 5.0, 10.0, 20.0]
TOOL_BUCKETS = [0.05, 0.1, 0.5, 1.0, 5.0]


def buckets_1_2_5(max_value):
    """vLLM's length buckets: 1, 2, 5, 10, 20, 50, ... up to max_model_len."""
    out, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return [float(v) for v in out]
            out.append(value)
        exponent += 1


def _optional(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)
    return value[0].item() if value.size else default


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        max_len = int(params.get("max_model_len", {}).get("string_value", "4096"))
        # Labels as the vLLM backend passes them: no label is added for a pb_utils family.
        labels = {"model": args["model_name"], "version": args["model_version"]}
        # The families stay referenced on self for the model's lifetime: on Triton 2.51 a Metric whose
        # MetricFamily was garbage-collected fails every update.
        self.families = []

        def family(name, doc, kind):
            fam = pb_utils.MetricFamily(name=name, description=doc, kind=kind)
            self.families.append(fam)
            return fam

        counter, histogram = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.HISTOGRAM
        self.prompt_tokens = family("vllm:prompt_tokens_total", "Number of prefill tokens processed.", counter).Metric(
            labels=labels
        )
        self.generation_tokens = family(
            "vllm:generation_tokens_total", "Number of generation tokens processed.", counter
        ).Metric(labels=labels)
        self.ttft = family(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", histogram
        ).Metric(labels=labels, buckets=TTFT_BUCKETS)
        self.tpot = family(
            "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", histogram
        ).Metric(labels=labels, buckets=TPOT_BUCKETS)
        self.e2e = family(
            "vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", histogram
        ).Metric(labels=labels, buckets=E2E_BUCKETS)
        lengths = buckets_1_2_5(max_len)
        self.prompt_len = family("vllm:request_prompt_tokens", "Number of prefill tokens processed.", histogram).Metric(
            labels=labels, buckets=lengths
        )
        self.generation_len = family(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", histogram
        ).Metric(labels=labels, buckets=lengths)
        self.params_n = family("vllm:request_params_n", "Histogram of the n request parameter.", histogram).Metric(
            labels=labels, buckets=N_BUCKETS
        )
        self.cache_hits = family("app:prompt_cache_hits_total", "Prompt cache hits", counter).Metric(labels=labels)
        self.tool_time = family("app:tool_call_seconds", "Tool call time", histogram).Metric(
            labels=labels, buckets=TOOL_BUCKETS
        )
        self.seen = set()

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except Exception as exc:  # a bad request gets an error response, the model keeps serving
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"vllm_model: {exc}")))
        return responses

    def _one(self, request):
        raw = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)
        if raw.size != 1:
            raise ValueError("text_input takes one string")
        text = raw[0].decode("utf-8", "replace") if isinstance(raw[0], bytes) else str(raw[0])
        max_tokens = int(_optional(request, "max_tokens", 16))
        ttft_ms = float(_optional(request, "ttft_ms", 0.0))
        itl_ms = float(_optional(request, "itl_ms", 20.0))
        tool_ms = float(_optional(request, "tool_ms", 0.0))
        if max_tokens < 0 or not all(math.isfinite(v) and v >= 0 for v in (ttft_ms, itl_ms, tool_ms)):
            raise ValueError("max_tokens, ttft_ms, itl_ms and tool_ms must be finite and not negative")
        prompt_tokens = len(text.split())
        if tool_ms > 0:
            time.sleep(tool_ms / 1000.0)
            self.tool_time.observe(tool_ms / 1000.0)
        if text in self.seen:
            self.cache_hits.increment(1)
        self.seen.add(text)
        time.sleep(ttft_ms / 1000.0)
        self.prompt_tokens.increment(prompt_tokens)
        self.prompt_len.observe(prompt_tokens)
        self.params_n.observe(1)
        if max_tokens > 0:
            self.ttft.observe(ttft_ms / 1000.0)
            for _ in range(max_tokens - 1):
                self.tpot.observe(itl_ms / 1000.0)
            self.e2e.observe((ttft_ms + (max_tokens - 1) * itl_ms) / 1000.0)
        self.generation_tokens.increment(max_tokens)
        self.generation_len.observe(max_tokens)
        answer = " ".join(f"tok{i}" for i in range(max_tokens))
        out = np.array([answer.encode()], dtype=np.object_)
        return pb_utils.InferenceResponse([pb_utils.Tensor("text_output", out)])

    def finalize(self):
        """Release the metric families, so Triton drops their series when the model unloads.

        Seen on Triton 2.51: families still referenced when the stub exits are never deleted; their
        series stay in /metrics after the unload and, on a reload, the same names and labels pick the
        old values up again (a counter continues instead of restarting at 0).
        """
        self.__dict__.clear()
        gc.collect()
