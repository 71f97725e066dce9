"""Issue 23, resolution and configs (no export): SparseEncoder folders in both layouts, bge-m3 heads, module
names the builder does not know, --task sparse-embed, the warm-up bounded by the token budget and the
declared widths of 8k-context models. The builds themselves and their oracles:
tests/gateway/test_long_sparse_vectors.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from builder.build import plan
from builder.cli import main
from builder.configs import onnx_config, warmup_max_length_rows
from builder.errors import BuildError
from builder.settings import BuildRequest, ResolvedSettings
from contract.batching import Shapes, default_widths, plan_batches
from tests.fixtures.tiny_models import write_tiny_splade, write_tiny_st_embedder, write_tiny_xlmr

CPU = {"runtime": "python", "formats": "onnx", "device": "cpu"}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sparse_models")
    return {
        "st5": write_tiny_splade(root / "st5", "st5", pooling="sum", activation="log1p_relu"),
        "st6": write_tiny_splade(root / "st6", "st6"),
        "m3": write_tiny_xlmr(root / "m3", "bge-m3"),
        "dense": write_tiny_st_embedder(root / "dense"),
    }


def _resolve(model: Path, task: str, **options: Any) -> ResolvedSettings:
    request = BuildRequest.model_validate({"model": str(model), "task": task, "name": "m", **CPU, **options})
    return plan(request, []).settings


def _with_modules(source: Path, target: Path, types: list[str]) -> Path:
    shutil.copytree(source, target)
    modules = json.loads((target / "modules.json").read_text())
    for module, kind in zip(modules, types):
        module["type"] = kind
    (target / "modules.json").write_text(json.dumps(modules))
    return target


def test_sparse_encoder_layouts_of_st5_and_st6(dirs: dict[str, Path]) -> None:
    st5 = _resolve(dirs["st5"], "sparse-embed")
    assert (st5.splade_pooling, st5.splade_activation, st5.output_names) == ("sum", "log1p_relu", ["sparse_embeddings"])
    assert st5.max_batch_tokens == 4096 and st5.token_outputs == []  # a call holds tokens x vocabulary logits
    st6 = _resolve(dirs["st6"], "sparse-embed")
    assert (st6.splade_pooling, st6.splade_activation) == ("max", "relu")
    assert st6.prompts == {"query": "", "document": ""}


@pytest.mark.parametrize("layout", ["st5", "st6"])
def test_a_sparse_encoder_built_as_embed_is_refused(dirs: dict[str, Path], layout: str) -> None:
    with pytest.raises(BuildError, match="is a sentence-transformers SparseEncoder .* Build it with --task sparse-embed"):
        _resolve(dirs[layout], "embed")
    with pytest.raises(BuildError, match="SparseEncoder"):
        _resolve(dirs[layout], "embed", pooling="mean")  # --pooling does not make it a dense model


def test_the_cli_says_so_in_one_line(dirs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["build", "--model", str(dirs["st5"]), "--task", "embed", "--name", "s", "--repository",
                 str(tmp_path / "repo"), "--runtime", "python", "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "--task sparse-embed" in err[0]
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize("module", [
    "sentence_transformers.sparse_encoder.models.SparseAutoEncoder",
    "sentence_transformers.models.Dense",
    "pylate.models.Dense.Dense",
    "my_package.SpladePooling",  # a known class name in another package is not the module the export knows
])
def test_modules_the_export_cannot_run_are_refused_by_name(dirs: dict[str, Path], tmp_path: Path, module: str) -> None:
    sparse = _with_modules(dirs["st6"], tmp_path / "sparse", [
        "sentence_transformers.base.modules.transformer.Transformer", module])
    with pytest.raises(BuildError, match=module.replace(".", r"\.")):
        _resolve(sparse, "sparse-embed")
    dense = _with_modules(dirs["dense"], tmp_path / "dense", ["sentence_transformers.models.Transformer", module])
    with pytest.raises(BuildError, match=module.replace(".", r"\.")):
        _resolve(dense, "embed")


def test_sparse_embed_needs_a_masked_lm_or_a_sparse_encoder(dirs: dict[str, Path]) -> None:
    with pytest.raises(BuildError, match="dense sentence-transformers model, not a SparseEncoder"):
        _resolve(dirs["dense"], "sparse-embed")
    bare = dirs["st6"].parent / "bare_mlm"
    if not bare.exists():
        shutil.copytree(dirs["st6"], bare)
        for name in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
            (bare / name).unlink()
        shutil.rmtree(bare / "1_SpladePooling")
    plain = _resolve(bare, "sparse-embed")  # a bare *ForMaskedLM checkpoint: SPLADE's defaults
    assert (plain.splade_pooling, plain.splade_activation) == ("max", "relu")


def test_splade_pooling_it_cannot_do_is_refused(dirs: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "odd"
    shutil.copytree(dirs["st6"], target)
    (target / "1_SpladePooling" / "config.json").write_text(json.dumps({"pooling_strategy": "mean"}))
    with pytest.raises(BuildError, match="pooling_strategy 'mean'"):
        _resolve(target, "sparse-embed")


def test_bge_m3_heads_become_per_token_outputs(dirs: dict[str, Path]) -> None:
    m3 = _resolve(dirs["m3"], "embed")
    assert m3.flag_heads == ["sparse", "colbert"] and m3.sparse_skip_ids == [0, 1, 2, 3]  # <s> <pad> </s> <unk>
    assert m3.output_names == ["embeddings", "token_embeddings", "token_weights", "colbert_vectors"]
    assert (m3.pooling, m3.normalize, m3.max_seq_len) == ("cls", True, 8192)
    config = onnx_config(m3, 32, "fp32", token_dims={"token_embeddings": [32], "token_weights": [],
                                                     "colbert_vectors": [32]})
    assert [(o.name, list(o.dims)) for o in config.output] == [
        ("embeddings", [32]), ("token_embeddings", [-1, 32]), ("token_weights", [-1]), ("colbert_vectors", [-1, 32])]
    assert config.parameters["max_batch_tokens"].string_value == "16384"
    plain = _resolve(dirs["dense"], "embed")
    assert plain.flag_heads == [] and plain.output_names == ["embeddings", "token_embeddings"]


def test_warm_up_is_bounded_by_the_token_budget(dirs: dict[str, Path]) -> None:
    m3 = _resolve(dirs["m3"], "embed")  # 8,192 tokens, max batch 64, budget 16,384
    assert warmup_max_length_rows(m3) == 2
    assert warmup_max_length_rows(_resolve(dirs["m3"], "embed", max_batch_tokens=4096)) == 1
    assert warmup_max_length_rows(_resolve(dirs["dense"], "embed")) == 64  # 128 tokens: the whole batch fits


def test_declared_widths_of_an_8k_model_and_its_batches() -> None:
    """GPU widths go past 512 in <= 25% steps (a 600-token text is padded to 640, not 8,192); a long text takes
    a batch of its own and short ones keep theirs, the oldest row's batch first."""
    widths = default_widths(8192)
    assert widths[-1] == 8192 and 640 in widths and 4096 in widths
    assert all(b <= a * 1.25 for a, b in zip(widths, widths[1:]) if a >= 64)
    shapes = Shapes(8192, widths, (1, 2, 4, 8, 16, 32, 64))
    assert shapes.width(600) == 640
    warm = shapes.warm_shapes(16384)
    assert (1, 8192) in warm and (2, 8192) in warm and (4, 8192) not in warm
    lengths = [8000, 12, 15, 9, 7000, 20]
    plan = plan_batches(lengths, shapes, max_rows=64, max_tokens=16384, call_cost_tokens=1024)
    batches = [sorted(lengths[i] for i in members) for members, _ in plan]
    assert [9, 12, 15, 20] in batches and all(len(b) <= 2 for b in batches if max(b) > 1000)


