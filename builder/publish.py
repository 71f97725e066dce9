"""Atomic publication: entries are built in a staging directory next to the repository and renamed in.

If anything fails before or during publication, the repository is left exactly as it was
(a repository that did not exist is not created).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from builder.errors import BuildError


@contextmanager
def staging_directory(repository: Path) -> Iterator[Path]:
    """A temporary directory beside `repository` (same filesystem, so renames are atomic); removed afterwards."""
    parent = repository.resolve().parent
    if not parent.is_dir():
        raise BuildError(f"cannot build into {repository}: its parent directory {parent} does not exist")
    if repository.exists() and not repository.is_dir():
        raise BuildError(f"repository {repository} exists and is not a directory")
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{repository.name}.build-", dir=parent))
    except OSError as exc:
        raise BuildError(f"cannot create a staging directory next to {repository}: {exc.strerror}") from None
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def publish(staging: Path, repository: Path, entries: list[str], stale: list[str]) -> None:
    """Move `entries` from `staging` into `repository`, replacing entries of the same name, removing `stale`.

    Replaced and stale entries are first moved aside into the staging directory; on any error every
    move is undone in reverse order.
    """
    created_repository = not repository.exists()
    aside = staging / ".replaced"
    aside.mkdir()
    done: list[tuple[Path, Path]] = []  # (from, to) renames, for rollback
    try:
        if created_repository:
            repository.mkdir()
        for name in [*entries, *stale]:
            target = repository / name
            if target.exists() or target.is_symlink():
                os.replace(target, aside / name)
                done.append((target, aside / name))
        for name in entries:
            os.replace(staging / name, repository / name)
            done.append((staging / name, repository / name))
    except OSError as exc:
        for source, destination in reversed(done):
            os.replace(destination, source)
        if created_repository:
            shutil.rmtree(repository, ignore_errors=True)
        raise BuildError(f"cannot publish into {repository}: {exc}") from None
