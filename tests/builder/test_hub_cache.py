"""The hub-id code path, served from a Hugging Face cache laid out on disk (offline: no network here)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder.manifest import read_manifest
from devstack.tritonserver import REPO_ROOT

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _fake_hub_cache(hf_home: Path, repo_id: str, model_dir: Path) -> None:
    """What `huggingface_hub` leaves after a download: refs/main -> snapshots/<commit>/files."""
    root = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(COMMIT)
    shutil.copytree(model_dir, root / "snapshots" / COMMIT)


@pytest.mark.slow  # a whole build from a hub id in a cache: scripts/test -m slow
@pytest.mark.timeout(300)
def test_build_from_hub_id_in_cache(tiny_embedder_dir: Path, tmp_path: Path) -> None:
    hf_home = tmp_path / "hf_home"
    _fake_hub_cache(hf_home, "tiny-org/tiny-emb", tiny_embedder_dir)
    repo = tmp_path / "repo"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(hf_home)}
    env.pop("HF_HUB_CACHE", None)
    result = subprocess.run(
        [sys.executable, "-m", "builder", "build", "--repository", str(repo), "--model", "tiny-org/tiny-emb",
         "--task", "embed", "--name", "hubemb", "--runtime", "python", "--device", "cpu", "--max-seq-len", "64",
         "--max-batch-size", "8"],
        check=False, capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=280,
    )
    assert result.returncode == 0, result.stderr
    assert "hubemb: built" in result.stdout
    manifest = read_manifest(repo / "hubemb_onnx")
    assert manifest is not None
    assert manifest.source == {"id": "tiny-org/tiny-emb", "revision": COMMIT}
    assert manifest.settings.revision == COMMIT and manifest.settings.pooling == "mean"  # from 1_Pooling
    assert manifest.parity[0].passed
