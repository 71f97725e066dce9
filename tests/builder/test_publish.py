"""Atomic publication: a failure half-way through puts every entry back."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from builder import publish as publish_module
from builder.errors import BuildError
from builder.publish import publish, staging_directory
from tests.builder.helpers import staging_leftovers, tree_hash


def _entry(root: Path, name: str, text: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(text)


def test_publish_replaces_and_removes_stale(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name in ("m_tokenizer", "m_trt_fp16", "other_onnx"):
        _entry(repo, name, "old")
    with staging_directory(repo) as staging:
        _entry(staging, "m_tokenizer", "new")
        _entry(staging, "m_onnx", "new")
        publish(staging, repo, ["m_tokenizer", "m_onnx"], stale=["m_trt_fp16"])
    assert sorted(p.name for p in repo.iterdir()) == ["m_onnx", "m_tokenizer", "other_onnx"]
    assert (repo / "m_tokenizer" / "config.pbtxt").read_text() == "new"
    assert (repo / "other_onnx" / "config.pbtxt").read_text() == "old"
    assert staging_leftovers(repo) == []


@pytest.mark.parametrize("fail_at", [1, 2, 3, 4, 5])
def test_failure_midway_rolls_back(tmp_path: Path, fail_at: int, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    for name in ("m_tokenizer", "m_onnx", "m_trt_fp16"):
        _entry(repo, name, "old")
    before = tree_hash(repo)
    real_replace = os.replace
    calls = {"n": 0}

    def flaky_replace(src: os.PathLike[str], dst: os.PathLike[str]) -> None:
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    with staging_directory(repo) as staging:
        _entry(staging, "m_tokenizer", "new")
        _entry(staging, "m_onnx", "new")
        monkeypatch.setattr(publish_module.os, "replace", flaky_replace)
        with pytest.raises(BuildError, match="cannot publish"):
            publish(staging, repo, ["m_tokenizer", "m_onnx"], stale=["m_trt_fp16"])
        monkeypatch.setattr(publish_module.os, "replace", real_replace)
    assert tree_hash(repo) == before
    assert staging_leftovers(repo) == []


def test_failure_into_new_repository_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"

    def broken(src: os.PathLike[str], dst: os.PathLike[str]) -> None:
        raise OSError(5, "I/O error")

    with staging_directory(repo) as staging:
        _entry(staging, "m_onnx", "new")
        monkeypatch.setattr(publish_module.os, "replace", broken)
        with pytest.raises(BuildError):
            publish(staging, repo, ["m_onnx"], stale=[])
    assert not repo.exists()


def test_staging_needs_an_existing_parent(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="parent directory"), staging_directory(tmp_path / "missing" / "repo"):
        pass


def test_large_models_keep_weights_in_external_data(python_repository: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Above the protobuf limit (lowered here) the published model.onnx keeps its weights in model.onnx.data."""
    import numpy as np
    import onnxruntime as ort

    from builder import optimize

    source_dir = tmp_path / "export"
    source_dir.mkdir()
    shutil.copy(python_repository / "tinyemb_onnx" / "1" / "model.onnx", source_dir / "model.onnx")
    monkeypatch.setattr(optimize, "EXTERNAL_DATA_THRESHOLD", 1000)
    target = tmp_path / "published" / "model.onnx"
    target.parent.mkdir()
    optimize.publish_onnx(source_dir / "model.onnx", target)
    assert (target.parent / "model.onnx.data").stat().st_size > target.stat().st_size
    feed = {"input_ids": np.full((2, 5), 7, np.int32), "attention_mask": np.ones((2, 5), np.int32),
            "token_type_ids": np.zeros((2, 5), np.int32)}
    expected = ort.InferenceSession(str(source_dir / "model.onnx")).run(None, feed)[0]
    np.testing.assert_array_equal(ort.InferenceSession(str(target)).run(None, feed)[0], expected)
