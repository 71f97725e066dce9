"""Benchmark variants: rewritten configs that tritonserver still loads."""

from __future__ import annotations

from pathlib import Path

import tritonclient.grpc as grpcclient

from devstack.fake_repository import write_fake_repository
from devstack.tritonserver import TritonServer
from loadtest.variants import (
    copy_with,
    pad_to_max_length,
    read_config,
    without_dynamic_batching,
)
from tests.fixtures.triton import serving


def _with_batching(name: str, config: object) -> bool:
    if config.platform == "ensemble":  # type: ignore[attr-defined]
        return False
    config.dynamic_batching.max_queue_delay_microseconds = 100  # type: ignore[attr-defined]
    return True


def test_without_dynamic_batching_loads_and_serves(tmp_path: Path) -> None:
    repo = copy_with(write_fake_repository(tmp_path / "fake"), tmp_path / "repo", _with_batching)
    assert read_config(repo / "fakeemb_onnx").HasField("dynamic_batching")
    off = without_dynamic_batching(repo, tmp_path / "off")
    assert not read_config(off / "fakeemb_onnx").HasField("dynamic_batching")
    assert read_config(repo / "fakeemb_onnx").HasField("dynamic_batching"), "original untouched"
    with serving(TritonServer(repository=off)) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.is_model_ready("fakeemb_onnx_ensemble")


def test_pad_to_max_length_sets_one_bucket(tmp_path: Path) -> None:
    repo = write_fake_repository(tmp_path / "repo")

    def add_buckets(name: str, config: object) -> bool:
        if name != "fakeemb_onnx":
            return False
        config.parameters["length_buckets"].string_value = "16,32,64"  # type: ignore[attr-defined]
        config.parameters["max_seq_len"].string_value = "64"  # type: ignore[attr-defined]
        return True

    tok = copy_with(repo, tmp_path / "tok", add_buckets)
    padded = pad_to_max_length(tok, tmp_path / "padded")
    assert read_config(padded / "fakeemb_onnx").parameters["length_buckets"].string_value == "64"
    assert read_config(tok / "fakeemb_onnx").parameters["length_buckets"].string_value == "16,32,64"


def test_ab_gateways_echo_steps_replace_the_model_steps_only(tmp_path) -> None:
    """`ab-gateway --echo-step`: each `*_onnx` step answers zeros (loadtest/echo_step); the tokenizer and the
    ensemble keep theirs."""
    from loadtest.ab_gateway import echo_steps
    from devstack.tritonserver import REPO_ROOT

    for name in ("bert_onnx", "bert_tokenizer", "bert_onnx_ensemble"):
        (tmp_path / name / "1").mkdir(parents=True)
        if name != "bert_onnx_ensemble":
            (tmp_path / name / "1" / "model.py").write_text(f"# {name}\n")
    assert echo_steps(tmp_path) == ["bert_onnx"]
    echo = (REPO_ROOT / "loadtest" / "echo_step" / "model.py").read_text()
    assert (tmp_path / "bert_onnx" / "1" / "model.py").read_text() == echo
    assert (tmp_path / "bert_tokenizer" / "1" / "model.py").read_text() == "# bert_tokenizer\n"
