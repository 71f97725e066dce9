"""`ab-gateway`'s pieces that need no tritonserver: the echo step that replaces a repository's model steps."""

from __future__ import annotations

from pathlib import Path

from devstack.tritonserver import REPO_ROOT
from loadtest.ab_gateway import echo_steps


def test_ab_gateways_echo_steps_replace_the_model_steps_only(tmp_path: Path) -> None:
    """`ab-gateway --echo-step`: each `*_onnx` step answers zeros (loadtest/echo_step); the tokenizer and the
    ensemble keep theirs."""
    for name in ("bert_onnx", "bert_tokenizer", "bert_onnx_ensemble"):
        (tmp_path / name / "1").mkdir(parents=True)
        if name != "bert_onnx_ensemble":
            (tmp_path / name / "1" / "model.py").write_text(f"# {name}\n")
    assert echo_steps(tmp_path) == ["bert_onnx"]
    echo = (REPO_ROOT / "loadtest" / "echo_step" / "model.py").read_text()
    assert (tmp_path / "bert_onnx" / "1" / "model.py").read_text() == echo
    assert (tmp_path / "bert_tokenizer" / "1" / "model.py").read_text() == "# bert_tokenizer\n"
