"""A tiny Triton repository with the ensemble interface of docs/contract.md and no real model (tests, benchmarks).

`fake_onnx` (python backend) turns each text into a deterministic vector (`fake_vector`) and
counts whitespace words + 2 as `num_tokens` (a text `sleep:SECONDS ...` makes it sleep first, a text
`hold:PATH ...` makes it wait until the file PATH exists: a test opens that gate when it chooses);
`fakecls_onnx_ensemble` (classify) and `fakeemb_onnx_ensemble` (embed) wrap it exactly like the
builder's ensembles. Tests use it where the exact numbers matter more than a real BERT (order, shm
bytes, restarts), and the builder's tiny BERT repository where predictions must match PyTorch.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import orjson
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

LABELS = ["negative", "neutral", "positive"]
EMBED_DIM = 8
MAX_BATCH = 8
MAX_SEQ_LEN = 16

MODEL_PY = '''
import json
import os
import time
import zlib

import numpy as np
import triton_python_backend_utils as pb_utils


def fake_vector(text, width):
    return np.random.default_rng(zlib.crc32(text)).standard_normal(width).astype(np.float32)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.width = int(config["parameters"]["width"]["string_value"])
        self.output = config["output"][0]["name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "text").as_numpy().reshape(-1)
            for t in texts:
                if bytes(t).startswith(b"sleep:"):  # tests: a call that keeps Triton busy for a while
                    time.sleep(float(bytes(t)[6:].split()[0]))
                if bytes(t).startswith(b"hold:"):  # tests: a call that keeps Triton busy until a file exists
                    gate, deadline = bytes(t)[5:].split()[0], time.monotonic() + 300
                    open(gate + b".held", "w").close()  # the test may wait for this: the call is in the model
                    while not os.path.exists(gate) and time.monotonic() < deadline:
                        time.sleep(0.01)
            out = np.stack([fake_vector(bytes(t), self.width) for t in texts])
            ntok = np.array([[len(bytes(t).split()) + 2] for t in texts], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor(self.output, out), pb_utils.Tensor("num_tokens", ntok)]))
        return responses
'''


def fake_vector(text: str, width: int) -> np.ndarray:
    """The vector the fake model returns for `text` (same formula as MODEL_PY)."""
    return np.random.default_rng(zlib.crc32(text.encode())).standard_normal(width).astype(np.float32)


def fake_num_tokens(text: str) -> int:
    return len(text.encode().split()) + 2


def _tensor(name: str, dtype: int, dims: list[int]) -> dict[str, object]:
    return {"name": name, "data_type": dtype, "dims": dims}


def _write(path: Path, config: mc.ModelConfig) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "1").mkdir(exist_ok=True)
    (path / "config.pbtxt").write_text(text_format.MessageToString(config))


def _step_model(repo: Path, name: str, output: str, width: int) -> None:
    config = mc.ModelConfig(name=name, backend="python", max_batch_size=MAX_BATCH)
    config.input.add(name="text", data_type=mc.TYPE_STRING, dims=[1])
    config.output.add(name=output, data_type=mc.TYPE_FP32, dims=[width])
    config.output.add(name="num_tokens", data_type=mc.TYPE_INT32, dims=[1])
    config.parameters["width"].string_value = str(width)
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=1)
    _write(repo / name, config)
    (repo / name / "1" / "model.py").write_text(MODEL_PY)


def _ensemble(
    repo: Path, name: str, step: str, output: str, width: int, params: dict[str, str], backend: str = "onnx"
) -> None:
    config = mc.ModelConfig(name=f"{name}_{backend}_ensemble", platform="ensemble", max_batch_size=MAX_BATCH)
    config.input.add(name="text", data_type=mc.TYPE_STRING, dims=[1])
    config.output.add(name=output, data_type=mc.TYPE_FP32, dims=[width])
    config.output.add(name="num_tokens", data_type=mc.TYPE_INT32, dims=[1])
    s = config.ensemble_scheduling.step.add(model_name=step, model_version=-1)
    s.input_map["text"] = "text"
    s.output_map[output] = output
    s.output_map["num_tokens"] = "num_tokens"
    for k, v in {"model_name": name, "backend": backend, "max_seq_len": str(MAX_SEQ_LEN), "source": "fake", **params}.items():
        config.parameters[k].string_value = v
    _write(repo / config.name, config)


def write_fake_repository(repo: Path) -> Path:
    """Write `fakecls` (classify, 3 labels) and `fakeemb` (embed, dim 8) into `repo`.

    `fakeemb` also gets a `fakeemb_trt_fp16_ensemble` (backend `trt_fp16`, same step model), so
    that backend preference and choice can be tested without TensorRT. Its onnx ensemble says
    `onnx_accelerator: tensorrt` (what /v1/models reports; the fake step runs on the CPU all the
    same); `fakecls` has no such parameter, like a repository built before it (reported `none`).
    """
    _step_model(repo, "fakecls_onnx", "logits", len(LABELS))
    _step_model(repo, "fakeemb_onnx", "embeddings", EMBED_DIM)
    _ensemble(repo, "fakecls", "fakecls_onnx", "logits", len(LABELS), {"task": "classify", "labels": orjson.dumps(LABELS).decode()})
    emb = {"task": "embed", "embedding_dim": str(EMBED_DIM), "pooling": "mean"}
    _ensemble(repo, "fakeemb", "fakeemb_onnx", "embeddings", EMBED_DIM, {**emb, "onnx_accelerator": "tensorrt"})
    _ensemble(repo, "fakeemb", "fakeemb_onnx", "embeddings", EMBED_DIM, emb, backend="trt_fp16")
    return repo
