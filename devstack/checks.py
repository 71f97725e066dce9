"""Checks before devstack starts anything: the repository can be served here, and a port is free.

Each failure is a CheckFailed whose message names the cause and the fix, so that a mistake costs no start-up and
no log reading."""

from __future__ import annotations

import socket
from collections.abc import Iterable
from pathlib import Path

from google.protobuf.text_format import ParseError
from tritonclient.grpc import model_config_pb2 as mc

from builder.configs import read_config
from builder.machine import LOCAL_BUILD, nvidia_gpus
from devstack.failures import CheckFailed

# The backend a config's `platform` runs on (a config names either); ensembles are Triton's own
PLATFORM_BACKENDS = {"onnxruntime_onnx": "onnxruntime", "tensorrt_plan": "tensorrt", "pytorch_libtorch": "pytorch",
                     "tensorflow_savedmodel": "tensorflow", "tensorflow_graphdef": "tensorflow"}
BUILT_IN = {"ensemble"}
BUILD_EXAMPLE = ("python -m builder build --model DIR --task embed --name NAME --repository {repository} "
                 f"{LOCAL_BUILD} (README.md, builder/README.md)")
NAMES_SHOWN = 3


def _names(names: list[str], verb: str) -> str:
    """`a, b, c and 2 more need`: the models, then `verb` in agreement."""
    shown = ", ".join(names[:NAMES_SHOWN])
    shown = shown if len(names) <= NAMES_SHOWN else f"{shown} and {len(names) - NAMES_SHOWN} more"
    return f"{shown} {verb}s" if len(names) == 1 else f"{shown} {verb}"


def backend_of(config: mc.ModelConfig) -> str:
    return config.backend or PLATFORM_BACKENDS.get(config.platform, config.platform)


def check_repository(repository: Path, backends: Iterable[str], gpus: int | None = None) -> None:
    """`repository` exists, holds models, and each runs on a backend of this tritonserver (`backends`: those in
    its backends/ folder) and on a device this machine has (`gpus`: default, the NVIDIA GPUs seen here)."""
    build = BUILD_EXAMPLE.format(repository=repository)
    if not repository.is_dir():
        raise CheckFailed(f"no model repository at {repository}: build a model into it first, e.g. {build}; "
                          "or give --repository DIR")
    configs = sorted(repository.glob("*/config.pbtxt"))
    if not configs:
        raise CheckFailed(f"{repository} holds no model (no */config.pbtxt): build one into it first, e.g. {build}")
    available = set(backends) | BUILT_IN
    gpus = nvidia_gpus() if gpus is None else gpus
    missing: dict[str, list[str]] = {}
    on_gpu: list[str] = []
    for path in configs:
        try:
            config = read_config(path)
        except ParseError as exc:
            raise CheckFailed(f"{path} is not a valid Triton model config ({exc}): rebuild that model") from None
        name = config.name or path.parent.name
        if (backend := backend_of(config)) not in available:
            missing.setdefault(backend, []).append(name)
        if any(group.kind == mc.ModelInstanceGroup.KIND_GPU for group in config.instance_group):
            on_gpu.append(name)
    if missing:
        backend, names = next(iter(missing.items()))
        raise CheckFailed(
            f"{repository}: {_names(names, 'need')} Triton's {backend} backend, and the local tritonserver has only "
            f"{', '.join(sorted(set(backends)))}: rebuild with {LOCAL_BUILD}, or serve this repository with the "
            "Compose stack (README.md)")
    if on_gpu and gpus == 0:
        raise CheckFailed(f"{repository}: {_names(on_gpu, 'run')} on a GPU (KIND_GPU) and this machine has none: "
                          f"rebuild with {LOCAL_BUILD}")


def check_port_free(port: int, host: str, whose: str, fix: str) -> None:
    """Nothing listens on `host`:`port` (a TIME_WAIT socket does not count, as for the servers themselves)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise CheckFailed(f"port {port} ({whose}) is not free on {host}: {exc.strerror}; {fix}") from None
