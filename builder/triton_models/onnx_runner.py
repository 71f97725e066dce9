"""Triton python-backend model that runs model.onnx with onnxruntime (`--runtime python`).

Every row of every request of one execute() call is sorted by its real length (attention mask)
and the rows are cut into sub-batches under a token budget (config parameter `max_batch_tokens`),
each padded only to its own longest row, by `batching.py` (the repository copy of
contract/batching.py, the rule the gateway batches by), so a batch that mixes a 500-token
passage with short queries does not pad the queries to 500. When the config declares the shapes
batches take (`batch_widths`, `batch_rows`: GPU builds), sub-batches keep to them and every
shape runs once at load, since onnxruntime's CUDA provider spends ~50 ms on a shape's first run.
A batch the gateway formed (one request, already of a declared shape) runs as it came. With
`allow_ragged_batch` on the inputs (`--merge-buckets`) Triton's dynamic batcher merges requests
of any width into one execute() call.

A `layout: packed` step (docs/contract.md) runs packed_runner.py instead: its graph computes real
tokens only, and it takes packed requests (cu_seqlens) as well as padded ones.

A KIND_GPU instance runs on onnxruntime's CUDA execution provider or fails to load (never on the
CPU quietly); a KIND_CPU instance on the CPU provider. Inputs and outputs stay int32 / float32
whatever the graph computes in. Requests cancelled while they waited are not run (SkipCancelled).
"""

import json
import os
import sys
import time

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

# batching.py beside this file: the repository copy of contract/batching.py
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from batching import Shapes, parse_sizes, plan_batches
from cancellation import SkipCancelled

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# What one more onnxruntime call costs, in tokens of compute (contract/batching.py): on a GPU
# a call has a fixed cost of ~1-2 ms (about a thousand tokens of bert-base or more); on a CPU almost none.
CALL_COST_TOKENS = {"GPU": 1024, "CPU": 64}
# contract.CUDA_PROVIDER_OPTIONS (the builder's parity runs with the same): fp32 GEMMs in fp32, not TF32
CUDA_PROVIDER_OPTIONS = {"use_tf32": "0"}


