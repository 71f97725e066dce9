"""Fixtures of the packed-layout tests: tiny XLM-RoBERTa models, and packed graphs of every tiny model, built
once per session with the builder's own export, optimizer and rewrite (builder/packing.py)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from transformers import AutoModel, AutoModelForSequenceClassification

from builder.export import RepositoryModel, export_onnx
from builder.optimize import optimize_for_onnxruntime
from builder.packing import cpu_form, packed_model, position_offset
from contract import TOKEN_EMBEDDINGS, output_name
from tests.fixtures.tiny_models import write_tiny_roberta


@pytest.fixture(scope="session")
def tiny_roberta_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`embed`: an XLM-R encoder; `rerank`: a 1-logit XLM-R cross-encoder (position ids after padding_idx)."""
    root = tmp_path_factory.mktemp("tiny_roberta")
    return {task: write_tiny_roberta(root / task, task) for task in ("embed", "rerank")}


@dataclass
class PackedCase:
    """A tiny model's fp32 PyTorch reference and its packed graph in both forms."""

    model: RepositoryModel
    gpu_form: onnx.ModelProto
    cpu_form: onnx.ModelProto
    vocab: int
    pairs: bool
    optimized: Path  # the optimizer's padded graph the packed one was made from

    def run(self, feed: dict[str, np.ndarray], model: onnx.ModelProto | None = None, output: int = 0) -> np.ndarray:
        """The CPU form's (or `model`'s) output number `output` on CPU; `feed` may hold inputs the graph does not
        declare (the runner feeds a session its declared inputs only)."""
        session = ort.InferenceSession((model or self.cpu_form).SerializeToString(), providers=["CPUExecutionProvider"])
        declared = {i.name for i in session.get_inputs()}
        return np.asarray(session.run(None, {k: v for k, v in feed.items() if k in declared})[output])

    def reference(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray, output: int = 0) -> np.ndarray:
        with torch.inference_mode():
            out = self.model(*(torch.from_numpy(a) for a in (ids, mask, types)))
        return (out[output] if isinstance(out, tuple) else out).numpy()


class PackedGraphs:
    """Packed graphs of the tiny models by (model, task, pooling, float16), built on first use."""

    def __init__(self, dirs: dict[str, Path], work: Path) -> None:
        self.dirs, self.work, self.cases = dirs, work, {}

    def get(self, model: str, task: str, pooling: str | None = None, float16: bool = False,
            token_outputs: bool = False) -> PackedCase:
        """`token_outputs`: an embedder with its last hidden state as a second, per-token output."""
        key = (model, task, pooling, float16, token_outputs)
        if key not in self.cases:
            self.cases[key] = self._build(*key)
        return self.cases[key]

    def _build(self, model: str, task: str, pooling: str | None, float16: bool, token_outputs: bool) -> PackedCase:
        loader = AutoModel if task == "embed" else AutoModelForSequenceClassification
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hf = loader.from_pretrained(self.dirs[model], attn_implementation="eager").eval()
        reference = RepositoryModel(hf, task, pooling, token_outputs=token_outputs).eval()
        work = self.work / "_".join(str(k) for k in (model, task, pooling, float16, token_outputs))
        work.mkdir(parents=True)
        outputs = [output_name(task), TOKEN_EMBEDDINGS] if token_outputs else [output_name(task)]  # type: ignore[arg-type]
        export_onnx(reference, outputs, work / "raw.onnx", 17)
        config = hf.config
        optimize_for_onnxruntime(work / "raw.onnx", work / "optimized.onnx", config.num_attention_heads,
                                 config.hidden_size, float16=float16, multi_head_attention=True)
        gpu = packed_model(onnx.load(str(work / "optimized.onnx")), task=task, pooling=pooling,
                           num_heads=config.num_attention_heads, hidden_size=config.hidden_size,
                           offset=position_offset(config.model_type, config.pad_token_id))
        return PackedCase(reference, gpu, cpu_form(gpu), config.vocab_size, pairs=task != "embed",
                          optimized=work / "optimized.onnx")


@pytest.fixture(scope="session")
def packed_graphs(tiny_embedder_dir: Path, tiny_classifier_dir: Path, pair_model_dirs: dict[str, Path],
                  tiny_roberta_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> PackedGraphs:
    """`bert` (the mean-pooling embedder), `bert-classify` (3 labels), `bert-rerank` (1-logit pair cross-encoder),
    `xlmr` (XLM-R encoder), `xlmr-rerank` (XLM-R cross-encoder)."""
    dirs = {"bert": tiny_embedder_dir, "bert-classify": tiny_classifier_dir, "bert-rerank": pair_model_dirs["ce"],
            "xlmr": tiny_roberta_dirs["embed"], "xlmr-rerank": tiny_roberta_dirs["rerank"]}
    return PackedGraphs(dirs, tmp_path_factory.mktemp("packed_graphs"))
