"""Random-weight BERT checkpoints for benchmarks (no model hub): a word-level WordPiece vocab
that covers the corpus, and a BertConfig of the chosen shape, saved with save_pretrained.

`small` is the 2-core CI machine's benchmark model; `base` is the bert-base shape
(hidden 768, 12 layers, 12 heads, 3072 FFN) for the GPU host; `large` is bge-m3's encoder shape
(XLM-RoBERTa large: hidden 1024, 24 layers, 16 heads, 4096 FFN). Only the vocabulary is
smaller than the real models', which changes the embedding table, not the compute.
`heads=True` adds bge-m3's FlagEmbedding heads (`sparse_linear.pt`, `colbert_linear.pt`) and its
sentence-transformers modules (CLS pooling, Normalize), so the builder serves its dense, lexical
and ColBERT outputs.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel

from loadtest.corpus import NON_ASCII, WORDS

Task = Literal["classify", "embed"]


class BertShape(BaseModel):
    hidden: int
    layers: int
    heads: int
    intermediate: int
    max_positions: int = 512


SHAPES: dict[str, BertShape] = {
    "tiny": BertShape(hidden=32, layers=2, heads=2, intermediate=64),
    "small": BertShape(hidden=128, layers=2, heads=2, intermediate=512),
    # heavy enough on the 2-core CI machine that Triton, not the gateway, is the bottleneck (overload tests)
    "medium": BertShape(hidden=256, layers=6, heads=4, intermediate=1024, max_positions=128),
    "base": BertShape(hidden=768, layers=12, heads=12, intermediate=3072),
    "large": BertShape(hidden=1024, layers=24, heads=16, intermediate=4096),
}


def vocabulary() -> list[str]:
    """Specials, the corpus words, and every character (plain and ## continuation) it uses."""
    chars = sorted(set(string.ascii_letters + string.digits + string.punctuation + "".join(NON_ASCII)))
    words = sorted(set(WORDS) | {w.lower() for w in NON_ASCII if w.isascii() is False and len(w) > 1})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words + chars + [f"##{c}" for c in chars]
    seen: set[str] = set()
    return [t for t in vocab if not (t in seen or seen.add(t))]


def make_bert(path: Path, task: Task, shape: str = "small", num_labels: int = 3, seed: int = 0,
              heads: bool = False) -> Path:
    """Save a random BERT (+ fast tokenizer) for `task` under `path`; return `path`. `heads`: an embedder with
    bge-m3's FlagEmbedding heads and sentence-transformers modules."""
    import torch
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        BertModel,
        BertTokenizerFast,
    )

    path.mkdir(parents=True, exist_ok=True)
    vocab_file = path / "vocab.txt"
    vocab = vocabulary()
    vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True, strip_accents=False,
                                  model_max_length=SHAPES[shape].max_positions)
    s = SHAPES[shape]
    config = BertConfig(vocab_size=len(vocab), hidden_size=s.hidden, num_hidden_layers=s.layers,
                        num_attention_heads=s.heads, intermediate_size=s.intermediate,
                        max_position_embeddings=s.max_positions, num_labels=num_labels,
                        id2label={i: f"label_{i}" for i in range(num_labels)},
                        label2id={f"label_{i}": i for i in range(num_labels)})
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config) if task == "classify" else BertModel(config, add_pooling_layer=False)
    model.eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if heads and task == "embed":
        _add_flag_heads(path, s.hidden)
    return path


def _add_flag_heads(path: Path, hidden: int) -> None:
    """bge-m3's layout: sparse_linear.pt (Linear(hidden, 1)), colbert_linear.pt (Linear(hidden, hidden)), and
    sentence-transformers modules for CLS pooling and Normalize."""
    import json

    import torch

    torch.save(torch.nn.Linear(hidden, 1).state_dict(), path / "sparse_linear.pt")
    torch.save(torch.nn.Linear(hidden, hidden).state_dict(), path / "colbert_linear.pt")
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (path / "modules.json").write_text(json.dumps(modules, indent=2))
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "2_Normalize").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": hidden, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))


def main(argv: list[str] | None = None) -> int:
    """`python -m loadtest random-model DIR TASK [SHAPE]`: write a random BERT checkpoint; usage on no arguments."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m loadtest random-model",
        description="Write a random-weight BERT checkpoint (+ fast tokenizer) that the builder takes as a local "
                    "model path (no hub needed).",
    )
    parser.add_argument("dir", type=Path, help="output directory (created)")
    parser.add_argument("task", choices=get_args(Task), help="classify: a 3-label sequence classifier; embed: an encoder")
    parser.add_argument("shape", nargs="?", default="small", choices=list(SHAPES),
                        help="model shape (default small; base is the bert-base shape, large bge-m3's)")
    parser.add_argument("--heads", action="store_true",
                        help="embed: add bge-m3's sparse and ColBERT heads (CLS pooling, Normalize)")
    args = parser.parse_args(argv)
    make_bert(args.dir, args.task, args.shape, heads=args.heads)
    print(args.dir)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
