"""Command line: `python -m builder build (--model M --task T --name N | --spec FILE) --repository DIR [options]`."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn, get_args

from pydantic import ValidationError

from builder import summary
from builder.checks import check_requests
from builder.errors import BuildError, UsageError
from builder.machine import nvidia_gpus
from builder.settings import BuildRequest, Device, Format, Pooling, Precision, Runtime
from builder.spec import format_validation_error, load_spec
from contract import TASKS, Layout, OnnxAccelerator


def _choices(literal: Any) -> list[str]:
    """The values of a `Literal[...]` type, for argparse `choices=` (shown by --help, checked at parse time)."""
    return [str(value) for value in get_args(literal)]

# Options shared by the CLI and spec entries (field name -> argparse keyword arguments).
_MODEL_OPTIONS: dict[str, dict[str, Any]] = {
    "model": {"help": "hub id or local directory"},
    "task": {"choices": list(TASKS), "help": "what the model does (rerank: a cross-encoder scoring text pairs; "
             "sparse-embed: a SPLADE SparseEncoder or masked LM)"},
    "name": {"help": "NAME of the repository entries (NAME_onnx, NAME_onnx_ensemble, ...)"},
    "revision": {"help": "hub revision (branch, tag or commit)"},
    "formats": {"metavar": ",".join(_choices(Format)),
                "help": f"comma list of {', '.join(_choices(Format))} (default: onnx,trt when TensorRT is "
                        "importable, else onnx)"},
    "max_seq_len": {"type": int, "help": "default min(model limit, 512)"},
    "max_batch_size": {"type": int, "help": "default 64"},
    "device": {"choices": _choices(Device), "help": "instance kind of the model step (default gpu)"},
    "runtime": {"choices": _choices(Runtime),
                "help": "native: onnxruntime/tensorrt backends; python: python-backend onnxruntime runner "
                        "(default native)"},
    "pooling": {"choices": _choices(Pooling),
                "help": "embed (default from the sentence-transformers Pooling config, else mean)"},
    "labels": {"help": "classify, rerank: comma list of label names (default config.id2label)"},
    "score_label": {"help": "rerank: label NAME or INDEX whose logit scores relevance (default: the only logit, or "
                    "the one label named relevant/relevance/entailment/yes/true/positive)"},
    "default_prompt_name": {"help": "embed: the prompt used when a request names none (default from "
                            "config_sentence_transformers.json)"},
    "matryoshka_dims": {"help": "embed: comma list of dimensions requests may truncate to (default "
                        "config.matryoshka_dimensions)"},
    "calibration_texts": {"metavar": "FILE",
                          "help": "embed: UTF-8 texts, one per line, that calibrate the int8/uint8 ranges served by "
                                  "the gateway (default: the builder's multilingual set, builder/calibration_texts.txt)"},
    "length_buckets": {"help": "tokenizer padding buckets (default 16,32,64,128,256,512); one bucket = max-seq-len pads all"},
    "max_queue_delay_us": {"type": int, "help": "dynamic batcher queue delay of every model in microseconds "
                           "(default: 100 for the tokenizer, 0 for model steps)"},
    "preferred_batch_sizes": {"help": "comma list (default powers of two up to max-batch-size)"},
    "queue_timeout_ms": {"type": int, "help": "dynamic batcher queue policy: reject a request still queued after "
                         "this long (default 0 = no policy; see builder/README.md before turning it on)"},
    "max_queue_size": {"type": int, "help": "dynamic batcher queue policy: requests queued per model before new "
                       "ones are rejected at once (default 0 = unbounded, no policy)"},
    "instances": {"type": int, "help": "instance count of the model step (default: 4 python runtime on a GPU, "
                  "2 native on a GPU, 1 on a CPU)"},
    "tokenizer_instances": {"type": int, "help": "instance count of the tokenizer (default: 4 on a GPU, 1 on a CPU)"},
    "onnx_threads": {"type": int, "help": "onnxruntime intra-op threads per instance (default 0 = onnxruntime's choice)"},
    "opset": {"type": int, "help": "ONNX opset (default 17)"},
    "onnx_precision": {"choices": _choices(Precision),
                       "help": "precision of the published model.onnx (default fp16 with --device gpu, else fp32)"},
    "onnx_accelerator": {"choices": _choices(OnnxAccelerator),
                         "help": "how Triton's onnxruntime backend runs the onnx step: tensorrt (ONNX Runtime's TensorRT "
                                 "provider: engines compiled at load, cached in --onnx-trt-cache), cuda (CUDA provider "
                                 "with tuned options) or none (default cuda with --device gpu --runtime native, else "
                                 "none, the only choice there)"},
    "onnx_trt_cache": {"metavar": "DIR",
                       "help": "--onnx-accelerator tensorrt: engine cache directory inside the Triton container, on a "
                               "writable volume (default /cache/ort-trt, compose volume ort_trt_cache)"},
    "max_batch_tokens": {"type": int, "help": "python runtime: token budget of one onnxruntime call (default 16384)"},
    "batch_widths": {"help": "comma list of padded widths the model step's batches take, ending with max-seq-len "
                     "(default with --device gpu: 8..64 by 8, ..128 by 16, ..256 by 32, ..512 by 64; none on CPU)"},
    "batch_rows": {"help": "comma list of row counts the batches take, ending with max-batch-size "
                   "(default with --device gpu: powers of two; none on CPU)"},
    "layout": {"choices": _choices(Layout),
               "help": "the onnx step's layout: packed (its graph computes real tokens only, rows back to back with "
                       "cu_seqlens; takes packed and padded requests) or padded (default packed with --runtime python "
                       "--device gpu for BERT/RoBERTa/XLM-R models, else padded; --runtime python only)"},
    "trt_opt_batch_size": {"type": int, "help": "TensorRT profile opt batch (default min(8, max-batch-size))"},
    "trt_workspace_mib": {"type": int, "help": "TensorRT workspace limit (default 4096)"},
    "trt_timing_cache": {"help": "TensorRT timing cache file reused across builds"},
}


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one `error:` line on stderr (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see --help)\n")


def _prompt(value: str) -> tuple[str, str]:
    """`--prompt NAME=TEXT` (TEXT may be empty and keeps its spaces)."""
    name, sep, text = value.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"--prompt {value!r} is not NAME=TEXT")
    return name.strip(), text


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="python -m builder", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    build = commands.add_parser(
        "build", help="build models into a Triton model repository",
        epilog="exit status: 0 built or up to date; 1 build error (the model cannot be found or loaded, parity "
               "failed, ...); 2 usage error (bad or missing options, bad spec file)")
    build.add_argument("--repository", required=True, type=Path, help="model repository directory")
    build.add_argument("--spec", type=Path, help="YAML spec file listing several models")
    for field_name, kwargs in _MODEL_OPTIONS.items():
        build.add_argument("--" + field_name.replace("_", "-"), dest=field_name, default=None, **kwargs)
    build.add_argument("--no-dynamic-batching", dest="dynamic_batching", action="store_const", const=False,
                       default=None, help="disable Triton's dynamic batcher on the tokenizer and model steps")
    build.add_argument("--no-onnx-optimize", dest="onnx_optimize", action="store_const", const=False, default=None,
                       help="publish the plain export instead of onnxruntime's transformer-optimizer output")
    build.add_argument("--merge-buckets", dest="merge_buckets", action="store_const", const=True, default=None,
                       help="python runtime: batch requests of different widths together (the runner sorts the rows "
                            "by length and pads sub-batches to their own longest); default on with --device gpu")
    build.add_argument("--no-merge-buckets", dest="merge_buckets", action="store_const", const=False, default=None,
                       help="keep each length bucket in batches of its own")
    build.add_argument("--pairs", dest="pairs", action="store_const", const=True, default=None,
                       help="classify: the model takes sentence pairs (inputs text and text_pair); rerank always does")
    build.add_argument("--prompt", dest="prompts", action="append", type=_prompt, default=None, metavar="NAME=TEXT",
                       help="embed, repeatable: a prompt TEXT prepended to inputs that ask for NAME (adds to and "
                            "overrides the model's config_sentence_transformers.json prompts)")
    build.add_argument("--no-warmup", dest="warmup", action="store_const", const=False, default=None,
                       help="write no model_warmup samples (default: the tokenizer gets a sample text, each model "
                            "step a short row and a max-batch x max-seq-len batch, run by Triton at load)")
    build.add_argument("--skip-parity", dest="skip_parity", action="store_const", const=True, default=None,
                       help="record parity numbers but publish even when they fail")
    build.add_argument("--keep-versions", type=int, default=2, metavar="N",
                       help="version directories kept per entry, the new one included (default 2: the one served "
                            "before stays for `serve --version` rollbacks); older ones are removed")
    serve = commands.add_parser(
        "serve", help="choose which published version Triton serves (takes effect on the next load/reload)",
        epilog="exit status: 0 done; 2 usage error (no such model or version)")
    serve.add_argument("--repository", required=True, type=Path, help="model repository directory")
    serve.add_argument("--name", required=True, help="model NAME (all its entries)")
    serve.add_argument("--version", required=True, type=_served_version, metavar="N|latest",
                       help="a version directory every entry holds (policy `specific`), or `latest`")
    return parser


def _served_version(text: str) -> int | None:
    if text == "latest":
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a version number or `latest`, not {text!r}")
    return int(text)




def requests_from_args(args: argparse.Namespace) -> list[BuildRequest]:
    """Build requests from `--spec` (CLI options given too override every entry) or from the CLI options alone."""
    flags = ("dynamic_batching", "skip_parity", "onnx_optimize", "merge_buckets", "pairs", "prompts", "warmup")
    options = {k: v for k, v in vars(args).items() if k in _MODEL_OPTIONS or k in flags}
    given = {k: v for k, v in options.items() if v is not None}
    if "prompts" in given:
        given["prompts"] = dict(given["prompts"])
    if args.spec is not None:
        if {"model", "task", "name"} & set(given):
            raise UsageError("--spec cannot be combined with --model/--task/--name")
        requests = load_spec(args.spec)
        try:
            return [BuildRequest.model_validate({**r.model_dump(exclude_unset=True), **given}) for r in requests]
        except ValidationError as exc:
            raise UsageError(format_validation_error(exc, "bad option")) from None
    missing = [f"--{k}" for k in ("model", "task", "name") if k not in given]
    if missing:
        raise UsageError(f"missing {', '.join(missing)} (or give --spec FILE)")
    try:
        return [BuildRequest.model_validate(given)]
    except ValidationError as exc:
        raise UsageError(format_validation_error(exc, "bad option")) from None


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 1 build error, 2 usage error).

    Options, the spec file and local model directories are checked before torch, transformers and
    onnxruntime are imported (seconds), so that a mistake is refused at once. The last lines say what each
    model was built for, warn when this machine cannot serve it, and give the whole command's time.
    """
    started = time.monotonic()
    args = _parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    try:
        if args.keep_versions < 1:
            raise UsageError("--keep-versions must be at least 1")
        requests = requests_from_args(args)
        check_requests(requests)
        from builder.logs import quiet_libraries

        quiet_libraries()
        from builder.build import build_all

        outcomes = build_all(requests, args.repository, keep_versions=args.keep_versions)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for outcome in outcomes:
        print(summary.outcome_line(outcome))
    for warning in summary.warnings(outcomes, nvidia_gpus()):
        print(warning, file=sys.stderr)
    print(summary.last_line(outcomes, args.repository, summary.command_seconds(started)), flush=True)
    return 0


def _serve(args: argparse.Namespace) -> int:
    """Rewrite the version policy of every entry of one model (each config replaced atomically)."""
    from google.protobuf import text_format

    from builder.configs import read_config
    from builder.versions import check_servable, set_policy, set_version_ranges
    from contract import entry_names

    entries = [args.repository / n for n in entry_names(args.name) if (args.repository / n / "config.pbtxt").is_file()]
    try:
        if not entries:
            raise UsageError(f"no model {args.name!r} in {args.repository}")
        if args.version is not None:
            check_servable(entries, args.version)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for entry in entries:
        config = read_config(entry / "config.pbtxt")
        set_policy(config, args.version)
        set_version_ranges(config, entry, args.version)
        staged = entry / ".config.pbtxt.new"
        staged.write_text(text_format.MessageToString(config))
        os.replace(staged, entry / "config.pbtxt")
    which = "the latest version" if args.version is None else f"version {args.version}"
    print(f"{args.name}: {', '.join(e.name for e in entries)} now serve {which} (reload the model to apply)")
    return 0
