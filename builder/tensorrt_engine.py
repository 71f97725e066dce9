"""FP16 TensorRT 10 engine from the exported ONNX model (explicit batch, one optimization profile).

Only `build_engine` and `run_engine` need the `tensorrt` package; profile shapes are plain data.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from builder.errors import BuildError
from builder.settings import ResolvedSettings, effective_buckets
from contract import TOKEN_INPUTS as INPUT_NAMES


def tensorrt_available() -> bool:
    """True when the TensorRT Python package can be imported."""
    return importlib.util.find_spec("tensorrt") is not None


class ProfileShapes(BaseModel):
    """min/opt/max [batch, seq] of the single optimization profile, the same for all three inputs."""

    min: tuple[int, int]
    opt: tuple[int, int]
    max: tuple[int, int]


def profile_shapes(settings: ResolvedSettings) -> ProfileShapes:
    """Batch 1..max_batch_size (opt: trt_opt_batch_size), seq 1..max_seq_len (opt: 128, typical text).

    With a single length bucket every batch is padded to max_seq_len, so that is the opt length then.
    """
    buckets = effective_buckets(settings.length_buckets, settings.max_seq_len)
    opt_seq = settings.max_seq_len if len(buckets) == 1 else min(128, settings.max_seq_len)
    opt_batch = min(settings.trt_opt_batch_size, settings.max_batch_size)
    return ProfileShapes(min=(1, 1), opt=(opt_batch, opt_seq), max=(settings.max_batch_size, settings.max_seq_len))


def default_timing_cache() -> Path:
    return Path.home() / ".cache" / "model-builder" / "tensorrt_timing.cache"


def build_engine(onnx_path: Path, plan_path: Path, shapes: ProfileShapes, timing_cache: Path, workspace_mib: int) -> None:
    """Parse `onnx_path`, build an FP16 engine with one profile into `plan_path`, update the timing cache."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # TensorRT 10: networks are always explicit-batch
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BuildError(f"TensorRT cannot parse the ONNX model: {errors}")
    config = builder.create_builder_config()
    config.set_flag(trt.BuilderFlag.FP16)
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mib << 20)
    profile = builder.create_optimization_profile()
    for name in INPUT_NAMES:
        profile.set_shape(name, shapes.min, shapes.opt, shapes.max)
    config.add_optimization_profile(profile)
    cache_bytes = timing_cache.read_bytes() if timing_cache.is_file() else b""
    cache = config.create_timing_cache(cache_bytes)
    config.set_timing_cache(cache, ignore_mismatch=False)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BuildError("TensorRT failed to build the engine (see the TensorRT log above)")
    plan_path.write_bytes(bytes(serialized))
    timing_cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = timing_cache.with_suffix(".tmp")
    tmp.write_bytes(bytes(config.get_timing_cache().serialize()))
    tmp.replace(timing_cache)


def run_engine(plan_path: Path, inputs: dict[str, np.ndarray], output_name: str) -> np.ndarray:
    """Run the engine once on `inputs` (for parity), through torch CUDA tensors."""
    import tensorrt as trt
    import torch

    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(plan_path.read_bytes())
    context = engine.create_execution_context()
    tensors = {name: torch.from_numpy(np.ascontiguousarray(inputs[name], dtype=np.int32)).cuda() for name in INPUT_NAMES}
    for name, tensor in tensors.items():
        context.set_input_shape(name, tuple(tensor.shape))
        context.set_tensor_address(name, tensor.data_ptr())
    out = torch.empty(tuple(context.get_tensor_shape(output_name)), dtype=torch.float32, device="cuda")
    context.set_tensor_address(output_name, out.data_ptr())
    stream = torch.cuda.current_stream()
    if not context.execute_async_v3(stream.cuda_stream):
        raise BuildError("TensorRT engine execution failed during parity")
    stream.synchronize()
    return out.cpu().numpy()


def gpu_name() -> str | None:
    """Name of CUDA device 0, when there is one."""
    try:
        import torch

        return str(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else None
    except (RuntimeError, AssertionError):
        return None