@pytest.mark.parametrize("layout", ["st6", "pylate"])
def test_colbert_folders_are_refused_naming_their_modules(dirs: dict[str, Path], tmp_path: Path, layout: str) -> None:
    """sentence-transformers 6 MultiVectorEncoder saves and PyLate saves: refused, never served as pooled vectors."""
    if layout == "st6":
        types = ["sentence_transformers.base.modules.transformer.Transformer",
                 "sentence_transformers.base.modules.dense.Dense",
                 "sentence_transformers.multi_vector_encoder.modules.multi_vector_mask.MultiVectorMask"]
    else:
        types = ["sentence_transformers.models.Transformer", "pylate.models.Dense.Dense"]
    target = tmp_path / layout
    shutil.copytree(dirs["dense"], target)
    (target / "modules.json").write_text(json.dumps(
        [{"idx": i, "name": str(i), "path": "" if i == 0 else f"{i}_M", "type": t} for i, t in enumerate(types)]))
    if layout == "st6":
        config = json.loads((target / "config_sentence_transformers.json").read_text())
        (target / "config_sentence_transformers.json").write_text(json.dumps({**config, "model_type": "MultiVectorEncoder"}))
    with pytest.raises(BuildError, match=f"multi-vector \\(ColBERT\\) model.*{types[1].replace('.', '[.]')}"):
        _resolve(target, "embed")
