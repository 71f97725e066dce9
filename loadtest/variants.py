"""Benchmark variants of a built repository: the same models with one config setting changed.

Configs are read and written as tritonclient's `ModelConfig` protobuf (text format), like the
builder writes them; the copies go to a new folder, the original is left alone.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc


def read_config(model_dir: Path) -> mc.ModelConfig:
    return text_format.Parse((model_dir / "config.pbtxt").read_text(), mc.ModelConfig())


def write_config(model_dir: Path, config: mc.ModelConfig) -> None:
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(config))


def ensembles(repo: Path) -> list[tuple[str, mc.ModelConfig]]:
    """(folder name, config) of every ensemble with a `task` parameter (the served models)."""
    out = []
    for cfg in sorted(repo.glob("*/config.pbtxt")):
        config = read_config(cfg.parent)
        if config.platform == "ensemble" and "task" in config.parameters:
            out.append((cfg.parent.name, config))
    return out


def copy_with(repo: Path, dest: Path, edit: Callable[[str, mc.ModelConfig], bool]) -> Path:
    """Copy `repo` to `dest` and apply `edit(model name, config)` to every model; it returns True if changed."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(repo, dest, symlinks=True)
    changed = 0
    for cfg in sorted(dest.glob("*/config.pbtxt")):
        config = read_config(cfg.parent)
        if edit(cfg.parent.name, config):
            write_config(cfg.parent, config)
            changed += 1
    if not changed:
        raise ValueError(f"no model config changed in {repo}")
    return dest


def pad_to_max_length(repo: Path, dest: Path) -> Path:
    """Tokenizers pad every batch to max_seq_len: `length_buckets` = the max_seq_len alone."""

    def edit(name: str, config: mc.ModelConfig) -> bool:
        if "length_buckets" not in config.parameters:
            return False
        buckets = [int(b) for b in config.parameters["length_buckets"].string_value.split(",") if b.strip()]
        top = config.parameters["max_seq_len"].string_value if "max_seq_len" in config.parameters else str(max(buckets))
        config.parameters["length_buckets"].string_value = str(top)
        return True

    return copy_with(repo, dest, edit)


def merged_buckets(repo: Path, dest: Path) -> Path:
    """The python-backend model steps accept ragged batches and pad the merged batch themselves
    (what `python -m builder build --merge-buckets` writes)."""

    def edit(name: str, config: mc.ModelConfig) -> bool:
        if config.backend != "python" or not any(i.name == "attention_mask" for i in config.input):
            return False
        for tensor in config.input:
            tensor.allow_ragged_batch = True
        config.parameters["merge_buckets"].string_value = "1"
        return True

    return copy_with(repo, dest, edit)


def without_dynamic_batching(repo: Path, dest: Path) -> Path:
    """Every non-ensemble model without `dynamic_batching` (each request runs alone)."""

    def edit(name: str, config: mc.ModelConfig) -> bool:
        if config.platform == "ensemble" or not config.HasField("dynamic_batching"):
            return False
        config.ClearField("dynamic_batching")
        return True

    return copy_with(repo, dest, edit)
