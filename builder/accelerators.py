"""Execution accelerators of the `onnx` model step under Triton's onnxruntime backend (--onnx-accelerator).

Every key and value the builder writes for them is defined here; builder/README.md documents them.
The onnxruntime backend reads them when it creates an instance's session on a GPU (KIND_GPU), in
`ModelState::LoadModel` of src/onnxruntime.cc (triton-inference-server/onnxruntime_backend, r24.12,
the release compose.yaml pins, and main as of 2026):

- `optimization { execution_accelerators { gpu_execution_accelerator: [...] } }`, one entry per
  provider. `name: "tensorrt"` appends ONNX Runtime's TensorRT provider (`precision_mode` "FP32" |
  "FP16" | "INT8" (main also "BF16") -> trt_fp16_enable ...; `max_workspace_size_bytes` ->
  trt_max_workspace_size; every other `trt_*` key passes through, an unknown key fails the load).
  `name: "cuda"` passes its parameters to the CUDA provider as they are (ONNX Runtime's option names
  and value spellings). Any other name fails the load ("unknown Execution Accelerator"). The CUDA
  provider is always appended after them: under `tensorrt` it runs what TensorRT does not take.
- The older model-config `parameters` `cudnn_conv_algo_search` ("0" EXHAUSTIVE, "1" HEURISTIC,
  "2" DEFAULT) and `arena_extend_strategy` ("0" kNextPowerOfTwo, "1" kSameAsRequested), "deprecated"
  in the backend's README. The backend reads them *after* the accelerator list and, whenever the
  config has any `parameters` at all (ours always do: `precision`), stores them or their defaults
  (EXHAUSTIVE, kNextPowerOfTwo) over what a `cuda` accelerator set. So the CUDA options are written
  both ways with the same meaning: the parameters are what r24.12 applies, the accelerator entry is
  the documented form.

Nothing here was run: no TensorRT and no onnxruntime backend exist on the development machines.
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from builder.settings import ResolvedSettings
from builder.tensorrt_engine import profile_shapes
from contract import TOKEN_INPUTS, step_model

TENSORRT = "tensorrt"  # accelerator names the backend knows
CUDA = "cuda"

# CUDA provider options (both accelerators): the search only matters for convolutions (a BERT graph
# has none; HEURISTIC spares a convolution model the exhaustive cuDNN search on every new input
# shape); kSameAsRequested grows the memory arena by what a batch asks for instead of doubling it,
# so variable [batch, seq] shapes and several models on one GPU reserve less memory.
CUDA_OPTIONS: dict[str, str] = {"cudnn_conv_algo_search": "HEURISTIC", "arena_extend_strategy": "kSameAsRequested"}
CUDA_PARAMETERS: dict[str, str] = {"cudnn_conv_algo_search": "1", "arena_extend_strategy": "1"}  # same, as numbers

# TensorRT provider keys (values below, in tensorrt_parameters).
PRECISION_MODE = "precision_mode"
TRT_PRECISION = "FP16"
MAX_WORKSPACE = "max_workspace_size_bytes"
CACHE_ENABLE = "trt_engine_cache_enable"
CACHE_PATH = "trt_engine_cache_path"
CACHE_PREFIX = "trt_engine_cache_prefix"
PROFILE_MIN, PROFILE_OPT, PROFILE_MAX = "trt_profile_min_shapes", "trt_profile_opt_shapes", "trt_profile_max_shapes"
TENSORRT_KEYS = (PRECISION_MODE, MAX_WORKSPACE, CACHE_ENABLE, CACHE_PATH, CACHE_PREFIX, PROFILE_MIN, PROFILE_OPT,
                 PROFILE_MAX)


def _shapes(batch_seq: tuple[int, int]) -> str:
    """`input_ids:BxS,attention_mask:BxS,token_type_ids:BxS` (ONNX Runtime's profile-shape syntax)."""
    batch, seq = batch_seq
    return ",".join(f"{name}:{batch}x{seq}" for name in TOKEN_INPUTS)


def cache_prefix(settings: ResolvedSettings, build_id: str) -> str:
    """File-name prefix of this build's engines in the shared cache directory: the step's entry name and
    the build fingerprint. ONNX Runtime names an engine by a hash of the model's file name, its graph's
    input and node names and the ORT/CUDA/TensorRT versions, not of its weights: two models of one
    architecture, or a rebuild with new weights, would otherwise load each other's engines."""
    name = step_model(settings.name, "onnx")
    return f"{name}_{build_id[:16]}" if build_id else name


def tensorrt_parameters(settings: ResolvedSettings, build_id: str) -> dict[str, str]:
    """The `tensorrt` accelerator's parameters: FP16, the workspace limit, the engine cache, and one explicit
    optimization profile covering every shape the step accepts (batch 1..max_batch_size, seq 1..max_seq_len;
    the `trt` format's profile): without it the provider builds an engine for the first shape it sees and
    builds again whenever a shape falls outside the range seen so far."""
    shapes = profile_shapes(settings)
    return {
        PRECISION_MODE: TRT_PRECISION,
        MAX_WORKSPACE: str(settings.trt_workspace_mib << 20),
        CACHE_ENABLE: "1",
        CACHE_PATH: settings.onnx_trt_cache,
        CACHE_PREFIX: cache_prefix(settings, build_id),
        PROFILE_MIN: _shapes(shapes.min),
        PROFILE_OPT: _shapes(shapes.opt),
        PROFILE_MAX: _shapes(shapes.max),
    }


def add_accelerator(config: mc.ModelConfig, settings: ResolvedSettings, build_id: str = "") -> None:
    """Write settings.onnx_accelerator into the onnx step's config (native runtime on a GPU only; `none`,
    CPU and python-runtime builds get nothing). `build_id`: the build fingerprint (cache_prefix)."""
    if settings.onnx_accelerator == "none" or settings.device != "gpu" or settings.runtime != "native":
        return
    accelerators = config.optimization.execution_accelerators.gpu_execution_accelerator
    if settings.onnx_accelerator == "tensorrt":
        accelerators.add(name=TENSORRT, parameters=tensorrt_parameters(settings, build_id))
    accelerators.add(name=CUDA, parameters=CUDA_OPTIONS)
    for key, value in CUDA_PARAMETERS.items():
        config.parameters[key].string_value = value
