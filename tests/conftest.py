"""Session fixtures shared by every test package: tiny local models, the builder's python-runtime
repository built from them, and a real tritonserver serving it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.fake_repository import write_fake_repository
from devstack.tritonserver import TritonServer
from tests.fixtures.repository import PYTHON_CPU, TINY_LIMITS, build_repository
from tests.fixtures.tiny_models import (
    write_tiny_classifier,
    write_tiny_cross_encoder,
    write_tiny_embedder,
    write_tiny_pair_classifier,
)


@pytest.fixture(scope="session")
def tiny_classifier_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 3-label (negative/neutral/positive) BERT classifier saved like a hub checkpoint."""
    return write_tiny_classifier(tmp_path_factory.mktemp("tiny_classifier"))


@pytest.fixture(scope="session")
def tiny_embedder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random BERT encoder with a sentence-transformers mean-pooling config."""
    return write_tiny_embedder(tmp_path_factory.mktemp("tiny_embedder"))


@pytest.fixture(scope="session")
def pair_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Pair models (read-only): `ce` a 1-logit cross-encoder, `ce3` one with 3 logits, `nli` a pair classifier."""
    root = tmp_path_factory.mktemp("pair_models")
    return {
        "ce": write_tiny_cross_encoder(root / "ce"),
        "ce3": write_tiny_cross_encoder(root / "ce3", num_labels=3),
        "nli": write_tiny_pair_classifier(root / "nli"),
    }


@pytest.fixture(scope="session")
def python_repository(tiny_classifier_dir: Path, tiny_embedder_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tinycls` (classify) + `tinyemb` (embed) built with --runtime python --formats onnx --device cpu,
    max_seq_len 64, max_batch_size 8."""
    repository = tmp_path_factory.mktemp("python_repository") / "model_repository"
    build_repository(
        repository,
        [
            {"model": str(tiny_classifier_dir), "task": "classify", "name": "tinycls"},
            {"model": str(tiny_embedder_dir), "task": "embed", "name": "tinyemb"},
        ],
        **PYTHON_CPU,
        **TINY_LIMITS,
    )
    return repository


@pytest.fixture(scope="session")
def triton_server(python_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """A real tritonserver serving `python_repository` (log in a tmp dir: `server.log_path`)."""
    log = tmp_path_factory.mktemp("triton_logs") / "tritonserver.log"
    with TritonServer(repository=python_repository, log_path=log) as server:
        yield server


@pytest.fixture(scope="session")
def fake_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake-contract repository (fakecls + fakeemb, no real model: devstack/fake_repository.py)."""
    return write_fake_repository(tmp_path_factory.mktemp("fake_repository"))


@pytest.fixture(scope="session")
def fake_triton(fake_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """A real tritonserver on the fake repository, shared by every test that does not stop or reconfigure it."""
    log = tmp_path_factory.mktemp("logs") / "fake_triton.log"
    with TritonServer(repository=fake_repository, log_path=log) as server:
        yield server
