"""Orchestration: plan every request, skip unchanged models, build the rest into staging, publish them together.

One model's build reads export -> ONNX graph -> parity -> int8 calibration (embed) -> TensorRT engine -> repository
entries; a failed parity check publishes nothing."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from builder import tensorrt_engine
from builder.calibration import calibrate
from builder.checks import check_names
from builder.entries import write_ensembles, write_onnx_step, write_tokenizer_entry, write_trt_step
from builder.exporting import export_model
from builder.logs import Log, stderr, step
from builder.manifest import Manifest, OnnxFacts, library_versions, python_version, write_manifest
from builder.onnx_graph import write_onnx_graph
from builder.onnx_parity import onnx_parity
from builder.parity import ParityResult, check, compare
from builder.plan import PlannedBuild, is_up_to_date, plan
from builder.publish import publish, staging_directory
from builder.settings import BuildRequest, ResolvedSettings
from builder.versions import next_version, stage_version
from contract import entry_names

__all__ = ["BuildOutcome", "PlannedBuild", "build_all", "build_one", "plan"]


@dataclass
class BuildOutcome:
    name: str
    entries: list[str]
    skipped: bool
    parity: list[ParityResult] = field(default_factory=list)
    seconds: float = 0.0
    version: int = 0  # the version directory it was published as (0: skipped)
    settings: ResolvedSettings | None = None  # what it was built for


def build_one(planned: PlannedBuild, staging: Path, log: Log) -> tuple[list[ParityResult], OnnxFacts]:
    """Write every entry of one model into `staging`; raise BuildError when parity fails."""
    s, entries = planned.settings, planned.entries
    write_tokenizer_entry(planned, staging / entries["tokenizer"])
    export = export_model(planned, staging, log)
    facts = OnnxFacts()
    results: list[ParityResult] = []
    graph, published = export.raw_path, False  # what calibrates the int8 ranges: the published graph where built
    if "onnx" in entries:
        onnx_dir = staging / entries["onnx"]
        graph, published = onnx_dir / "1" / "model.onnx", True
        facts = write_onnx_graph(s, export, graph, log)
        results += onnx_parity(s, graph, facts.precision, export.inputs, export.references, export.directory, log)
        write_onnx_step(planned, onnx_dir, export, facts)
    ranges = calibrate(s, planned.source.tokenizer, graph, published, export.width, export.directory, log) if (
        s.task == "embed") else {}
    if "trt" in entries:
        trt_dir = staging / entries["trt"]
        write_trt_step(planned, trt_dir, export)
        plan_path = trt_dir / "1" / "model.plan"
        with step(log, f"{s.name}: building the TensorRT FP16 engine (timing cache {planned.timing_cache})"):
            tensorrt_engine.build_engine(export.raw_path, plan_path, tensorrt_engine.profile_shapes(s),
                                         planned.timing_cache, s.trt_workspace_mib)
        with step(log, f"{s.name}: running trt_fp16 for the parity check"):
            trt_outputs = tensorrt_engine.run_engine(plan_path, export.inputs, s.output_name)
        results.append(compare("trt_fp16", s.task, export.references[0], trt_outputs, s.max_seq_len))
        if not s.skip_parity:
            check(results[-1], s.name, log)
    shutil.rmtree(export.directory)
    write_ensembles(s, staging, entries, export.width, ranges)
    return results, facts


def _manifest(planned: PlannedBuild, parity: list[ParityResult], facts: OnnxFacts, version: int) -> Manifest:
    s = planned.settings
    return Manifest(
        builder_version=__import__("builder").BUILDER_VERSION, fingerprint=planned.fingerprint, version=version,
        source=planned.source.identity(), settings=s,
        artifacts={role: name for role, name in planned.entries.items()},
        versions=library_versions(), python=python_version(),
        gpu=tensorrt_engine.gpu_name() if "trt" in s.formats else None,
        parity=parity, onnx=facts, built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def _stale_entries(repository: Path, planned: PlannedBuild) -> list[str]:
    """Existing entries of this NAME that the new build no longer produces (e.g. a dropped format)."""
    wanted = set(planned.entries.values())
    names = set(entry_names(planned.settings.name))
    return sorted(n for n in names - wanted if (repository / n).exists())


def build_all(requests: list[BuildRequest], repository: Path, log: Log = stderr,
              keep_versions: int = 2) -> list[BuildOutcome]:
    """Build every request into `repository`; all are published together, or none.

    Each model is published as a new version directory of all its entries, next to the newest
    `keep_versions - 1` versions before it (builder/versions.py); Triton switches on a `load`."""
    check_names(requests)
    notices: list[str] = []
    planned = [plan(request, notices) for request in requests]
    for notice in notices:
        log(notice)
    outcomes: list[BuildOutcome] = []
    todo = []
    for p in planned:
        if is_up_to_date(p, repository):
            outcomes.append(BuildOutcome(p.settings.name, list(p.entries.values()), skipped=True, settings=p.settings))
        else:
            todo.append(p)
    if not todo:
        return outcomes
    with staging_directory(repository) as staging:
        entries: list[str] = []
        stale: list[str] = []
        for p in todo:
            started = time.monotonic()
            parity, facts = build_one(p, staging, log)
            version = next_version(repository / e for e in entry_names(p.settings.name))
            manifest = _manifest(p, parity, facts, version)
            for entry in p.entries.values():
                write_manifest(staging / entry, manifest)
                stage_version(staging / entry, version, repository / entry, keep_versions)
            entries += p.entries.values()
            stale += _stale_entries(repository, p)
            outcomes.append(BuildOutcome(p.settings.name, list(p.entries.values()), skipped=False, parity=parity,
                                         seconds=time.monotonic() - started, version=version, settings=p.settings))
        with step(log, f"publishing {len(entries)} entries into {repository}"):
            publish(staging, repository, entries, stale)
    return outcomes
