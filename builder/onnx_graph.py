"""The graph of a build's ONNX step: onnxruntime's transformer optimizer (fused attention, fp16 where asked), then
the packed layout's rewrite where the step takes packed batches; else the plain export as it is."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort

from builder.errors import BuildError
from builder.exporting import Export
from builder.logs import Log, step
from builder.manifest import OnnxFacts
from builder.optimize import FUSED_OPS, onnx_op_counts, optimize_for_onnxruntime, publish_onnx, save_onnx
from builder.packing import PackedForm, PackingError, packed_model, position_offset
from builder.settings import ResolvedSettings


def write_onnx_graph(s: ResolvedSettings, export: Export, path: Path, log: Log) -> OnnxFacts:
    """Write the step's graph to `path`; what it is (optimized, precision, layout, ops) comes back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    facts = OnnxFacts()
    if s.onnx_optimize:
        _optimize(s, export, path, facts, log)
    if not facts.optimized:
        publish_onnx(export.raw_path, path)
    if s.layout == "packed":
        _pack_graph(s, path, export, log)
        facts.layout = "packed"
        facts.packed_form = "gpu" if s.device == "gpu" else "cpu"
        counts = onnx_op_counts(path)
        facts.fused_ops = {op: counts[op] for op in FUSED_OPS if op in counts}
        log(f"{s.name}: packed graph ({facts.packed_form} form): {facts.fused_ops}")
    facts.ops = onnx_op_counts(path)
    return facts


def _optimize(s: ResolvedSettings, export: Export, path: Path, facts: OnnxFacts, log: Log) -> None:
    """The optimizer's graph at `path`, noted in `facts`; where the optimizer fails, nothing (the plain export is
    published) but on a packed step, which needs its fused attention."""
    try:
        heads = int(getattr(export.config, "num_attention_heads", 0) or 0)
        hidden = int(getattr(export.config, "hidden_size", 0) or 0)
        with step(log, f"{s.name}: optimizing the ONNX graph ({s.onnx_precision})"):
            facts.fused_ops = optimize_for_onnxruntime(export.optimizer_input, path, heads, hidden,
                                                       float16=s.onnx_precision == "fp16",
                                                       multi_head_attention=s.layout == "packed")
        facts.optimized = True
        facts.precision = s.onnx_precision
        log(f"{s.name}: onnxruntime transformer optimizer fused {facts.fused_ops} ({facts.precision})")
        if not {"Attention", "MultiHeadAttention"} & set(facts.fused_ops):
            log(f"notice: {s.name}: onnxruntime {ort.__version__}'s optimizer fused no attention on this export; "
                "the model runs with unfused attention (onnxruntime 1.31 fuses it on BERT exports of transformers 5)")
    except Exception as exc:  # noqa: BLE001 - the optimizer raises anything; the plain export still works
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if s.layout == "packed":
            raise BuildError(f"{s.name}: onnxruntime's transformer optimizer failed ({reason}); the packed "
                             "layout needs its fused attention: build it with --layout padded") from None
        log(f"notice: {s.name}: onnxruntime's transformer optimizer failed ({reason}); publishing the plain export")


def _pack_graph(s: ResolvedSettings, path: Path, export: Export, log: Log) -> None:
    """Rewrite the optimized graph at `path` into the packed layout's (builder/packing.py): the GPU form on GPU
    builds, the CPU form on CPU builds. A graph the rewrite does not know is a build error."""
    config = export.config
    form: PackedForm = "gpu" if s.device == "gpu" else "cpu"
    with step(log, f"{s.name}: rewriting the graph into the packed layout ({form} form)"):
        try:
            model = packed_model(onnx.load(str(path)), task=s.task, pooling=s.pooling,
                                 num_heads=int(config.num_attention_heads), hidden_size=int(config.hidden_size),
                                 offset=position_offset(config.model_type, config.pad_token_id), form=form)
        except PackingError as exc:
            raise BuildError(f"{s.name}: the packed layout cannot be built for this graph ({exc}); build it with "
                             "--layout padded") from None
        save_onnx(model, path)
