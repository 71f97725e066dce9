"""Why deep random-weight encoders fail the builder's GPU parity (issue 23's open finding), GPU host.

h100-23-long-context: a base-shape ModernBERT (22 layers) built for the GPU fails the builder's parity
(fp16 0.974, fp32 0.996 min cosine against PyTorch fp32), and an XLM-R large (24 layers, bge-m3 shape)
fp16 build 0.961, while bert-base passes at 0.9999993. This separates what the model is from what
onnxruntime does, on the builder's own parity sentences, per sentence and per layer:

- PyTorch itself on the GPU (fp32 with TF32 off and on, fp16, bf16) against PyTorch fp32 on the CPU: if
  PyTorch's own fp16 diverges as much, the random model amplifies rounding (no onnxruntime bug);
- the builder end to end (`--device gpu`, fp16 and fp32), with onnxruntime's CUDA `use_tf32` on (its
  default) and off, the parity the builder reports.

    python3 -m loadtest.experiments.deep_parity --out DIR [--models bert-base,modernbert-base,xlmr-large]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from builder.errors import BuildError  # noqa: E402
from builder.parity import SENTENCES, parity_inputs  # noqa: E402
from loadtest.long_context_load import BASE_SIZES  # noqa: E402
from loadtest.machine import describe_machine  # noqa: E402
from loadtest.models import make_bert  # noqa: E402
from tests.fixtures.repository import build_repository  # noqa: E402
from tests.fixtures.tiny_models import write_tiny_modernbert, write_tiny_xlmr  # noqa: E402

MAX_SEQ_LEN = 512
MODELS: dict[str, Callable[[Path], Path]] = {
    "bert-base": lambda d: make_bert(d, "embed", shape="base"),
    "modernbert-base": lambda d: write_tiny_modernbert(d, **BASE_SIZES["modernbert-8k"]),
    "xlmr-large": lambda d: write_tiny_xlmr(d, "bge-m3", **BASE_SIZES["xlmr-8k (bge-m3 shape)"]),
}
SMOKE: dict[str, Callable[[Path], Path]] = {"bert-base": lambda d: make_bert(d, "embed"),
                                            "modernbert-base": write_tiny_modernbert,
                                            "xlmr-large": lambda d: write_tiny_xlmr(d, "bge-m3")}


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-30)


def _mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(np.float64)
    return (hidden * m).sum(1) / np.maximum(m.sum(1), 1)


def torch_variants(folder: Path, device: str = "cuda") -> dict[str, Any]:
    """Per-sentence cosine of mean-pooled last hidden states, and per-layer min token cosine, of PyTorch on the
    GPU in each precision against PyTorch fp32 on the CPU."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    feed = parity_inputs(tokenizer, MAX_SEQ_LEN)
    mask = feed["attention_mask"]

    def run(device: str, dtype: torch.dtype, tf32: bool) -> list[np.ndarray]:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        model = AutoModel.from_pretrained(folder, torch_dtype=dtype, attn_implementation="sdpa").to(device).eval()
        inputs = {k: torch.from_numpy(v.astype(np.int64)).to(device) for k, v in feed.items()
                  if k in ("input_ids", "attention_mask")}
        with torch.inference_mode():
            out = model(**inputs, output_hidden_states=True)
        hidden = [h.float().cpu().numpy().astype(np.float64) for h in out.hidden_states]
        del model
        torch.cuda.empty_cache()
        return hidden

    reference = run("cpu", torch.float32, False)
    rows: dict[str, Any] = {}
    for name, dtype, tf32 in (("cuda fp32, TF32 off", torch.float32, False), ("cuda fp32, TF32 on", torch.float32, True),
                              ("cuda fp16", torch.float16, False), ("cuda bf16", torch.bfloat16, False)):
        if device == "cpu" and dtype == torch.float16:
            continue  # --smoke: half precision kernels of the CPU are not what the GPU runs
        hidden = run(device, dtype, tf32)
        pooled = _cos(_mean_pool(hidden[-1], mask), _mean_pool(reference[-1], mask))
        layers = [float(_cos(h, r)[mask.astype(bool)].min()) for h, r in zip(hidden, reference)]
        rows[name] = {"per_sentence": [round(float(c), 7) for c in pooled], "min": float(pooled.min()),
                      "per_layer_min_token_cosine": [round(c, 6) for c in layers]}
    rows["tokens_per_sentence"] = mask.sum(1).tolist()
    norms = [float(np.linalg.norm(h[mask.astype(bool)], axis=-1).max()) for h in reference]
    rows["reference_max_token_norm_per_layer"] = [round(n, 2) for n in norms]
    return rows


