"""A stand-in for a TensorRT-LLM-backend model: no engine, the backend's metric families.

It publishes, through ``pb_utils.MetricFamily``, the gauges the TensorRT-LLM
backend's custom metrics reporter publishes (same names, labels ``model``,
``version`` and one category label with the same values) and its two token
length histograms (buckets 10, 50, 100, 500, 1000, label
``response_metric_type``). The real backend refreshes its gauges every
``stats_check_period_ms``; this one sets them at the end of every
``execute()``, describing that call as one scheduler iteration, so the values
are deterministic from what it served:

- each sequence (row of the batch dimension) is one LLM request: its input
  tokens are the words of ``text_input``, its output tokens ``max_tokens``
  (default 16; the answer is that many words);
- the batcher admits at most ``max_active_requests`` (config parameter) of
  the call's sequences, in order: ``active`` = min(sequences, max), ``max``
  = the parameter. The rest are queued ahead of the batcher, which upstream
  does not export: they appear in no gauge;
- KV cache: each active sequence needs ceil((input + output) /
  ``kv_cache_tokens_per_block``) blocks; in order, a sequence whose blocks
  still fit in ``kv_cache_max_blocks`` takes them, one that does not is
  paused (preempted). ``used`` is the blocks taken, ``free`` = max - used,
  ``fraction`` = used / max, ``tokens_per`` the block size;
- scheduling: in order, the active sequences that are not paused are
  scheduled while their input tokens fit in ``max_num_tokens`` (config
  parameter; the first one that does not fit ends the iteration's batch,
  and the first is always scheduled: a longer prompt runs in chunks).
  ``scheduled`` = ``context`` = those sequences, and ``waiting`` = active -
  scheduled, as upstream computes it (never above ``active``);
- prefix reuse: a prompt this instance served before reuses its full blocks
  (input tokens // block size); ``reused`` counts the blocks reused so far;
- runtime memory: gpu = the KV pool (max blocks x ``kv_cache_block_bytes``),
  cpu 256 MiB, pinned 64 MiB;
- in-flight batcher: ``total_context_tokens`` = input tokens of the
  scheduled sequences, ``generation_requests`` = scheduled sequences that
  generate, ``micro_batch_id`` 0, ``paused_requests`` = the paused ones;
- general: ``timestamp`` (microseconds since the epoch) and
  ``iteration_counter`` (execute() calls so far);
- disaggregated serving (counters): every scheduled sequence's KV cache is
  "transferred" in ``kv_transfer_ms_per_block`` (config parameter) per block
  it holds: ``kv_cache_transfer_ms`` adds that time, ``request_count`` one;
- token lengths as the C++ backend records them: once per Triton request,
  the input and output lengths of the row that finished last (the most
  output tokens; the later row on a tie). Rows of a batched request are
  otherwise not counted, so token totals from ``_sum`` under-count them.

Python 3.8+ (it runs in the Triton image's Python backend stub).
"""

import gc
import json
import math
import time

import numpy as np
import triton_python_backend_utils as pb_utils

LENGTH_BUCKETS = [10.0, 50.0, 100.0, 500.0, 1000.0]
DISAGGREGATED = ("kv_cache_transfer_ms", "request_count")
CPU_BYTES = 256 * 1024 * 1024
PINNED_BYTES = 64 * 1024 * 1024

# family -> (category label, its values), as the TensorRT-LLM backend's reporter names them
GAUGES = {
    "nv_trt_llm_request_metrics": ("request_type", ("active", "max", "scheduled", "context", "waiting")),
    "nv_trt_llm_runtime_memory_metrics": ("memory_type", ("cpu", "gpu", "pinned")),
    "nv_trt_llm_kv_cache_block_metrics": (
        "kv_cache_block_type",
        ("max", "free", "used", "tokens_per", "reused", "fraction"),
    ),
    "nv_trt_llm_inflight_batcher_metrics": (
        "inflight_batcher_specific_metric",
        ("total_context_tokens", "generation_requests", "micro_batch_id", "paused_requests"),
    ),
    "nv_trt_llm_general_metrics": ("general_type", ("timestamp", "iteration_counter")),
}
HELP = {
    "nv_trt_llm_request_metrics": "TRT LLM request metrics",
    "nv_trt_llm_runtime_memory_metrics": "TRT LLM runtime memory metrics",
    "nv_trt_llm_kv_cache_block_metrics": "TRT LLM KV cache block metrics",
    "nv_trt_llm_inflight_batcher_metrics": "TRT LLM inflight_batcher-specific metrics",
    "nv_trt_llm_general_metrics": "General TRT LLM metrics",
    "nv_trt_llm_disaggregated_serving_metrics": "TRT LLM disaggregated serving metrics",
}


def _param(params, key, default):
    return int(params.get(key, {}).get("string_value", str(default)))


