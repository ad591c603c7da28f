"""Loads fine but answers every request with an error."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError("sample model always fails"))
            for _ in requests
        ]
