"""Fixtures of the load-test tests: the devstack (real tritonserver + real gateway process) on the fake repository."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.fake_repository import write_fake_repository
from devstack.stack import LocalStack


@pytest.fixture(scope="session")
def lt_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fake_repository(tmp_path_factory.mktemp("lt_repository"))


@pytest.fixture(scope="session")
def lt_stack(lt_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """tritonserver + `python -m gateway` (1 worker, shm) on the fake repository."""
    logs = tmp_path_factory.mktemp("lt_logs")
    with LocalStack(lt_repository, gateway_settings={"workers": "1", "shm": "system"}, log_dir=logs) as stack:
        yield stack
