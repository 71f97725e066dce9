"""The builder's output: its progress lines, and third-party chatter (progress bars, load reports, warnings) kept
out of it."""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def quiet_libraries() -> None:
    """Silence transformers/huggingface_hub progress bars and info logs; keep errors."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)


Log = Callable[[str], None]


def stderr(message: str) -> None:
    """The build's progress, on stderr (stdout carries the command's result)."""
    print(message, file=sys.stderr, flush=True)


@contextmanager
def step(log: Log, what: str) -> Iterator[None]:
    """Log `what ...` when a long step starts and `what done in 1.2s` when it ends (nothing when it raises)."""
    log(f"{what} ...")
    started = time.monotonic()
    yield
    log(f"{what} done in {time.monotonic() - started:.1f}s")
