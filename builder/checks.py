"""Checks of build requests that need neither the model's weights nor torch/transformers.

The CLI runs them before it imports the heavy libraries, so that a wrong option, task or model path
is refused at once. Imports here stay light (no torch, transformers, onnxruntime).
"""

from __future__ import annotations

import re
from pathlib import Path

from builder.errors import BuildError, UsageError
from builder.settings import PACKED_TASKS, BuildRequest
from contract import Task

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$|^[A-Za-z0-9][\w.\-]*$")


def check_model(model: str) -> Path | None:
    """The directory of a local `model`, or None for a hub id.

    BuildError when a local directory is missing or holds no config.json; UsageError when `model`
    is neither a path nor spelled like a hub id.
    """
    path = Path(model).expanduser()
    if path.exists() or model.startswith((".", "/", "~")):
        if not path.is_dir():
            raise BuildError(f"model path {model!r} is not a readable directory")
        if not (path / "config.json").is_file():
            raise BuildError(f"model path {model!r} has no config.json: not a Hugging Face model directory")
        return path
    if HUB_ID.match(model):
        return None
    raise UsageError(f"model {model!r} is neither an existing directory nor a hub id")


def check_task_options(request: BuildRequest, task: Task) -> None:
    """Options that belong to another task are errors, not silently ignored."""
    embed_only = {"--matryoshka-dims": request.matryoshka_dims, "--calibration-texts": request.calibration_texts}
    for option, value in embed_only.items():
        if value is not None and task != "embed":
            raise UsageError(f"{request.name}: {option} is for --task embed only, not {task}")
    if request.calibration_texts is not None and not Path(request.calibration_texts).expanduser().is_file():
        raise UsageError(f"{request.name}: --calibration-texts {request.calibration_texts}: no such file")
    for option, given in {"--prompt": request.prompts, "--default-prompt-name": request.default_prompt_name}.items():
        if given is not None and task not in ("embed", "sparse-embed"):
            raise UsageError(f"{request.name}: {option} is for --task embed or sparse-embed only, not {task}")
    if request.pooling is not None and task == "sparse-embed":
        raise UsageError(f"{request.name}: --pooling is for --task embed; sparse-embed pools as its SpladePooling says")
    if request.score_label is not None and task != "rerank":
        raise UsageError(f"{request.name}: --score-label is for --task rerank only, not {task}")
    if request.pairs and task in ("embed", "sparse-embed"):
        raise UsageError(f"{request.name}: --pairs is for --task classify (rerank always takes pairs), not {task}")
    if request.pairs is False and task == "rerank":
        raise UsageError(f"{request.name}: a rerank model always takes text pairs; drop pairs: false")


def check_options(request: BuildRequest) -> None:
    """Option combinations that contradict each other, whatever the model."""
    check_task_options(request, request.task)
    if request.formats and "trt" in request.formats and request.device != "gpu":
        raise UsageError(f"{request.name}: --formats trt needs --device gpu (TensorRT engines run on GPUs only)")
    if request.merge_buckets and request.runtime != "python":
        raise UsageError(f"{request.name}: --merge-buckets needs --runtime python "
                         "(the native backends batch equal shapes only)")
    if request.onnx_precision == "fp16" and request.onnx_optimize is False:
        raise UsageError(f"{request.name}: --onnx-precision fp16 converts the optimized graph; it needs the "
                         "optimizer (drop --no-onnx-optimize or use --onnx-precision fp32)")
    if request.layout == "packed":
        check_packed_layout(request)
    accelerator = request.onnx_accelerator
    if accelerator not in (None, "none"):
        if request.device != "gpu":
            raise UsageError(f"{request.name}: --onnx-accelerator {accelerator} needs --device gpu (ONNX Runtime's "
                             f"{'TensorRT' if accelerator == 'tensorrt' else 'CUDA'} provider runs on GPUs; a CPU "
                             "build takes none)")
        if request.runtime != "native":
            raise UsageError(f"{request.name}: --onnx-accelerator {accelerator} needs --runtime native (Triton's "
                             "onnxruntime backend reads it; the python runner opens its own onnxruntime session "
                             "and takes none)")


def check_packed_layout(request: BuildRequest) -> None:
    """`--layout packed` needs the python runner, the optimizer's fused attention and ragged batching."""
    if request.runtime != "python":
        raise UsageError(f"{request.name}: --layout packed needs --runtime python: the python runner packs padded "
                         "requests, checks cu_seqlens, fills max_seqlen and splits the rows back per request; Triton's "
                         "onnxruntime backend would hand the graph a batch of padded requests as they are")
    if request.onnx_optimize is False:
        raise UsageError(f"{request.name}: --layout packed needs onnxruntime's optimizer (its fused attention becomes "
                         "the packed attention); drop --no-onnx-optimize")
    if request.merge_buckets is False:
        raise UsageError(f"{request.name}: a packed step merges requests of any shape (its inputs allow ragged "
                         "batches); drop --no-merge-buckets")
    if request.formats is not None and "onnx" not in request.formats:
        raise UsageError(f"{request.name}: --layout is the onnx step's (TensorRT steps stay padded); "
                         "--formats has no onnx")
    if request.task not in PACKED_TASKS:
        raise UsageError(f"{request.name}: --layout packed is for --task embed, classify or rerank; a {request.task} "
                         "model pools over its padded tokens (build it with --layout padded)")


def check_names(requests: list[BuildRequest]) -> None:
    """Every NAME once: the entries of two models must not overwrite each other."""
    names = [r.name for r in requests]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise UsageError(f"model name(s) used more than once: {', '.join(duplicates)}")


def check_requests(requests: list[BuildRequest]) -> None:
    """Every check that needs no heavy import: names, option combinations, local model directories."""
    check_names(requests)
    for request in requests:
        check_options(request)
        check_model(request.model)
