"""Version directories (builder/versions.py): numbering, carrying and pruning; the end-to-end switch
under traffic is tests/gateway/test_admin.py."""

from __future__ import annotations

import shutil
from pathlib import Path

from builder.versions import next_version, stage_version, versions


def test_versions_kept_and_pruned(tmp_path: Path) -> None:
    """Each build is a new version of every entry; `--keep-versions` keeps the newest ones."""
    live = tmp_path / "repo" / "m_onnx"
    for v in (1, 2, 3):
        (live / str(v)).mkdir(parents=True)
        (live / str(v) / "model.onnx").write_text(f"v{v}")
    assert next_version([live, tmp_path / "repo" / "m_tokenizer"]) == 4
    for keep, kept in ((1, [4]), (2, [3, 4]), (3, [2, 3, 4])):
        staged = tmp_path / f"staged{keep}" / "m_onnx"
        (staged / "1").mkdir(parents=True)
        (staged / "1" / "model.onnx").write_text("v4")
        stage_version(staged, 4, live, keep)
        assert versions(staged) == kept
        assert (staged / "4" / "model.onnx").read_text() == "v4"
        if keep > 1:  # carried as hard links, not copies
            assert (staged / "3" / "model.onnx").stat().st_ino == (live / "3" / "model.onnx").stat().st_ino
    shutil.rmtree(tmp_path / "repo")
    assert next_version([live]) == 1