@contextlib.contextmanager
def ort_tf32(enabled: bool) -> Iterator[None]:
    """onnxruntime sessions made meanwhile get CUDA's use_tf32 set as given."""
    import onnxruntime as ort

    original = ort.InferenceSession

    def session(path: Any, sess_options: Any = None, providers: Any = None, **kw: Any) -> Any:
        providers = [(p, {"use_tf32": "1" if enabled else "0"}) if p == "CUDAExecutionProvider" else
                     ((p[0], {**p[1], "use_tf32": "1" if enabled else "0"}) if isinstance(p, tuple) and
                      p[0] == "CUDAExecutionProvider" else p) for p in (providers or [])]
        return original(path, sess_options=sess_options, providers=providers, **kw)

    ort.InferenceSession = session  # type: ignore[misc]
    try:
        yield
    finally:
        ort.InferenceSession = original  # type: ignore[misc]


def builder_variants(folder: Path, work: Path, device: str = "gpu") -> dict[str, str]:
    """The builder's own parity line, per precision and TF32 setting (`--device gpu`, python runtime)."""
    rows: dict[str, str] = {}
    work.mkdir(parents=True, exist_ok=True)
    for precision, tf32 in (("fp16", True), ("fp32", True), ("fp32", False)):
        name = f"builder onnx {precision}, onnxruntime use_tf32 {'on' if tf32 else 'off'}"
        repository = work / f"repo-{precision}-{int(tf32)}"
        started = time.perf_counter()
        try:
            with ort_tf32(tf32):
                outcomes = build_repository(repository, [{"model": str(folder), "task": "embed", "name": "m"}],
                                            runtime="python", formats="onnx", device=device,
                                            onnx_precision=precision, max_seq_len=MAX_SEQ_LEN, max_batch_size=8)
            rows[name] = "; ".join(r.summary() for o in outcomes for r in o.parity)
        except BuildError as exc:
            rows[name] = f"refused: {exc}"
        except Exception as exc:  # noqa: BLE001 - recorded, the other variants still run
            rows[name] = f"failed: {type(exc).__name__}: {str(exc)[:400]}"
        rows[name] += f" ({time.perf_counter() - started:.0f} s)"
        print(name, "->", rows[name][-300:], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.experiments.deep_parity", description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--skip-builder", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny models, every variant on the CPU (a check of this script)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    record: dict[str, Any] = {"machine": describe_machine().model_dump(), "sentences": list(SENTENCES), "max_seq_len": MAX_SEQ_LEN,
                              "torch": torch.__version__, "models": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            folder = (SMOKE if args.smoke else MODELS)[name](Path(tmp) / name)
            row: dict[str, Any] = {"torch": torch_variants(folder, "cpu" if args.smoke else "cuda")}
            print(name, json.dumps({k: v["min"] for k, v in row["torch"].items() if isinstance(v, dict)}), flush=True)
            if not args.skip_builder:
                row["builder"] = builder_variants(folder, Path(tmp) / f"{name}-work", "cpu" if args.smoke else "gpu")
            record["models"][name] = row
            (args.out / "results.json").write_text(json.dumps(record, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
