"""A python-backend model with a model step's config that computes nothing (loadtest/stack_check.py): each
request gets zeros of the step's per-row output, one row per row it sent (packed: cu_seqlens; padded:
input_ids' rows). Timed beside the real step, it isolates what Triton and the python backend's round trip
cost from what the runner and onnxruntime do inside execute()."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        output = json.loads(args["model_config"])["output"][0]
        self.name, self.width = output["name"], int(output["dims"][-1])

    def execute(self, requests):
        responses = []
        for request in requests:
            cu = pb_utils.get_input_tensor_by_name(request, "cu_seqlens")
            if cu is not None:
                rows = cu.as_numpy().shape[-1] - 1
            else:
                rows = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy().shape[0]
            zeros = np.zeros((rows, self.width), np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor(self.name, zeros)]))
        return responses
