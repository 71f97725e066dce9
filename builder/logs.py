"""Keep third-party chatter (progress bars, load reports, warnings) out of the builder's output."""

from __future__ import annotations

import logging
import os
import warnings


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
