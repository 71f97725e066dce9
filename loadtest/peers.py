"""In-process peers on the same model and corpus, one Python process, no server (benchmark 7).

    python -m loadtest.peers --model DIR [--corpus-size 4000] [--batch-size 256] [--repeats 3]

- sentence-transformers `encode(batch_size=256)` in fp16 (it sorts the texts by length itself);
- Hugging Face `AutoModel` with SDPA attention in fp16, written as a careful user would: the corpus
  tokenized once, sorted by length, batches of `--batch-size` padded to their longest text, mean
  pooling, results kept on the GPU until one copy at the end.
Whole corpus, tokenization included, best of `--repeats` after one warm-up pass. Prints one JSON
line `PEERS {...}` with texts/s and seconds per system.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from loadtest.corpus import CorpusSpec, make_corpus


def _best(run: object, repeats: int) -> float:
    run()  # type: ignore[operator]  # warm-up: CUDA kernels, allocator, tokenizer caches
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()  # type: ignore[operator]
        best = min(best, time.perf_counter() - t0)
    return best


def sentence_transformers_encode(model_dir: Path, texts: list[str], batch_size: int, repeats: int) -> float:
    """Seconds for `SentenceTransformer.encode` over `texts` (fp16, mean pooling)."""
    import torch
    from sentence_transformers import SentenceTransformer, models

    word = models.Transformer(str(model_dir), max_seq_length=512)
    pooling = models.Pooling(word.get_word_embedding_dimension(), "mean")
    model = SentenceTransformer(modules=[word, pooling], device="cuda" if torch.cuda.is_available() else "cpu")
    if torch.cuda.is_available():
        model.half()

    def run() -> None:
        model.encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)

    return _best(run, repeats)


def hf_sorted_batches(model_dir: Path, texts: list[str], batch_size: int, repeats: int) -> float:
    """Seconds for HF BertModel (SDPA, fp16) over `texts`, written as a careful user would: the corpus
    tokenized once (one fast-tokenizer call), sorted by length, batches of `batch_size` padded to their
    longest row and copied to the GPU asynchronously, mean pooling, every result kept on the GPU until
    one copy to the host at the end."""
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, attn_implementation="sdpa", dtype=dtype).to(device).eval()
    pad = tokenizer.pad_token_id or 0

    def run() -> None:
        encoded = tokenizer(texts, truncation=True, max_length=512)
        ids, types = encoded["input_ids"], encoded.get("token_type_ids")
        order = sorted(range(len(texts)), key=lambda i: len(ids[i]))
        pooled = torch.empty(len(texts), model.config.hidden_size, dtype=dtype, device=device)
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                width = len(ids[rows[-1]])
                host_ids = np.full((len(rows), width), pad, dtype=np.int64)
                host_types = np.zeros((len(rows), width), dtype=np.int64)
                host_mask = np.zeros((len(rows), width), dtype=np.int64)
                for k, i in enumerate(rows):
                    n = len(ids[i])
                    host_ids[k, :n] = ids[i]
                    host_mask[k, :n] = 1
                    if types is not None:
                        host_types[k, :n] = types[i]
                batch = {name: torch.from_numpy(a).pin_memory().to(device, non_blocking=True) if device == "cuda"
                         else torch.from_numpy(a)
                         for name, a in (("input_ids", host_ids), ("attention_mask", host_mask),
                                         ("token_type_ids", host_types))}
                hidden = model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                index = torch.tensor(rows, device=device)
                pooled.index_copy_(0, index, (hidden * mask).sum(1) / mask.sum(1).clamp(min=1))
        pooled.float().cpu()  # one copy (and the one synchronisation) at the end

    return _best(run, repeats)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.peers", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--corpus-size", type=int, default=4000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    texts = make_corpus(CorpusSpec(size=args.corpus_size))
    out = {}
    for name, fn in (("sentence-transformers encode", sentence_transformers_encode),
                     ("HF SDPA careful", hf_sorted_batches)):
        seconds = fn(args.model, texts, args.batch_size, args.repeats)
        out[name] = {"seconds": seconds, "texts_per_s": len(texts) / seconds, "batch_size": args.batch_size}
        print(f"{name}: {len(texts) / seconds:.0f} texts/s", file=sys.stderr, flush=True)
    print("PEERS " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