def _rows(request, name):
    """The input's values, one per sequence (row), or None when the optional input is absent."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    return tensor.as_numpy().reshape(-1).tolist()


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.max_active = _param(params, "max_active_requests", 4)
        self.max_blocks = _param(params, "kv_cache_max_blocks", 256)
        self.tokens_per_block = _param(params, "kv_cache_tokens_per_block", 16)
        block_bytes = _param(params, "kv_cache_block_bytes", 2 * 1024 * 1024)
        self.max_num_tokens = _param(params, "max_num_tokens", 128)
        self.transfer_ms_per_block = float(params.get("kv_transfer_ms_per_block", {}).get("string_value", "0.5"))
        labels = {"model": args["model_name"], "version": args["model_version"]}
        # Families stay referenced on self for the model's lifetime: on Triton 2.51 a Metric whose
        # MetricFamily was garbage-collected fails every update.
        self.families = []
        self.gauges = {}
        for name, (label, values) in GAUGES.items():
            fam = pb_utils.MetricFamily(name=name, description=HELP[name], kind=pb_utils.MetricFamily.GAUGE)
            self.families.append(fam)
            self.gauges[name] = {v: fam.Metric(labels=dict(labels, **{label: v})) for v in values}
        fam = pb_utils.MetricFamily(
            name="nv_trt_llm_disaggregated_serving_metrics",
            description=HELP["nv_trt_llm_disaggregated_serving_metrics"],
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.families.append(fam)
        self.disaggregated = {v: fam.Metric(labels=dict(labels, disaggregated_serving_type=v)) for v in DISAGGREGATED}
        self.seen = set()  # prompts served before: their full blocks are reused
        self.reused = 0
        self.lengths = {}
        for name, kind, doc in (
            ("nv_llm_input_token_len", "total_input_tokens", "TRT LLM response metrics"),
            ("nv_llm_output_token_len", "total_output_tokens", "TRT LLM response metrics"),
        ):
            fam = pb_utils.MetricFamily(name=name, description=doc, kind=pb_utils.MetricFamily.HISTOGRAM)
            self.families.append(fam)
            self.lengths[name] = fam.Metric(labels=dict(labels, response_metric_type=kind), buckets=LENGTH_BUCKETS)
        self.iterations = 0
        self._set("nv_trt_llm_request_metrics", max=self.max_active)
        self._set(
            "nv_trt_llm_kv_cache_block_metrics",
            max=self.max_blocks,
            free=self.max_blocks,
            tokens_per=self.tokens_per_block,
        )
        self._set(
            "nv_trt_llm_runtime_memory_metrics", cpu=CPU_BYTES, gpu=self.max_blocks * block_bytes, pinned=PINNED_BYTES
        )
        self._set("nv_trt_llm_general_metrics", timestamp=time.time() * 1e6)

    def _set(self, family, **values):
        for key, value in values.items():
            self.gauges[family][key].set(float(value))

    def execute(self, requests):
        sequences, finished, responses = [], [], []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1).tolist()
            max_tokens = _rows(request, "max_tokens")
            if max_tokens is not None and len(max_tokens) != len(texts):
                responses.append(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("tensorrt_llm: max_tokens needs one value per text_input row")
                    )
                )
                continue
            rows = []
            for i, raw in enumerate(texts):
                text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
                out = 16 if max_tokens is None else max(0, int(max_tokens[i]))
                rows.append((len(text.split()), out, text))
            sequences += rows
            finished.append(max(reversed(rows), key=lambda r: r[1]) if rows else None)
            answers = [" ".join(f"tok{i}" for i in range(out)).encode() for _, out, _ in rows]
            tensor = np.array(answers, dtype=np.object_).reshape(len(rows), 1)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", tensor)]))
        self._iteration(sequences, [r for r in finished if r is not None])
        return responses

    def _iteration(self, sequences, last_rows):
        """Gauges for this call as one scheduler iteration; the lengths of each request's last row."""
        self.iterations += 1
        active = sequences[: self.max_active]
        used, running, paused = 0, [], 0
        for tokens_in, tokens_out, text in active:
            blocks = math.ceil((tokens_in + tokens_out) / self.tokens_per_block)
            if used + blocks > self.max_blocks:
                paused += 1
                continue
            used += blocks
            running.append((tokens_in, tokens_out, text, blocks))
        scheduled, budget = [], self.max_num_tokens
        for row in running:
            if scheduled and row[0] > budget:
                break  # the first always runs (a prompt over the budget is processed in chunks)
            budget -= row[0]
            scheduled.append(row)
        for tokens_in, _, text, _ in scheduled:
            if text in self.seen:
                self.reused += tokens_in // self.tokens_per_block
            self.seen.add(text)
        self._set(
            "nv_trt_llm_request_metrics",
            active=len(active),
            scheduled=len(scheduled),
            context=len(scheduled),
            waiting=len(active) - len(scheduled),
        )
        self._set(
            "nv_trt_llm_kv_cache_block_metrics",
            used=used,
            free=self.max_blocks - used,
            fraction=used / self.max_blocks,
            reused=self.reused,
        )
        self._set(
            "nv_trt_llm_inflight_batcher_metrics",
            total_context_tokens=sum(r[0] for r in scheduled),
            generation_requests=sum(1 for r in scheduled if r[1] > 0),
            micro_batch_id=0,
            paused_requests=paused,
        )
        self._set("nv_trt_llm_general_metrics", timestamp=time.time() * 1e6, iteration_counter=self.iterations)
        if scheduled:
            self.disaggregated["kv_cache_transfer_ms"].increment(
                sum(r[3] for r in scheduled) * self.transfer_ms_per_block
            )
            self.disaggregated["request_count"].increment(len(scheduled))
        for tokens_in, tokens_out, _ in last_rows:
            self.lengths["nv_llm_input_token_len"].observe(tokens_in)
            self.lengths["nv_llm_output_token_len"].observe(tokens_out)

    def finalize(self):
        """Release the metric families, so Triton drops their series when the model unloads.

        Seen on Triton 2.51: families still referenced when the stub exits are never deleted; their
        series stay in /metrics after the unload and, on a reload, the same names and labels pick the
        old values up again (a counter continues instead of restarting at 0).
        """
        self.__dict__.clear()
        gc.collect()
