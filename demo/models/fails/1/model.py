"""Loads fine, answers positive inputs, and raises for the rest: a model that really fails.

Triton counts a response that carries an error as a *successful* request; only an
exception out of ``execute()`` is counted as a failure (``reason="BACKEND"``). So this
model raises, deterministically by input: ``X > 0`` gets ``Y = X``, anything else
(zero, negative, NaN; the health probe's zeros) makes the whole call raise. The demo
sends every other request with a negative ``X``, so about half of them fail.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if not np.all(x > 0):
                raise RuntimeError(f"sample model always fails on X <= 0 (got {float(x.flat[0]):g})")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x.astype(np.float32))]))
        return responses
