"""The ONNX step's parity run: the published graph on the parity inputs, where it will run (on the GPU when built
for one and onnxruntime-gpu is installed), each output compared with PyTorch's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from builder.logs import Log, step
from builder.optimize import save_onnx
from builder.packing import cpu_form
from builder.parity import ParityResult, check, compare, packed_parity_inputs, real_tokens
from builder.settings import ResolvedSettings
from contract import ATTENTION_MASK, CUDA_PROVIDER_OPTIONS, Layout
from contract.packing import PackedRows


def onnx_parity(s: ResolvedSettings, path: Path, precision: str, inputs: dict[str, np.ndarray],
                references: list[np.ndarray], work: Path, log: Log) -> list[ParityResult]:
    """Every output of the graph at `path` against `references` (PyTorch's on `inputs`); unless parity is skipped, a
    failed one fails the build. `work`: a scratch folder."""
    artifact = "onnx_fp16" if precision == "fp16" else "onnx"
    with step(log, f"{s.name}: running {artifact} for the parity check"):
        if s.layout == "packed":
            outputs, ran_on = packed_outputs(path, inputs, s.output_names, s.device, work)
        else:
            outputs, ran_on = onnx_outputs(path, inputs, s.output_names, s.device, s.runtime), ""
    mask = inputs[ATTENTION_MASK]
    results = [compare(artifact, s.task, references[0], outputs[0], s.max_seq_len)]
    for name, ref, got in zip(s.token_outputs, references[1:], outputs[1:]):  # packed: [T, ...] already
        got = got.reshape(len(got), -1) if s.layout == "packed" else real_tokens(got, mask)
        results.append(compare(artifact, s.task, real_tokens(ref, mask), got, s.max_seq_len, output=name,
                               sentences=len(mask)))
    if s.layout == "packed":
        results = [r.model_copy(update={"layout": "packed", "ran_on": ran_on}) for r in results]
    if not s.skip_parity:
        for result in results:
            check(result, s.name, log)
    return results


def _cuda(runtime: str) -> tuple[str, dict[str, str]]:
    """The CUDA provider as the step will run it: the python runner's options, or (native) the onnxruntime
    backend's, which are onnxruntime's defaults."""
    return "CUDAExecutionProvider", dict(CUDA_PROVIDER_OPTIONS) if runtime == "python" else {}


def onnx_outputs(path: Path, inputs: dict[str, np.ndarray], outputs: list[str], device: str, runtime: str
                 ) -> list[np.ndarray]:
    """The published model's outputs, on the GPU when it is built for one and onnxruntime-gpu is installed."""
    session, _ = published_session(path, device, runtime, "padded", path.parent)
    return run_published(session, inputs, outputs, "padded")


def packed_outputs(path: Path, inputs: dict[str, np.ndarray], outputs: list[str], device: str, work: Path
                   ) -> tuple[list[np.ndarray], str]:
    """The published packed graph's outputs on the parity inputs (packed on the host; per-token outputs come
    back [tokens, ...]), and where it ran (`published_session`)."""
    session, ran_on = published_session(path, device, "python", "packed", work)
    return run_published(session, inputs, outputs, "packed"), ran_on


def published_session(path: Path, device: str, runtime: str, layout: Layout, work: Path
                      ) -> tuple[ort.InferenceSession, str]:
    """An onnxruntime session of the published graph where it will run, and where that is: on the GPU where built
    for one and onnxruntime-gpu is installed; else on the CPU, a packed GPU form as its CPU form (the same graph but
    attention: builder/packing.py), which onnxruntime's CPU provider can run. `work`: a scratch folder."""
    cuda = device == "gpu" and "CUDAExecutionProvider" in ort.get_available_providers()
    if cuda:
        runner = "python" if layout == "packed" else runtime
        return (ort.InferenceSession(str(path), providers=[_cuda(runner), "CPUExecutionProvider"]),
                "CUDAExecutionProvider")
    ran_on = "CPUExecutionProvider"
    if layout == "packed" and device == "gpu":
        if not (work / "cpu_form.onnx").is_file():  # made once per build: parity, then calibration
            save_onnx(cpu_form(onnx.load(str(path))), work / "cpu_form.onnx")
        path, ran_on = work / "cpu_form.onnx", "CPUExecutionProvider (the GPU form's CPU form: no CUDA here)"
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), ran_on


def run_published(session: ort.InferenceSession, inputs: dict[str, np.ndarray], outputs: list[str], layout: Layout
                  ) -> list[np.ndarray]:
    """`outputs` of padded token inputs; a packed graph gets them packed, as its runner feeds it."""
    if layout == "packed":
        return _run_packed(session, outputs, packed_parity_inputs(inputs))
    return [np.asarray(o) for o in session.run(outputs, inputs)]


def _run_packed(session: ort.InferenceSession, outputs: list[str], rows: PackedRows) -> list[np.ndarray]:
    """The rows fed as the graph declares (a graph without mean pooling reads fewer index tensors)."""
    return [np.asarray(o) for o in session.run(outputs, rows.feed({i.name for i in session.get_inputs()}))]
