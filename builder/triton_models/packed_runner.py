"""The python runner of a `layout: packed` model step (docs/contract.md "Packed model steps").

Its graph (builder/packing.py) takes rows back to back: input_ids and token_type_ids [T], cu_seqlens
[rows + 1], and the index tensors computed here from cu_seqlens (contract/packing.py). A request is one
of two kinds (Triton batches the two apart: their sets of inputs differ, and the step has optional
inputs):
- padded ([rows, width] input_ids, attention_mask, token_type_ids; the ensembles send these): packed
  here on the host from the attention mask;
- packed (input_ids, token_type_ids [1, T]; cu_seqlens [1, rows + 1]; the gateway's scheduler).
Each request is checked on its own first (packing.py, the repository copy of contract/packing.py):
one that breaks the contract gets an error response naming what is wrong, before anything runs, and
the others still run. The rows of every valid request are merged in arrival order and cut into runs
of at most `max_batch_tokens` real tokens (no padding, so no sorting by length); each run gets its
own index tensors (token_offset as wide as its longest row); the output rows go back to their
requests, [rows, out] each. Per-token outputs (embed models: token_embeddings, ...) go back as [T, ...]
to a packed request (its tokens back to back) and as [rows, width, ...] to a padded one (each row's
tokens, then zeros), as a padded step returns them.
"""

import time

import numpy as np
import triton_python_backend_utils as pb_utils
from packing import (
    CU_SEQLENS,
    INPUT_IDS,
    TOKEN_TYPE_IDS,
    PackedRows,
    PackingError,
    check_ids,
    concat,
    cu_seqlens_of,
    cut_runs,
    fill_sizes,
    filled_tokens,
    pack_padded,
    packed_request,
)

ATTENTION_MASK = "attention_mask"  # a padded request's; the packed layout's names come from packing.py
WARMUP_SHORT_TOKENS = 16
MAX_ERROR_CHARS = 500
# A run of one row of at most this many tokens (a lone short text: low load, queries) replays a CUDA graph captured
# at load, one per token count. A graph replays the ~130 kernels of a call with one launch, which takes most of a
# lone short text's time off. Longer or many-row runs keep session.run: the gain shrinks with a run's size, and
# replaying every run at one of a few shapes was slower under load than 4 instances of session.run.
GRAPH_MAX_TOKENS = 128


def _error_response(message, code="INVALID_ARG"):
    """An error response; the TritonError codes exist from Triton 23.x on and are looked up when the stub runs."""
    value = getattr(pb_utils.TritonError, code, None)
    message = message[:MAX_ERROR_CHARS]
    error = pb_utils.TritonError(message) if value is None else pb_utils.TritonError(message, value)
    return pb_utils.InferenceResponse(error=error)


def _run_failed(exc):
    """What a request whose rows onnxruntime failed on is told."""
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"onnxruntime failed on the rows of this request: {reason}"


