"""Helpers of the builder tests."""

from __future__ import annotations

import hashlib
from pathlib import Path


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
