"""Every bad input: one `error:` line on stderr, exit 2 (usage) or 1 (build), the repository untouched.

Also: --help lists the choices, mistakes are refused before torch is imported, and a build logs its long steps."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import get_args

import pytest
from transformers import BertConfig, GPT2Config

from builder import summary
from builder.cli import main
from builder.machine import nvidia_gpus
from builder.settings import Device, Format, Pooling, Runtime
from builder.tensorrt_engine import tensorrt_available
from contract import TASKS
from devstack.tritonserver import REPO_ROOT
from tests.builder.helpers import staging_leftovers, tree_hash

TINY = ["--runtime", "python", "--device", "cpu", "--formats", "onnx", "--max-seq-len", "64", "--max-batch-size", "8"]


@pytest.fixture
def repository(python_repository: Path, tmp_path: Path) -> Path:
    """A copy of a good repository that a failing build must leave exactly as it is."""
    repo = tmp_path / "model_repository"
    shutil.copytree(python_repository, repo)
    return repo


def _bad_dirs(root: Path, tiny_classifier_dir: Path) -> dict[str, Path]:
    no_config = root / "no_config"
    no_config.mkdir()
    (no_config / "vocab.txt").write_text("[PAD]\n")
    decoder = root / "gpt2"
    GPT2Config(n_layer=1, n_embd=8, n_head=2).save_pretrained(decoder)
    no_tokenizer = root / "no_tokenizer"
    shutil.copytree(tiny_classifier_dir, no_tokenizer)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        (no_tokenizer / name).unlink()
    BertConfig.from_pretrained(no_tokenizer)  # still a valid BERT checkpoint
    return {"no_config": no_config, "decoder": decoder, "no_tokenizer": no_tokenizer}


def _assert_one_error_line(captured: str, expected: str) -> None:
    lines = [line for line in captured.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]


USAGE, BUILD = 2, 1  # exit statuses (README.md)
# case -> (options, expected error text, exit status)
CASES = {
    "missing path": (["--model", "/does/not/exist", "--task", "embed"], "not a readable directory", BUILD),
    "not a model dir": (["--model", "{no_config}", "--task", "embed"], "has no config.json", BUILD),
    "decoder model": (["--model", "{decoder}", "--task", "embed"], "not a supported encoder", BUILD),
    "no fast tokenizer": (["--model", "{no_tokenizer}", "--task", "classify"], "tokenizer", BUILD),
    "unsupported task": (["--model", "{cls}", "--task", "generate"], "invalid choice: 'generate'", USAGE),
    "max-seq-len above limit": (["--model", "{cls}", "--task", "classify", "--max-seq-len", "4096"],
                                "above the model's limit of 128", BUILD),
    "bad max-seq-len": (["--model", "{cls}", "--task", "classify", "--max-seq-len", "0"], "invalid max-seq-len",
                        USAGE),
    "label count": (["--model", "{cls}", "--task", "classify", "--labels", "a,b"], "model's head has 3 outputs",
                    BUILD),
    "bad device": (["--model", "{cls}", "--task", "classify", "--device", "tpu"], "invalid choice: 'tpu'", USAGE),
    "bad name": (["--model", "{cls}", "--task", "classify", "--name", "../evil"], "invalid name", USAGE),
    "missing task": (["--model", "{cls}"], "missing --task", USAGE),
    "not a hub id": (["--model", "no//such", "--task", "embed"], "neither an existing directory nor a hub id", USAGE),
    "option of another task": (["--model", "{cls}", "--task", "classify", "--prompt", "q=query: "],
                               "--prompt is for --task embed or sparse-embed only", USAGE),
    "calibration of another task": (["--model", "{cls}", "--task", "classify", "--calibration-texts", "{cls}/vocab.txt"],
                                    "--calibration-texts is for --task embed only", USAGE),
    "missing calibration texts": (["--model", "{cls}", "--task", "embed", "--calibration-texts", "/no/such.txt"],
                                  "--calibration-texts /no/such.txt: no such file", USAGE),
    "trt on cpu": (["--model", "{cls}", "--task", "classify", "--formats", "trt", "--device", "cpu"],
                   "--formats trt needs --device gpu", USAGE),
    "onnx tensorrt on cpu": (["--model", "{cls}", "--task", "classify", "--onnx-accelerator", "tensorrt"],
                             "--onnx-accelerator tensorrt needs --device gpu", USAGE),
    "onnx cuda, python runtime": (["--model", "{cls}", "--task", "classify", "--device", "gpu",
                                   "--onnx-accelerator", "cuda"], "--onnx-accelerator cuda needs --runtime native",
                                  USAGE),
}


def _main(argv: list[str]) -> int:
    """main()'s exit status, also when argparse exits (usage errors found while parsing)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("existing", [True, False], ids=["existing-repo", "new-repo"])
