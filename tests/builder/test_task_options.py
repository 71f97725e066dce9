"""Options of issue 10 (rerank, --pairs, --score-label, --prompt, --default-prompt-name, --matryoshka-dims,
sentence-transformers modules) and the spec key `enabled`: what they resolve to, and every misuse as one
BuildError line. Resolution only (no export), except one real CLI build."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from builder.build import plan
from builder.cli import _parser, main, requests_from_args
from builder.configs import read_config
from builder.errors import BuildError
from builder.settings import BuildRequest, ResolvedSettings
from builder.spec import load_spec
from contract import TEXT, TEXT_PAIR, TRUNCATION_PARAMETER
from devstack.tritonserver import REPO_ROOT
from tests.fixtures.tiny_models import (
    write_tiny_st_embedder,
)

CPU = {"runtime": "python", "formats": "onnx", "device": "cpu"}


@pytest.fixture(scope="module")
def dirs(pair_model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("option_models")
    return {**pair_model_dirs,
            "st": write_tiny_st_embedder(root / "st", prompts={"query": "q: "}, max_seq_length=48)}


def _resolve(model: Path, task: str, **options: Any) -> ResolvedSettings:
    return plan(BuildRequest.model_validate({"model": str(model), "task": task, "name": "m", **CPU, **options}), []).settings


def _pooling_variant(source: Path, root: Path, config: dict[str, Any], modules: list[str] | None = None) -> Path:
    """A copy of `source` with another Pooling config (and module types)."""
    target = root / f"variant{len(list(root.iterdir()))}"
    shutil.copytree(source, target)
    (target / "1_Pooling" / "config.json").write_text(json.dumps(config))
    if modules is not None:
        entries = [{"idx": i, "name": str(i), "path": "1_Pooling" if t.endswith("Pooling") else "", "type": t}
                   for i, t in enumerate(modules)]
        (target / "modules.json").write_text(json.dumps(entries))
    return target


def test_rerank_resolution(dirs: dict[str, Path]) -> None:
    one = _resolve(dirs["ce"], "rerank")
    assert (one.task, one.pairs, one.labels, one.score_label, one.output_name) == ("rerank", True, ["LABEL_0"], 0, "logits")
    assert _resolve(dirs["ce"], "rerank", score_label="0").score_label == 0
    assert _resolve(dirs["nli"], "rerank").score_label == 1  # "entailment", found by name
    assert _resolve(dirs["ce3"], "rerank", score_label="LABEL_2").score_label == 2
    assert _resolve(dirs["ce3"], "rerank", score_label=1).score_label == 1  # an index (YAML int)
    assert _resolve(dirs["nli"], "classify", pairs=True).pairs
    assert not _resolve(dirs["nli"], "classify").pairs


def test_embed_resolution(dirs: dict[str, Path], tmp_path: Path) -> None:
    st = _resolve(dirs["st"], "embed", prompts={"passage": "p: "}, default_prompt_name="passage")
    assert (st.max_seq_len, st.normalize, st.pooling) == (48, True, "mean")
    assert st.prompts == {"query": "q: ", "passage": "p: "} and st.default_prompt_name == "passage"
    assert _resolve(dirs["st"], "embed", max_seq_len=100).max_seq_len == 100  # the user's value wins
    assert _resolve(dirs["st"], "embed", matryoshka_dims="16,8,16").matryoshka_dims == [8, 16, 32]
    assert _resolve(dirs["st"], "embed").matryoshka_dims == []
    new_format = _pooling_variant(dirs["st"], tmp_path, {"embedding_dimension": 32, "pooling_mode": "lasttoken"})
    assert _resolve(new_format, "embed").pooling == "lasttoken"
    legacy_none = _pooling_variant(dirs["st"], tmp_path, {"word_embedding_dimension": 32})  # sentence-transformers: mean
    assert _resolve(legacy_none, "embed").pooling == "mean"
    no_normalize = _pooling_variant(dirs["st"], tmp_path, {"pooling_mode": "cls"},
                                    ["sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling"])
    assert (_resolve(no_normalize, "embed").normalize, _resolve(no_normalize, "embed").pooling) == (False, "cls")


ERRORS: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "rerank without head": ("st", "rerank", {}, "no sequence-classification head; rerank needs a cross-encoder"),
    "several logits": ("ce3", "rerank", {}, "3 logits (LABEL_0, LABEL_1, LABEL_2); give --score-label NAME|INDEX"),
    "unknown score label": ("ce3", "rerank", {"score_label": "relevant"}, "--score-label 'relevant' is neither"),
    "score label out of range": ("ce", "rerank", {"score_label": "1"}, "nor an index below 1"),
    "score label on classify": ("nli", "classify", {"score_label": "0"}, "--score-label is for --task rerank only"),
    "pairs on embed": ("st", "embed", {"pairs": True}, "--pairs is for --task classify"),
    "rerank without pairs": ("ce", "rerank", {"pairs": False}, "always takes text pairs"),
    "prompts on classify": ("nli", "classify", {"prompts": {"q": "q: "}}, "--prompt is for --task embed or sparse-embed only"),
    "default prompt on rerank": ("ce", "rerank", {"default_prompt_name": "q"}, "--default-prompt-name is for --task embed"),
    "matryoshka on classify": ("nli", "classify", {"matryoshka_dims": "8"}, "--matryoshka-dims is for --task embed"),
    "unknown default prompt": ("st", "embed", {"default_prompt_name": "doc"},
                               "default prompt name 'doc' is not a known prompt (known: query)"),
    "matryoshka above width": ("st", "embed", {"matryoshka_dims": "16,64"}, "dimension(s) 64 outside 1..32"),
    "matryoshka zero": ("st", "embed", {"matryoshka_dims": "0"}, "dimension(s) 0 outside 1..32"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_misuse_is_a_build_error(case: str, dirs: dict[str, Path]) -> None:
    model, task, options, message = ERRORS[case]
    with pytest.raises(BuildError, match=message.replace("(", r"\(").replace(")", r"\)").replace("|", r"\|")):
        _resolve(dirs[model], task, **options)


POOLING_ERRORS: dict[str, tuple[dict[str, Any], list[str] | None, str]] = {
    "max": ({"pooling_mode_max_tokens": True}, None, "pooling mode 'max'"),
    "mean_sqrt_len": ({"pooling_mode_mean_sqrt_len_tokens": True}, None, "pooling mode 'mean_sqrt_len_tokens'"),
    "weightedmean": ({"pooling_mode": "weightedmean"}, None, "pooling mode 'weightedmean'"),
    "several legacy": ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True}, None,
                       "several pooling modes at once (cls, mean)"),
    "several": ({"pooling_mode": ["mean", "max"]}, None, "several pooling modes at once (mean, max)"),
    "include_prompt": ({"pooling_mode": "mean", "include_prompt": False}, None, "include_prompt: false"),
    "dense module": ({"pooling_mode": "mean"}, ["sentence_transformers.models.Transformer",
                                                "sentence_transformers.models.Pooling", "sentence_transformers.models.Dense"],
                     "module(s) the export cannot run (sentence_transformers.models.Dense)"),
}


@pytest.mark.parametrize("case", list(POOLING_ERRORS))
def test_pooling_the_export_cannot_do_is_a_build_error(case: str, dirs: dict[str, Path], tmp_path: Path) -> None:
    config, modules, message = POOLING_ERRORS[case]
    variant = _pooling_variant(dirs["st"], tmp_path, config, modules)
    with pytest.raises(BuildError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _resolve(variant, "embed")
    if modules is None:
        assert _resolve(variant, "embed", pooling="mean").pooling == "mean"  # --pooling still wins
    else:  # a module the export cannot run is never approximated, whatever --pooling says (issue 23)
        with pytest.raises(BuildError, match="module"):
            _resolve(variant, "embed", pooling="mean")


def test_cli_options_parse() -> None:
    args = _parser().parse_args(["build", "--repository", "r", "--model", "m", "--task", "embed", "--name", "n",
                                 "--prompt", "query=query: ", "--prompt", "passage=", "--prompt", "eq=a=b",
                                 "--default-prompt-name", "query", "--matryoshka-dims", "768,256"])
    (request,) = requests_from_args(args)
    assert request.prompts == {"query": "query: ", "passage": "", "eq": "a=b"}
    assert request.default_prompt_name == "query" and request.matryoshka_dims == [768, 256]
    args = _parser().parse_args(["build", "--repository", "r", "--model", "m", "--task", "classify", "--name", "n",
                                 "--pairs"])
    assert requests_from_args(args)[0].pairs is True
    args = _parser().parse_args(["build", "--repository", "r", "--model", "m", "--task", "rerank", "--name", "n",
                                 "--score-label", "relevant"])
    (request,) = requests_from_args(args)
    assert (request.score_label, request.pairs, request.prompts) == ("relevant", None, None)


def test_bad_prompt_option_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["build", "--repository", "r", "--model", "m", "--task", "embed", "--name", "n", "--prompt", "query"])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: argument --prompt:") and "is not NAME=TEXT" in line


def test_cli_build_of_a_reranker_with_options(dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = tmp_path / "repo"
    common = ["--repository", str(repo), "--runtime", "python", "--device", "cpu", "--formats", "onnx",
              "--max-batch-size", "4"]
    assert main(["build", *common, "--model", str(dirs["ce3"]), "--task", "rerank", "--name", "r",
                 "--score-label", "LABEL_1"]) == 0
    params = read_config(repo / "r_onnx_ensemble" / "config.pbtxt").parameters
    assert params["score_label"].string_value == "1" and params["pairs"].string_value == "true"
    capsys.readouterr()
    assert main(["build", *common, "--model", str(dirs["ce3"]), "--task", "rerank", "--name", "r"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: r: the model has 3 logits")


def test_spec_enabled(dirs: dict[str, Path], tmp_path: Path) -> None:
    spec = tmp_path / "models.yaml"
    spec.write_text(
        "defaults: {task: embed}\n"
        "models:\n"
        f"  - {{name: first, model: {dirs['st']}}}\n"
        f"  - {{name: off, model: {dirs['st']}, enabled: false}}\n"
        f"  - {{name: var, model: {dirs['st']}, enabled: '${{VAR_ENABLED:-false}}'}}\n"
        "  - {name: unset, model: '${NOT_SET_ANYWHERE}', enabled: false}\n"  # its variables are never needed
        f"  - name: prompts\n    model: {dirs['st']}\n    enabled: ${{PROMPTS_ENABLED:-}}\n"
        "    prompts: {query: 'query: ', passage: 'passage: '}\n    default_prompt_name: query\n"
        "    matryoshka_dims: 16,8\n"
    )
    assert [r.name for r in load_spec(spec, {})] == ["first", "prompts"]
    assert [r.name for r in load_spec(spec, {"VAR_ENABLED": "true", "PROMPTS_ENABLED": "0"})] == ["first", "var"]
    prompts = load_spec(spec, {})[1]
    assert prompts.prompts == {"query": "query: ", "passage": "passage: "} and prompts.matryoshka_dims == [16, 8]
    spec.write_text(f"models:\n  - {{name: x, task: embed, model: {dirs['st']}, enabled: maybe}}\n")
    with pytest.raises(BuildError, match=r"models\[0\]: invalid enabled: 'maybe' is not true or false"):
        load_spec(spec, {})
    spec.write_text("models:\n  - {name: x, task: rerank, model: /m, pairs: true, score_label: 2}\n")
    assert load_spec(spec, {})[0].score_label == "2"


def test_models_yaml_examples() -> None:
    """The example entries of models.yaml are off by default and resolve to their kinds when enabled."""
    spec = REPO_ROOT / "models.yaml"
    assert [r.name for r in load_spec(spec, {})] == ["kcbert", "m3e"]
    enabled = {"RERANK_ENABLED": "true", "PAIR_CLASSIFY_ENABLED": "true", "E5_ENABLED": "true"}
    entries = {r.name: r for r in load_spec(spec, enabled)}
    assert list(entries) == ["kcbert", "m3e", "bge-reranker", "nli", "e5"]
    assert (entries["bge-reranker"].task, entries["bge-reranker"].model) == ("rerank", "BAAI/bge-reranker-base")
    assert entries["nli"].task == "classify" and entries["nli"].pairs is True
    assert entries["e5"].model == "intfloat/multilingual-e5-small"
    assert entries["e5"].prompts == {"query": "query: ", "passage": "passage: "}
    env_example = (REPO_ROOT / ".env.example").read_text()
    for variable in enabled:
        assert f"\n{variable}=false\n" in env_example


def test_triton_tokenizer_names_agree_with_the_contract() -> None:
    """builder/triton_models/tokenizer.py cannot import contract/: its copies of the names must match."""
    tree = ast.parse((REPO_ROOT / "builder" / "triton_models" / "tokenizer.py").read_text())
    names: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            value = ast.literal_eval(node.value) if isinstance(node.value, (ast.Constant, ast.Tuple)) else None
            for target in node.targets:
                if isinstance(target, ast.Tuple) and isinstance(value, tuple):
                    names.update(zip((t.id for t in target.elts if isinstance(t, ast.Name)), value))
                elif isinstance(target, ast.Name):
                    names[target.id] = value
    assert (names["TEXT"], names["TEXT_PAIR"], names["TRUNCATION_PARAMETER"]) == (TEXT, TEXT_PAIR, TRUNCATION_PARAMETER)
    assert names["DIRECTIONS"] == ("right", "left")
