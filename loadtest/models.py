"""Random-weight BERT checkpoints for benchmarks (no model hub): a word-level WordPiece vocab
that covers the corpus, and a BertConfig of the chosen shape, saved with save_pretrained.

`small` is the 2-core CI machine's benchmark model; `base` is the bert-base shape
(hidden 768, 12 layers, 12 heads, 3072 FFN) for the GPU host. Only the vocabulary is
smaller than bert-base's 30522 entries, which changes the embedding table, not the compute.
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
}


def vocabulary() -> list[str]:
    """Specials, the corpus words, and every character (plain and ## continuation) it uses."""
    chars = sorted(set(string.ascii_letters + string.digits + string.punctuation + "".join(NON_ASCII)))
    words = sorted(set(WORDS) | {w.lower() for w in NON_ASCII if w.isascii() is False and len(w) > 1})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words + chars + [f"##{c}" for c in chars]
    seen: set[str] = set()
    return [t for t in vocab if not (t in seen or seen.add(t))]


def make_bert(path: Path, task: Task, shape: str = "small", num_labels: int = 3, seed: int = 0) -> Path:
    """Save a random BERT (+ fast tokenizer) for `task` under `path`; return `path`."""
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
    return path


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
                        help="model shape (default small; base is the bert-base shape)")
    args = parser.parse_args(argv)
    make_bert(args.dir, args.task, args.shape)
    print(args.dir)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