def _tensor(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


class OneRowGraphs:
    """CUDA graphs of one-row runs of 1..max_tokens tokens, one per token count, on an onnxruntime session made
    with the CUDA provider's `enable_cuda_graph`: each count's inputs and per-row output live in device buffers
    bound once (IO binding); the session captures a count's run on its third call with that `gpu_graph_id` and
    replays it after. Captured at load, on the thread that serves execute() (onnxruntime keeps a graph in the
    thread that captured it).

    A call copies to the device only the inputs that differ from what the buffers hold: the index tensors of a
    one-row run (cu_seqlens, token_offset, position_ids, ...) depend on its token count alone, so they are bound
    at capture and never copied again, and the token types of a single text (all 0) rarely change. Each copy is
    a synchronous host-to-device cudaMemcpy; a lone text made seven of them, now one."""

    VARYING = (INPUT_IDS, TOKEN_TYPE_IDS)  # a one-row run's inputs that are not a function of its token count

    def __init__(self, session, output, max_tokens, device=0, device_type="cuda"):
        self.session, self.output, self.max_tokens = session, output, max_tokens
        self.device, self.device_type = device, device_type
        self.bound = {}  # tokens -> (input buffers, the bytes each holds, output buffer, binding, run options)

    def covers(self, run, names):
        return run.rows == 1 and run.tokens <= self.max_tokens and names == [self.output]

    def capture(self, feed, tokens, sample):
        """Bind a `tokens`-token row's buffers (every input of `feed`; the output like `sample`, a regular run's)
        and capture its graph."""
        import onnxruntime as ort

        # a copy each: on the CPU an OrtValue wraps the array it is made from, and two inputs may share one
        values = {name: ort.OrtValue.ortvalue_from_numpy(value.copy(), self.device_type, self.device)
                  for name, value in feed.items()}
        held = {name: value.tobytes() for name, value in feed.items()}
        output = ort.OrtValue.ortvalue_from_shape_and_type([1, *sample.shape[1:]], sample.dtype, self.device_type,
                                                           self.device)
        binding = self.session.io_binding()
        for name, value in values.items():
            binding.bind_ortvalue_input(name, value)
        binding.bind_ortvalue_output(self.output, output)
        options = ort.RunOptions()
        options.add_run_config_entry("gpu_graph_id", str(tokens))  # an id > 0 per shape; 0 is onnxruntime's own
        self.bound[tokens] = (values, held, output, binding, options)
        for _ in range(3):  # two ordinary runs (the arena grows), then the capture
            self(feed, tokens)

    def feed(self, input_ids, token_type_ids, inputs):
        """What a call needs of a row (its token ids and types [T]) of the graph's `inputs`; the rest was bound at
        capture."""
        return {name: value for name, value in zip(self.VARYING, (input_ids, token_type_ids)) if name in inputs}

    def __call__(self, feed, tokens):
        """The per-row output of the captured `tokens`-token run on `feed` (some or all of its inputs)."""
        values, held, output, binding, options = self.bound[tokens]
        for name, value in feed.items():
            data = value.tobytes()
            if data != held[name]:
                values[name].update_inplace(value)
                held[name] = data
        self.session.run_with_iobinding(binding, options)
        return output.numpy().copy()  # on the CPU, numpy() is a view of the buffer the next call overwrites

    def warm_up(self, inputs, sample, max_row):
        """Capture every token count up to max_tokens (and max_row) on one row of token 0."""
        for tokens in range(1, min(self.max_tokens, max_row) + 1):
            ids = np.zeros(tokens, np.int32)
            self.capture(PackedRows(ids, ids, cu_seqlens_of([tokens])).feed(inputs), tokens, sample)
        return len(self.bound)


class PackedSteps:
    """execute(requests) -> responses for a packed graph run by one onnxruntime session. `outputs`: the graph's
    per-row output (pooled embeddings, logits) first, then its per-token outputs ([T, ...] in the graph)."""

    _LONE_INPUTS = frozenset((CU_SEQLENS, INPUT_IDS, TOKEN_TYPE_IDS))  # what a packed request carries

    def __init__(self, session, outputs, max_tokens, max_seq_len=None, vocab_sizes=(None, None), fill=False,
                 graph_session=None, device=0, device_type="cuda"):
        self.session, self.outputs = session, list(outputs)
        # a second session of the graph with CUDA graphs on (GPU only): lone short texts replay a captured graph
        self.graphs = (OneRowGraphs(graph_session, self.outputs[0], GRAPH_MAX_TOKENS, device, device_type)
                       if graph_session else None)
        # on the GPU each run is filled up to one of a few token counts (packing.py, filled_tokens): cuBLAS then
        # meets each GEMM shape again instead of choosing an algorithm for a new one on nearly every call
        self.fill = fill
        self.inputs = frozenset(i.name for i in session.get_inputs())  # the index tensors it reads, computed here
        self.max_tokens, self.max_seq_len = max_tokens, max_seq_len
        self.vocab_sizes = vocab_sizes  # (token ids, token types) the embedding tables hold; None = unchecked

    def rows_of(self, request):
        """(the request's rows in the packed layout, checked; its padded width, None for a packed request), or
        PackingError."""
        ids, mask, types, cu = (_tensor(request, n) for n in (INPUT_IDS, ATTENTION_MASK, TOKEN_TYPE_IDS, CU_SEQLENS))
        if (mask is None) == (cu is None):
            raise PackingError("a request carries exactly one of attention_mask (padded rows) and cu_seqlens "
                               "(packed rows)")
        if cu is not None:
            rows, width = packed_request(ids, types, cu, self.max_seq_len), None
        else:
            rows, width = pack_padded(ids, mask, types, self.max_seq_len), ids.shape[1]
        check_ids(rows, *self.vocab_sizes)
        return rows, width

    def _requested(self, request):
        names = [n for n in request.requested_output_names() if n in self.outputs]
        return names or self.outputs[:1]

    def __call__(self, requests):
        if len(requests) == 1 and self.graphs is not None:
            response = self._lone_row(requests[0])
            if response is not None:
                return [response]
        responses = [None] * len(requests)
        parts = []  # (request index, rows, padded width or None, outputs it asked for)
        for index, request in enumerate(requests):
            try:
                rows, width = self.rows_of(request)
            except PackingError as exc:
                responses[index] = _error_response(str(exc))
                continue
            parts.append((index, rows, width, self._requested(request)))
        if not parts:
            return responses
        batch = concat([rows for _, rows, _, _ in parts])
        names = [n for n in self.outputs if any(n in wanted for *_, wanted in parts)]
        owner_of_row = np.repeat(np.arange(len(parts)), [rows.rows for _, rows, _, _ in parts])
        merged, failed = {}, {}
        for start, stop in cut_runs(batch.lengths, self.max_tokens):
            run = batch.slice_rows(start, stop)
            graphed = self.graphs is not None and self.graphs.covers(run, names)
            if self.fill and not graphed:
                run = run.filled(filled_tokens(run.tokens, self.max_tokens), self._longest_filler())
            try:
                if graphed:
                    feed = self.graphs.feed(run.input_ids, run.token_type_ids, self.inputs)
                    outs = [self.graphs(feed, run.tokens)]
                else:
                    outs = self.session.run(names, run.feed(self.inputs))
            except Exception as exc:  # noqa: BLE001 - onnxruntime raises anything; those requests get the error
                for part in set(owner_of_row[start:stop].tolist()):
                    failed.setdefault(part, _run_failed(exc))
                continue
            first, last = int(batch.cu_seqlens[start]), int(batch.cu_seqlens[stop])
            for name, out in zip(names, outs):  # per-row outputs by row, per-token ones by token
                per_row = name == self.outputs[0]
                low, high = (start, stop) if per_row else (first, last)
                if name not in merged:
                    merged[name] = np.empty((batch.rows if per_row else batch.tokens, *out.shape[1:]), np.float32)
                merged[name][low:high] = out[:high - low]  # without a filled run's filler rows or tokens
        row = 0
        for part, (index, rows, width, wanted) in enumerate(parts):
            if part in failed:
                responses[index] = _error_response(failed[part], "INTERNAL")
            else:
                tensors = [pb_utils.Tensor(n, self._output(n, merged[n], batch, row, rows, width)) for n in wanted]
                responses[index] = pb_utils.InferenceResponse(tensors)
            row += rows.rows
        return responses

    def _lone_row(self, request):
        """The response to an execute() of one packed request of one row that a CUDA graph covers (a lone short
        text at low load), without merging, cutting runs or splitting outputs: Python work that would take a large
        share of such a request's time. None for any other request, and for one to refuse:
        the general path answers those, with the reason."""
        tensors = {tensor.name(): tensor for tensor in request.inputs()}  # one pass, not one per name
        if not self._LONE_INPUTS.issubset(tensors) or ATTENTION_MASK in tensors:
            return None
        cu, ids, types = (tensors[name].as_numpy() for name in (CU_SEQLENS, INPUT_IDS, TOKEN_TYPE_IDS))
        if cu.shape != (1, 2) or int(cu[0, 0]) != 0 or ids.shape != (1, int(cu[0, 1])) or types.shape != ids.shape:
            return None
        row = PackedRows(ids[0].astype(np.int32, copy=False), types[0].astype(np.int32, copy=False), cu[0])
        longest = self.max_seq_len or row.tokens
        if not 1 <= row.tokens <= longest or not self.graphs.covers(row, self._requested(request)):
            return None
        try:
            check_ids(row, *self.vocab_sizes)
        except PackingError:
            return None
        try:
            out = self.graphs(self.graphs.feed(row.input_ids, row.token_type_ids, self.inputs), row.tokens)
        except Exception as exc:  # noqa: BLE001 - as the general path answers it
            return _error_response(_run_failed(exc), "INTERNAL")
        return pb_utils.InferenceResponse([pb_utils.Tensor(self.outputs[0], out.astype(np.float32, copy=False))])

    def _output(self, name, values, batch, row, rows, width):
        """A request's part of a merged output: its rows of the per-row output; of a per-token one its tokens,
        [T, ...] back to back for a packed request, [rows, width, ...] (zeros after each row) for a padded one."""
        if name == self.outputs[0]:
            return np.ascontiguousarray(values[row:row + rows.rows])
        first = int(batch.cu_seqlens[row])
        tokens = values[first:first + rows.tokens]
        if width is None:
            return np.ascontiguousarray(tokens)
        out = np.zeros((rows.rows, width, *tokens.shape[1:]), np.float32)
        for k, (start, stop) in enumerate(zip(rows.cu_seqlens[:-1], rows.cu_seqlens[1:])):
            out[k, :stop - start] = tokens[start:stop]
        return out

    def _longest_filler(self):
        return self.max_seq_len or WARMUP_SHORT_TOKENS

    def warm_up(self, gpu):
        """Run a few token counts once, bounded by the token budget: a short row; on a GPU also the budget in rows
        of max_seq_len (the largest attention) and in short rows (the largest mean-pooling matrix), then, when runs
        are filled, each token count a run is filled up to (filler rows only), so that cuBLAS has chosen every
        GEMM's algorithm and loaded its kernels before the first request."""
        longest = self.max_seq_len or WARMUP_SHORT_TOKENS
        sizes = [(1, min(WARMUP_SHORT_TOKENS, longest))]
        if gpu:
            sizes += [(max(1, self.max_tokens // longest), longest),
                      (max(1, self.max_tokens // WARMUP_SHORT_TOKENS), min(WARMUP_SHORT_TOKENS, longest))]
        start = time.perf_counter()
        for rows, length in sizes:
            tokens = rows * length
            ids = np.zeros(tokens, np.int32)  # id 0 exists in every vocabulary
            feed = PackedRows(ids, np.zeros_like(ids), cu_seqlens_of([length] * rows))
            for first, stop in cut_runs(feed.lengths, self.max_tokens):
                self.session.run(self.outputs, feed.slice_rows(first, stop).feed(self.inputs))
        filled = fill_sizes(self.max_tokens) if self.fill else []
        nothing = PackedRows(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(1, np.int32))
        for tokens in filled:
            self.session.run(self.outputs, nothing.filled(tokens, self._longest_filler()).feed(self.inputs))
        graphs = ""
        if self.graphs is not None:
            one = PackedRows(np.zeros(1, np.int32), np.zeros(1, np.int32), cu_seqlens_of([1])).feed(self.inputs)
            sample = self.session.run(self.outputs[:1], one)[0]
            try:
                graphs = f", {self.graphs.warm_up(self.inputs, sample, self._longest_filler())} CUDA graphs captured"
            except Exception as exc:  # noqa: BLE001 - a graph onnxruntime cannot capture: serve without graphs
                self.graphs = None
                graphs = f", no CUDA graphs ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})"
        return (f"packed layout, {len(sizes) + len(filled)} warm-up runs ({len(filled)} filled token counts){graphs} in "
                f"{time.perf_counter() - start:.1f}s")
