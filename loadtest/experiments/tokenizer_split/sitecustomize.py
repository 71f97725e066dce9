"""Whether a large tokenizer call split over a few threads serves many-text requests better than one thread, without
the Rust pool's cost on small calls (issue 20's twenty-first pass: a 32-text request spends a third of its time
tokenizing on its worker's one thread; loadtest/results/h200-20ah-tokenizer-drain). Put this directory first on
PYTHONPATH with TOKENIZER_SPLIT_TEXTS=N, and every `TextEncoder.encode` of at least N texts is cut into
TOKENIZER_SPLIT_THREADS parts (default 4) encoded at once, one on the calling thread and the others on a small
pool of Python threads (the Rust tokenizer releases the GIL while it encodes), then joined in order:

    PYTHONPATH=loadtest/experiments/tokenizer_split:$PYTHONPATH TOKENIZER_SPLIT_TEXTS=16 python3 -m loadtest bench7 ...

Smaller calls, the drain's turns of ~8 single texts among them, run as before. Idle pool threads sleep on a queue;
they do not spin as the Rust pool's do. Python runs a `sitecustomize` in every process at start, the gateway's
spawned workers included; the patch is applied when contract.tokenization is first imported. Without
TOKENIZER_SPLIT_TEXTS (or 0) it does nothing.
"""

import itertools
import os
import runpy
from concurrent.futures import ThreadPoolExecutor

MIN_TEXTS = int(os.environ.get("TOKENIZER_SPLIT_TEXTS", "0") or 0)
PARTS = max(2, int(os.environ.get("TOKENIZER_SPLIT_THREADS", "4") or 4))
TARGET = "contract.tokenization"
# run by its path: no package of the checkout need be importable yet
ON_IMPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "_shared", "on_import.py")


def _join(module, results):
    """One EncodedTexts of the parts' results, in order (type ids: zeros for a part whose type ids were all 0)."""
    import numpy as np

    ids = [row for result in results for row in result.ids]
    types = None
    if any(result.type_ids is not None for result in results):
        types = [row for result in results
                 for row in (result.type_ids if result.type_ids is not None else [np.zeros_like(i) for i in result.ids])]
    return module.EncodedTexts(ids, types, np.concatenate([result.num_tokens for result in results]))


def _patch(module):
    encode = module.TextEncoder.encode
    pool = ThreadPoolExecutor(PARTS - 1, thread_name_prefix="tokenizer-split")

    def split_encode(self, texts, pairs=None, direction="right"):
        if len(texts) < MIN_TEXTS:
            return encode(self, texts, pairs, direction)
        bounds = [len(texts) * i // PARTS for i in range(PARTS + 1)]
        parts = [(texts[a:b], pairs[a:b] if pairs is not None else None) for a, b in itertools.pairwise(bounds)]
        others = [pool.submit(encode, self, part, part_pairs, direction) for part, part_pairs in parts[1:]]
        first = encode(self, parts[0][0], parts[0][1], direction)
        return _join(module, [first, *(other.result() for other in others)])

    module.TextEncoder.encode = split_encode


if MIN_TEXTS > 0:
    runpy.run_path(ON_IMPORT)["patch_on_import"](TARGET, _patch)
