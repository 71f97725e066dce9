"""Helpers of the builder tests."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np


def tree_hash(root: Path) -> str:
    """Hash of every path, file content and symlink under `root` ("absent" when root does not exist)."""
    if not root.exists():
        return "absent"
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        if path.is_file():
            digest.update(path.read_bytes())
        elif path.is_symlink():
            digest.update(str(path.readlink()).encode())
    return digest.hexdigest()


def staging_leftovers(repository: Path) -> list[str]:
    """Staging directories the builder left next to `repository` (there must be none)."""
    return sorted(p.name for p in repository.parent.glob(f".{repository.name}.build-*"))


def padded_rows(lengths: list[int], vocab: int, pairs: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right-padded int32 ids, mask, token types [rows, longest] of random tokens ([CLS]=first id 2 ... [SEP]=3 as
    the tiny WordPiece vocab has them); `pairs`: token type 1 on a random second segment."""
    rng = np.random.default_rng(seed)
    width = max(lengths)
    ids, mask, types = (np.zeros((len(lengths), width), np.int32) for _ in range(3))
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(5, vocab, n)
        ids[row, 0], ids[row, n - 1] = 2, 3
        mask[row, :n] = 1
        if pairs and n > 2:
            types[row, int(rng.integers(1, n)):n] = 1
    return ids, mask, types
