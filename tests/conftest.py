"""Session fixtures shared by every test package: tiny local models, repositories the real builder makes
from them, and real tritonservers serving those repositories.

Sharing is what keeps the default run short (CI: 2 cores, 5 minutes): build a model and start a server
once per session, not once per module. What is shared:

- `fake_repository` / `fake_triton`: the fake-contract models (`fakecls`, `fakeemb`; devstack/fake_repository.py),
  for tests of the gateway's own behaviour (order, shm bytes, errors, restarts).
- `python_repository` / `triton_server`: `tinycls` (classify) and `tinyemb` (embed) as the builder's
  `--runtime python` writes them, for tests whose numbers must match PyTorch.
- `peer_repository` / `peer_server` (tests/gateway/conftest.py): a reranker, pair classifiers and a
  sentence-transformers embedder with prompts.
- `shared` (a `SharedRepositories`, tests/fixtures/shared.py): any other repository, built and served once
  per session under a key, by every module that asks for the same key with the same models.

Adding a model:

1. Its source: a function in tests/fixtures/tiny_models.py (random weights, a checkpoint saved like the
   hub's), written once per session by a session fixture (as `tiny_classifier_dir`).
2. Read-only use (inference, configs, statistics of its own model only): serve it from a shared server.
   Either add it to a repository above (a name no test uses yet; a test that lists a server's models
   exactly, such as tests/builder/test_build.py's `test_layout`, lists it too; a task that repository
   already serves makes requests that omit `model` ambiguous: give it a repository of its own then), or
   ask `shared` for a repository of its own kind (sparse or multi-vector models, a packed layout, ...):
       repository = shared.repository("mykind", [{"model": str(my_model_dir), "task": "embed", "name": "mine"}],
                                      **PYTHON_CPU, **TINY_LIMITS)   # BuildRequest fields, as build_repository
       server = shared.server("mykind")
   and use that key (with the same models) from every module that needs it.
3. A test that loads, unloads, reloads, rebuilds or stops models, or starts Triton with other flags, owns
   its server: copy a built repository (`shutil.copytree(python_repository, ...)`, tests/gateway/test_admin.py)
   rather than build the same models again, and serve it with `serving(TritonServer(...))`
   (tests/fixtures/triton.py: killed at the end, a graceful stop costs 2-4 s).
4. Count on a shared server with deltas: other tests' traffic is in its statistics and in the gateway's
   process-wide Prometheus registry (tests/fixtures/metrics.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.fake_repository import write_fake_repository
from devstack.tritonserver import TritonServer
from tests.fixtures.repository import PYTHON_CPU, TINY_LIMITS, build_repository
from tests.fixtures.shared import SharedRepositories
from tests.fixtures.tiny_models import (
    write_tiny_classifier,
    write_tiny_cross_encoder,
    write_tiny_embedder,
    write_tiny_pair_classifier,
)
from tests.fixtures.triton import serving


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
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedRepositories]:
    """Repositories and servers built once per session under a key (see "Adding a model" above)."""
    repositories = SharedRepositories(tmp_path_factory.mktemp("shared"))
    yield repositories
    repositories.close()


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
    with serving(TritonServer(repository=python_repository, log_path=log)) as server:
        yield server


@pytest.fixture(scope="session")
def fake_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake-contract repository (fakecls + fakeemb, no real model: devstack/fake_repository.py)."""
    return write_fake_repository(tmp_path_factory.mktemp("fake_repository"))


@pytest.fixture(scope="session")
def fake_triton(fake_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """A real tritonserver on the fake repository, shared by every test that does not stop or reconfigure it."""
    log = tmp_path_factory.mktemp("logs") / "fake_triton.log"
    with serving(TritonServer(repository=fake_repository, log_path=log)) as server:
        yield server
