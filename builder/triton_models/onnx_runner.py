"""Triton python-backend model that runs model.onnx with onnxruntime (`--runtime python`).

Requests of one execute() call that share a sequence length run as ONE onnxruntime call
(concatenated along the batch axis, outputs split back). With the config parameter
`merge_buckets` (inputs marked allow_ragged_batch, so the dynamic batcher merges requests of
different lengths) every request of the call is padded to the widest and all run as one call. The CUDA execution provider is used
when the instance is KIND_GPU and onnxruntime offers it, else the CPU provider.
"""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _pad_to(tensor, width):
    """Right-pad a [batch, seq] token tensor with zeros (attention mask 0: padding the encoder ignores)."""
    missing = width - tensor.shape[1]
    return tensor if missing == 0 else np.pad(tensor, ((0, 0), (0, missing)))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = config.get("parameters", {})
        self.output = config["output"][0]["name"]
        options = ort.SessionOptions()
        threads = int(parameters.get("intra_op_num_threads", {}).get("string_value", "0") or 0)
        if threads > 0:
            options.intra_op_num_threads = threads
        providers = ["CPUExecutionProvider"]
        if args.get("model_instance_kind") == "GPU" and "CUDAExecutionProvider" in ort.get_available_providers():
            device = int(args.get("model_instance_device_id", "0"))
            providers = [("CUDAExecutionProvider", {"device_id": device}), "CPUExecutionProvider"]
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        self.session = ort.InferenceSession(path, sess_options=options, providers=providers)
        self.merge_buckets = parameters.get("merge_buckets", {}).get("string_value", "") == "1"

    def execute(self, requests):
        inputs = [
            {name: pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in INPUTS} for r in requests
        ]
        if self.merge_buckets:
            width = max(tensors["input_ids"].shape[1] for tensors in inputs)
            inputs = [{name: _pad_to(t, width) for name, t in tensors.items()} for tensors in inputs]
        groups = {}
        for index, tensors in enumerate(inputs):
            groups.setdefault(tensors["input_ids"].shape[1], []).append(index)
        outputs = [None] * len(requests)
        for members in groups.values():
            feed = {
                name: np.ascontiguousarray(np.concatenate([inputs[i][name] for i in members]), dtype=np.int32)
                for name in INPUTS
            }
            result = self.session.run([self.output], feed)[0]
            start = 0
            for i in members:
                size = inputs[i]["input_ids"].shape[0]
                outputs[i] = result[start:start + size]
                start += size
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(self.output, np.ascontiguousarray(o, dtype=np.float32))])
            for o in outputs
        ]
