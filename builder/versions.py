"""Model versions in the repository: each build of a model NAME is published as a new version
directory of all its entries (tokenizer, steps, ensembles share the number), next to the versions
before it, so that Triton can switch to it without downtime (`load` in explicit model control).

Every config has a version policy: `latest: 1` (serve the newest) by default, or `specific`
(serve one chosen version: a rollback without a rebuild, see `python -m builder serve`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from builder.errors import UsageError
from contract import QUANTIZATION_RANGES_FILE, Param


def versions(entry: Path) -> list[int]:
    """The version directories of a repository entry, oldest first."""
    if not entry.is_dir():
        return []
    return sorted(int(p.name) for p in entry.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) > 0)


def next_version(entries: Iterable[Path]) -> int:
    """One more than the newest version of any of a model's entries (1 for a new model)."""
    return 1 + max((v for entry in entries for v in versions(entry)), default=0)


def stage_version(staged: Path, version: int, live: Path, keep: int) -> None:
    """Make the staged entry (written with version `1/`) version `version`, and carry the newest
    `keep - 1` versions of the live entry into it, as hard links (same filesystem: no copy)."""
    if version != 1:
        os.replace(staged / "1", staged / str(version))
    for old in versions(live)[-(keep - 1):] if keep > 1 else []:
        if old != version:
            shutil.copytree(live / str(old), staged / str(old), copy_function=_link_or_copy, symlinks=True)


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:  # a filesystem without hard links
        shutil.copy2(source, destination)


def set_policy(config: mc.ModelConfig, version: int | None) -> None:
    """`latest: 1` (version None) or `specific: [version]`."""
    config.ClearField("version_policy")
    if version is None:
        config.version_policy.latest.num_versions = 1
    else:
        config.version_policy.specific.versions.append(version)


def set_version_ranges(config: mc.ModelConfig, entry: Path, version: int | None) -> None:
    """An embedder's ensemble carries the int8 ranges of the version it serves (the newest for None): that build's
    copy in its version directory, or none for a version built without them."""
    chosen = version if version is not None else max(versions(entry), default=None)
    if config.platform != "ensemble" or chosen is None:
        return
    copy = entry / str(chosen) / QUANTIZATION_RANGES_FILE
    if copy.is_file():
        config.parameters[Param.QUANTIZATION_RANGES].string_value = copy.read_text()
    elif Param.QUANTIZATION_RANGES in config.parameters:
        del config.parameters[Param.QUANTIZATION_RANGES]


def check_servable(entries: list[Path], version: int) -> None:
    """Every entry must hold `version` before a config may name it."""
    missing = [e.name for e in entries if version not in versions(e)]
    if missing:
        have = sorted({v for e in entries for v in versions(e)})
        raise UsageError(f"version {version} is not in {', '.join(missing)} (versions present: {have})")
