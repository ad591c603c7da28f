"""Returns the byte length of each string: a BYTES-input sample model."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            lengths = np.vectorize(lambda b: len(b), otypes=[np.int32])(texts)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LENGTH", lengths.astype(np.int32))]))
        return responses