def test_bad_input(
    case: str, existing: bool, repository: Path, tiny_classifier_dir: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if not existing:
        repository = tmp_path / "fresh_repository"
    dirs = {k: str(v) for k, v in _bad_dirs(tmp_path, tiny_classifier_dir).items()}
    args, expected, code = CASES[case]
    argv = [a.format(cls=tiny_classifier_dir, **dirs) for a in args]
    if "--name" not in argv and case != "missing task":
        argv += ["--name", "tinycls"]
    before = tree_hash(repository)
    capsys.readouterr()
    status = _main(["build", "--repository", str(repository), *TINY, *argv])
    assert status == code
    _assert_one_error_line(capsys.readouterr().err, expected)
    assert tree_hash(repository) == before
    assert staging_leftovers(repository) == []


@pytest.mark.skipif(tensorrt_available(), reason="TensorRT is installed here, so --formats trt is valid")
def test_trt_without_tensorrt(repository: Path, tiny_classifier_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = tree_hash(repository)
    status = main(["build", "--repository", str(repository), "--model", str(tiny_classifier_dir), "--task", "classify",
                   "--name", "tinycls", "--formats", "onnx,trt"])
    assert status == 1
    _assert_one_error_line(capsys.readouterr().err, "`tensorrt` Python package is not installed")
    assert tree_hash(repository) == before


def test_bad_spec_files(repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = tree_hash(repository)
    specs = {
        "not: [valid": "not valid YAML",
        "defaults: {}\n": "non-empty `models:` list",
        "models:\n  - {name: x, task: embed, model: '${BUILDER_TEST_UNSET_VARIABLE}'}\n":
            "BUILDER_TEST_UNSET_VARIABLE is not set",
        "models:\n  - {name: x, task: embed, model: /m, colour: blue}\n": "invalid colour",
        "models:\n  - {name: x, task: embed, model: /m, max_seq_len: lots}\n": "invalid max-seq-len",
    }
    for text, expected in specs.items():
        spec = tmp_path / "spec.yaml"
        spec.write_text(text)
        assert main(["build", "--repository", str(repository), "--spec", str(spec)]) == USAGE
        _assert_one_error_line(capsys.readouterr().err, expected)
    assert main(["build", "--repository", str(repository), "--spec", str(tmp_path / "missing.yaml")]) == USAGE
    _assert_one_error_line(capsys.readouterr().err, "cannot read spec file")
    assert tree_hash(repository) == before


def test_spec_with_environment(
    tiny_classifier_dir: Path, tiny_embedder_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spec = tmp_path / "models.yaml"
    spec.write_text(
        "defaults:\n"
        "  runtime: python\n  device: ${DEVICE:-cpu}\n  formats: ${FORMATS:-onnx}\n  max_batch_size: ${MAX_BATCH:-4}\n"
        "  max_seq_len: 32\n"
        "models:\n"
        "  - {name: '${CLS_NAME}', model: '${CLS_MODEL}', task: classify, labels: '${LABELS:-}'}\n"
        "  - name: emb\n    model: ${EMB_MODEL}\n    task: embed\n    max-queue-delay-us: ${DELAY:-250}\n"
    )
    monkeypatch.setenv("CLS_NAME", "spec_cls")
    monkeypatch.setenv("CLS_MODEL", str(tiny_classifier_dir))
    monkeypatch.setenv("EMB_MODEL", str(tiny_embedder_dir))
    monkeypatch.setenv("MAX_BATCH", "16")
    repo = tmp_path / "repo"
    assert main(["build", "--repository", str(repo), "--spec", str(spec)]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "spec_cls: built" in out and "emb: built" in out
    # each long step logs its start and its duration on stderr
    for step in (f"spec_cls: loading the weights of {tiny_classifier_dir}", "spec_cls: exporting ONNX (opset 17)",
                 "spec_cls: optimizing the ONNX graph (fp32)", "spec_cls: running onnx for the parity check",
                 "emb: exporting ONNX (opset 17)", f"publishing 6 entries into {repo}"):
        assert f"{step} ...\n" in captured.err, captured.err
        assert re.search(re.escape(step) + r" done in \d+\.\ds\n", captured.err), captured.err
    from builder.configs import read_config

    emb = read_config(repo / "emb_onnx" / "config.pbtxt")
    assert emb.max_batch_size == 16 and emb.dynamic_batching.max_queue_delay_microseconds == 250
    cls = read_config(repo / "spec_cls_onnx_ensemble" / "config.pbtxt")
    assert json.loads(cls.parameters["labels"].string_value) == ["negative", "neutral", "positive"]
    assert cls.parameters["max_seq_len"].string_value == "32"
    assert "warning:" not in captured.err  # built for this machine's CPU and python backend
    # same spec again: nothing to do, and it says so
    assert main(["build", "--repository", str(repo), "--spec", str(spec)]) == 0
    assert capsys.readouterr().out.count("up to date, nothing to do") == 2


def test_last_lines_say_what_each_model_is_built_for(
    tiny_embedder_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The builder's defaults (a GPU build) on a machine without a GPU: said, and warned about, in the last lines;
    the last line's time is the whole command's (here: this process's), not one model's."""
    repo = tmp_path / "repo"
    argv = ["build", "--repository", str(repo), "--model", str(tiny_embedder_dir), "--task", "embed", "--name", "e",
            "--formats", "onnx", "--max-seq-len", "64", "--max-batch-size", "8"]
    started = time.monotonic()
    assert main(argv) == 0
    elapsed = time.monotonic() - started
    captured = capsys.readouterr()
    *_, built, last = captured.out.splitlines()
    target = "for runtime native, device gpu, formats onnx"
    assert built == f"e: built e_tokenizer, e_onnx, e_onnx_ensemble as version 1 {target}"
    done = re.fullmatch(rf"done in (\d+\.\d)s: built 1 model into {re.escape(str(repo))}", last)
    assert done and float(done[1]) >= round(elapsed, 1) - 0.1, last
    # per-token outputs are compared token by token, and the parity line says so
    assert re.search(r"parity e onnx_fp16\[token_embeddings\]: .* over \d+ tokens of \d+ sentences", captured.err)
    warned = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    if nvidia_gpus() == 0:
        assert warned == [line for line in captured.err.splitlines()[-1:]], captured.err  # the last line of stderr
        assert "e built for a GPU" in warned[0] and "--runtime python --device cpu" in warned[0]
    assert main(argv) == 0
    *_, skipped, last = capsys.readouterr().out.splitlines()
    assert skipped == f"e: up to date, nothing to do (e_tokenizer, e_onnx, e_onnx_ensemble) {target}"
    assert re.fullmatch(rf"done in \d+\.\ds: nothing to build in {re.escape(str(repo))}", last)


def test_gpu_warning_only_without_a_gpu(tiny_embedder_dir: Path, tmp_path: Path) -> None:
    from dataclasses import replace

    from tests.fixtures.repository import TINY_LIMITS, build_repository

    model = [{"model": str(tiny_embedder_dir), "task": "embed", "name": "e"}]
    on_gpu = build_repository(tmp_path / "gpu", model, runtime="native", device="gpu", formats="onnx", **TINY_LIMITS)
    assert on_gpu[0].settings is not None
    on_cpu = [replace(on_gpu[0], settings=on_gpu[0].settings.model_copy(update={"device": "cpu"}))]
    assert len(summary.warnings(on_gpu, gpus=0)) == 1
    assert summary.warnings(on_gpu, gpus=1) == [] and summary.warnings(on_cpu, gpus=0) == []


@pytest.mark.slow  # ~7 s (a real builder process importing torch): `scripts/test -m slow`; the one-line errors of the
# CLI are checked in-process above, and test_hub_cache.py runs the real process on a hub id in the cache
@pytest.mark.timeout(180)
def test_real_cli_process_unknown_hub_id(repository: Path) -> None:
    """The real `python -m builder` process: a hub id that is not available gives one line and exit 1."""
    before = tree_hash(repository)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(repository.parent / "hf_home")}
    result = subprocess.run(
        [sys.executable, "-m", "builder", "build", "--repository", str(repository), "--model",
         "no-such-org/no-such-model", "--task", "embed", "--name", "x"],
        check=False, capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=170,
    )
    assert result.returncode == 1
    _assert_one_error_line(result.stderr, "cannot fetch model 'no-such-org/no-such-model'")
    assert result.stdout == ""
    assert tree_hash(repository) == before


def test_help_lists_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    assert _main(["build", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for literal_values in (TASKS, get_args(Device), get_args(Runtime), get_args(Pooling)):
        assert "{" + ",".join(literal_values) + "}" in text
    assert "--formats " + ",".join(get_args(Format)) in text
    assert "2 usage error" in text


_FAST_REFUSAL = """
import sys
from builder import summary
from builder.cli import main
from builder.machine import nvidia_gpus
heavy = [m for m in ("torch", "transformers", "onnxruntime") if m in sys.modules]
assert not heavy, f"import builder.cli imported {heavy}"
try:
    status = main(sys.argv[1:])
except SystemExit as exc:
    status = exc.code
heavy = [m for m in ("torch", "transformers", "onnxruntime") if m in sys.modules]
assert not heavy, f"refusing the command imported {heavy}"
print(status)
"""


@pytest.mark.parametrize(("argv", "code"), [
    (["--model", "/does/not/exist", "--task", "embed", "--name", "x"], BUILD),
    (["--model", "{cls}", "--task", "generate", "--name", "x"], USAGE),
    (["--model", "{cls}", "--task", "embed", "--name", "x", "--score-label", "1"], USAGE),
    (["--spec", "{spec}"], USAGE),
    (["--model", "{cls}", "--task", "embed", "--name", "x", "--device", "cpu", "--onnx-accelerator", "tensorrt"],
     USAGE),
], ids=["wrong path", "wrong task", "option of another task", "bad spec entry", "onnx tensorrt on cpu"])
def test_mistakes_are_refused_before_torch_is_imported(
    argv: list[str], code: int, tiny_classifier_dir: Path, tmp_path: Path,
) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"models:\n  - {{name: x, task: embed, model: {tiny_classifier_dir}, max_seq_len: lots}}\n")
    argv = [a.format(cls=tiny_classifier_dir, spec=spec) for a in argv]
    # refused before torch, transformers or onnxruntime are imported (checked inside the process): fast by
    # construction, whatever the machine's load
    result = subprocess.run(
        [sys.executable, "-c", _FAST_REFUSAL, "build", "--repository", str(tmp_path / "repo"), *argv],
        check=False, capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == code
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1, result.stderr


def test_no_warmup_flag_reaches_the_request(tmp_path: Path) -> None:
    from builder.cli import _parser, requests_from_args

    base = ["build", "--repository", str(tmp_path), "--model", str(tmp_path), "--task", "embed", "--name", "m"]
    assert requests_from_args(_parser().parse_args(base))[0].warmup is True
    assert requests_from_args(_parser().parse_args([*base, "--no-warmup"]))[0].warmup is False
