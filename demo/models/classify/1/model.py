"""A model that is not decoupled, standing in for what Triton 26.01+ publishes for it: its request latency.

From Triton 26.01 every model publishes
``nv_inference_first_response_histogram_ms{model,version}``; for a model that
is not decoupled the first response is the whole response. The Triton 2.51
binary the demo runs does not, so this model publishes upstream's family
itself (via pb_utils). The exporter reads it as ``RequestLatency``, not as time
to first token, because the model's configuration says it is not decoupled.
"""

import json
import time

import triton_python_backend_utils as pb_utils

FAMILY = "nv_inference_first_response_histogram_ms"
BUCKETS = [10, 25, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 1500, 2000, 3000, 5000, 10000]


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.sleep_s = float(params.get("sleep_ms", {}).get("string_value", "20")) / 1000.0
        self.family = pb_utils.MetricFamily(  # kept referenced, as Triton 2.51 needs
            name=FAMILY,
            description="Duration from request to first response in milliseconds",
            kind=pb_utils.MetricFamily.HISTOGRAM,
        )
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.latency = self.family.Metric(labels=labels, buckets=BUCKETS)

    def execute(self, requests):
        responses = []
        for request in requests:
            start = time.monotonic()
            time.sleep(self.sleep_s)
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
            self.latency.observe((time.monotonic() - start) * 1000.0)
        return responses
