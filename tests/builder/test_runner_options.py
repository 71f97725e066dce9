"""The python runner's onnxruntime CUDA options are the ones the builder's parity runs with."""

from __future__ import annotations

import ast
from pathlib import Path

from contract import CUDA_PROVIDER_OPTIONS

RUNNER = Path(__file__).resolve().parents[2] / "builder" / "triton_models" / "onnx_runner.py"


def test_the_runner_runs_cuda_with_the_contract_options() -> None:
    """The runner cannot import contract inside Triton, so it keeps a copy: the same dict, and TF32 off (an fp32
    build computes its GEMMs in fp32, as its parity was checked)."""
    copies = [ast.literal_eval(node.value) for node in ast.parse(RUNNER.read_text()).body
              if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)]
              == ["CUDA_PROVIDER_OPTIONS"]]
    assert copies == [CUDA_PROVIDER_OPTIONS]
    assert CUDA_PROVIDER_OPTIONS["use_tf32"] == "0"
