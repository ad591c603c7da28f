"""A streaming model that stands in for what Triton 24.11+ publishes for it: time to first response.

Decoupled: one response per word of ``text_input``, the first after
``first_ms`` (default 30), the next 5 ms apart. Triton 24.11+ publishes
``nv_inference_first_response_histogram_ms{model,version}`` for a decoupled
model; the Triton 2.51 binary the demo runs does not, so this model publishes
upstream's family itself (via pb_utils), with the buckets docs/llm.md
recommends for time to first token (a model config's ``model_metrics`` sets
them on a real Triton). The exporter reads it as ``TimeToFirstToken`` because
the model's configuration says it is decoupled.
"""

import time

import numpy as np
import triton_python_backend_utils as pb_utils

FAMILY = "nv_inference_first_response_histogram_ms"
BUCKETS = [10, 25, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 1500, 2000, 3000, 5000, 10000]


class TritonPythonModel:
    def initialize(self, args):
        # Keep the family referenced for as long as its metric is used (Triton 2.51 forgets it otherwise).
        self.family = pb_utils.MetricFamily(
            name=FAMILY,
            description="Duration from request to first response in milliseconds",
            kind=pb_utils.MetricFamily.HISTOGRAM,
        )
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.first_response = self.family.Metric(labels=labels, buckets=BUCKETS)

    def execute(self, requests):
        for request in requests:
            start = time.monotonic()
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            words = (text.decode() if isinstance(text, bytes) else str(text)).split() or ["-"]
            first = pb_utils.get_input_tensor_by_name(request, "first_ms")
            first_ms = float(first.as_numpy().reshape(-1)[0]) if first is not None else 30.0
            time.sleep(first_ms / 1000.0)
            for i, word in enumerate(words):
                if i:
                    time.sleep(0.005)
                out = pb_utils.Tensor("text_output", np.array([word.encode()], dtype=object))
                last = i == len(words) - 1
                sender.send(
                    pb_utils.InferenceResponse([out]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0,
                )
                if i == 0:
                    self.first_response.observe((time.monotonic() - start) * 1000.0)
        return None