def _cuda_session(path, options, device, provider_options=None):
    """An onnxruntime session on the CUDA provider, or an error: a KIND_GPU instance never runs on the CPU quietly."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise RuntimeError(f"KIND_GPU instance, but onnxruntime {ort.__version__} has no CUDA provider "
                           "(install onnxruntime-gpu, or build with --device cpu)")
    # onnxruntime 1.31 warns "No registered plugin EP device found for 'CUDAExecutionProvider' with
    # device_id=0" here and still runs on its built-in CUDA provider (seen on the H100 host).
    cuda = {**CUDA_PROVIDER_OPTIONS, **(provider_options or {}), "device_id": str(device)}
    providers = [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]
    session = ort.InferenceSession(path, sess_options=options, providers=providers)
    if session.get_providers()[0] != "CUDAExecutionProvider":
        raise RuntimeError(f"onnxruntime {ort.__version__} could not run model.onnx on CUDA device {device} "
                           f"(session providers {session.get_providers()})")
    return session


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = config.get("parameters", {})
        # the per-text output first, then per-token ones ([rows, tokens, ...]); a request gets what it asks for
        self.outputs = [output["name"] for output in config["output"]]
        options = ort.SessionOptions()
        threads = int(parameters.get("intra_op_num_threads", {}).get("string_value", "0") or 0)
        if threads > 0:
            options.intra_op_num_threads = threads
        packed = parameters.get("layout", {}).get("string_value", "padded") == "packed"
        if packed:
            # Nearly every packed call has a token count the session has not seen, and onnxruntime plans and caches
            # a memory pattern per input shape: on a GPU that made such calls much slower than with the pattern
            # off; its arena serves them.
            options.enable_mem_pattern = False
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        kind = "GPU" if args.get("model_instance_kind") == "GPU" else "CPU"
        device = int(args.get("model_instance_device_id", "0"))
        if kind == "GPU":
            self.session = _cuda_session(path, options, device)
        else:
            self.session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])
        self.max_tokens = int(parameters.get("max_batch_tokens", {}).get("string_value", "0") or 16384)
        self.call_cost_tokens = CALL_COST_TOKENS[kind]
        self.widths = parse_sizes(parameters.get("batch_widths", {}).get("string_value", ""))
        self.rows = parse_sizes(parameters.get("batch_rows", {}).get("string_value", ""))
        if packed:
            from packed_runner import PackedSteps  # copied next to this file for packed steps only

            def number(key):
                return int(parameters.get(key, {}).get("string_value", "0") or 0) or None

            fill = parameters.get("fill_tokens", {}).get("string_value", "")  # true/false; absent: on a GPU
            graphs = parameters.get("cuda_graphs", {}).get("string_value", "")  # false turns them off on a GPU
            graph_session = None
            if kind == "GPU" and graphs != "false":
                try:
                    graph_session = _cuda_session(path, options, device, {"enable_cuda_graph": "1"})
                except Exception as exc:  # noqa: BLE001 - e.g. a node off the CUDA provider: serve without graphs
                    pb_utils.Logger.log_warn(f"{args['model_name']}: no CUDA graphs: {str(exc).splitlines()[0][:300]}")
            steps = PackedSteps(self.session, self.outputs, self.max_tokens, number("max_seq_len"),
                                (number("vocab_size"), number("type_vocab_size")),
                                fill=fill == "true" or (not fill and kind == "GPU"), graph_session=graph_session,
                                device=device)
            warmed = steps.warm_up(gpu=kind == "GPU")
            self._execute = SkipCancelled(steps)
        else:
            warmed = self._warm_up()
            self._execute = SkipCancelled(self._infer)
        pb_utils.Logger.log_info(f"{args['model_name']}: onnxruntime {ort.__version__} on {self.session.get_providers()}, "
                                 f"{warmed}")

    def _warm_up(self):
        """Run every declared shape once (a shape's first run is slow on the CUDA provider)."""
        if not (self.widths and self.rows):
            return "no declared shapes"
        start = time.perf_counter()
        shapes = Shapes(self.widths[-1], self.widths, self.rows).warm_shapes(self.max_tokens)
        for rows, width in shapes:
            feed = {name: np.zeros((rows, width), np.int32) for name in INPUTS}
            feed["attention_mask"][:] = 1
            self._run(feed, self.outputs)
        return f"{len(shapes)} shapes warmed in {time.perf_counter() - start:.1f}s"

    def _run(self, feed, names=None):
        """The outputs `names` (default: the per-text one) of one onnxruntime call, in that order."""
        return self.session.run(names or self.outputs[:1], feed)

    def execute(self, requests):
        return self._execute(requests)

    def _requested(self, request):
        names = [n for n in request.requested_output_names() if n in self.outputs]
        return names or self.outputs[:1]

    def _infer(self, requests):
        inputs = [
            [pb_utils.get_input_tensor_by_name(r, name).as_numpy() for name in INPUTS] for r in requests
        ]
        wanted = [self._requested(r) for r in requests]
        names = [n for n in self.outputs if any(n in w for w in wanted)]
        lengths = np.concatenate([mask.sum(axis=1) for _, mask, _ in inputs])
        widest = max(ids.shape[1] for ids, _, _ in inputs)
        shapes = Shapes(self.widths[-1] if self.widths else widest, self.widths, self.rows)
        plan = plan_batches(lengths.tolist(), shapes, max_rows=len(lengths), max_tokens=self.max_tokens,
                            call_cost_tokens=self.call_cost_tokens)
        if len(inputs) == 1 and len(plan) == 1 and shapes.fit_rows(len(lengths)) == (len(lengths),) * 2:
            width = min(plan[0][1], widest)  # e.g. a batch the gateway formed: run it as it came
            feed = {name: np.ascontiguousarray(tensor[:, :width]) for name, tensor in zip(INPUTS, inputs[0])}
            outs = self._run(feed, names)
            return [pb_utils.InferenceResponse([pb_utils.Tensor(n, np.ascontiguousarray(o, dtype=np.float32))
                                                for n, o in zip(names, outs)])]
        sources = [(r, row) for r, (ids, _, _) in enumerate(inputs) for row in range(ids.shape[0])]
        results = {n: [None] * len(sources) for n in names}
        for members, width in plan:
            start = 0
            while start < len(members):
                take, run = shapes.fit_rows(len(members) - start)
                chunk = members[start:start + take]
                start += take
                feed = [np.zeros((run, width), dtype=np.int32) for _ in INPUTS]
                feed[1][take:, 0] = 1  # dummy rows up to a declared row count: one unmasked token each
                for k, index in enumerate(chunk):
                    r, row = sources[index]
                    cols = min(width, inputs[r][0].shape[1])
                    for tensor, source in zip(feed, inputs[r]):
                        tensor[k, :cols] = source[row, :cols]
                outs = self._run(dict(zip(INPUTS, feed)), names)
                for n, out in zip(names, outs):
                    for k, index in enumerate(chunk):
                        results[n][index] = out[k]
        responses, start = [], 0
        for (ids, _, _), want in zip(inputs, wanted):
            rows, tensors = ids.shape[0], []
            for n in want:
                part = results[n][start:start + rows]
                if n != self.outputs[0]:  # per token: each row back to the request's own width
                    part = [_to_width(row, ids.shape[1]) for row in part]
                out = np.stack(part).astype(np.float32, copy=False)
                tensors.append(pb_utils.Tensor(n, np.ascontiguousarray(out)))
            start += rows
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses


def _to_width(row, width):
    """A per-token output row [tokens, ...] cut or zero-padded to `width` tokens (its real tokens fit in both)."""
    if row.shape[0] >= width:
        return row[:width]
    padded = np.zeros((width, *row.shape[1:]), dtype=row.dtype)
    padded[:row.shape[0]] = row
    return padded
