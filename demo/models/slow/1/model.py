"""Sleeps a known time per request, so latency averages can be checked."""

import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.sleep_s = float(params.get("sleep_ms", {}).get("string_value", "50")) / 1000.0

    def execute(self, requests):
        responses = []
        for request in requests:
            time.sleep(self.sleep_s)
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
