"""The repository entries a build writes around its artifacts: the tokenizer entry, a step's config (with its
warm-up samples) and the python runner's files, and the ensembles."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

import numpy as np

from builder import configs
from builder.exporting import Export
from builder.manifest import OnnxFacts
from builder.plan import PlannedBuild
from builder.settings import ResolvedSettings
from contract import (
    BATCHING_MODULE,
    LABELS_FILE,
    PACKING_MODULE,
    QUANTIZATION_RANGES_FILE,
    TOKENIZATION_MODULE,
    TOKENIZER_FILE,
)
from contract.ranges import encode_ranges


def _copy_model_py(module: str, destination: Path) -> None:
    """One of builder/triton_models' files, as the python backend loads it."""
    destination.write_text(resources.files("builder.triton_models").joinpath(f"{module}.py").read_text())


def _copy_contract(module: str, destination: Path) -> None:
    """One of contract/'s standalone modules, beside the model.py that imports it."""
    destination.write_text(resources.files("contract").joinpath(module).read_text())


def write_tokenizer_entry(planned: PlannedBuild, tok_dir: Path) -> None:
    """tokenizer.json, model.py and the shared tokenization module, then the config (with the file's hash)."""
    version_dir = tok_dir / "1"
    version_dir.mkdir(parents=True)
    tokenizer = planned.source.tokenizer
    tokenizer.backend_tokenizer.save(str(version_dir / TOKENIZER_FILE))
    digest = hashlib.sha256((version_dir / TOKENIZER_FILE).read_bytes()).hexdigest()
    _copy_model_py("tokenizer", version_dir / "model.py")
    _copy_model_py("cancellation", version_dir / "cancellation.py")
    _copy_contract(TOKENIZATION_MODULE, version_dir / TOKENIZATION_MODULE)
    configs.write_tokenizer_config(tok_dir, configs.tokenizer_config(planned.settings, int(tokenizer.pad_token_id or 0),
                                                                     digest), planned.settings)


def warmup_ids(planned: PlannedBuild) -> tuple[list[int], list[int]]:
    """The token ids of the steps' warm-up samples (configs.add_step_warmup)."""
    return configs.warmup_token_ids(planned.source.tokenizer, planned.settings.max_seq_len)


def write_onnx_step(planned: PlannedBuild, onnx_dir: Path, export: Export, facts: OnnxFacts) -> None:
    """The ONNX step's config beside its graph; on the python runtime, the runner and the contract modules it
    imports (the packed layout's rules on a packed step)."""
    s = planned.settings
    step_config = configs.onnx_config(s, export.width, facts.precision, planned.fingerprint, export.token_dims)
    if s.layout == "packed":
        configs.set_vocabulary(step_config, int(export.config.vocab_size),
                               int(getattr(export.config, "type_vocab_size", 0) or 0))
    configs.write_step_config(onnx_dir, step_config, s, warmup_ids(planned))
    if s.runtime == "python":
        version_dir = onnx_dir / "1"
        _copy_model_py("onnx_runner", version_dir / "model.py")
        _copy_model_py("cancellation", version_dir / "cancellation.py")
        _copy_contract(BATCHING_MODULE, version_dir / BATCHING_MODULE)
        if s.layout == "packed":
            _copy_model_py("packed_runner", version_dir / "packed_runner.py")
            _copy_contract(PACKING_MODULE, version_dir / PACKING_MODULE)


def write_trt_step(planned: PlannedBuild, trt_dir: Path, export: Export) -> None:
    """The TensorRT step's config (its engine is built into it afterwards)."""
    s = planned.settings
    configs.write_step_config(trt_dir, configs.trt_config(s, export.width, export.token_dims), s, warmup_ids(planned))


def write_ensembles(s: ResolvedSettings, staging: Path, entries: dict[str, str], width: int,
                    ranges: Mapping[int, np.ndarray]) -> None:
    """One ensemble per format, with the labels file of a model that has labels, and an embedder's calibrated
    int8 ranges (the config's parameter, and a copy in the version directory: `builder serve` puts back a
    version's own)."""
    for fmt in s.formats:
        ens_dir = staging / entries[f"{fmt}_ensemble"]
        configs.write_config(ens_dir, configs.ensemble_config(s, fmt, width, ranges))
        if ranges:
            (ens_dir / "1" / QUANTIZATION_RANGES_FILE).write_text(encode_ranges(ranges))
        if s.labels is not None:
            (ens_dir / LABELS_FILE).write_text("".join(f"{label}\n" for label in s.labels or []))
