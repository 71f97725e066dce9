"""How the scheduler pipeline plans a step's batches: the batch policy (the settings, within what the step
declares) and the bytes of the largest batch's tensors, which size the step's shm regions."""

from __future__ import annotations

import numpy as np

from contract import CU_SEQLENS, INPUT_IDS, TOKEN_INPUTS, TOKEN_TYPE_IDS
from contract.batching import ROW_PAD_LIMIT, Shapes
from gateway.service.inference.pipeline import batches_in_flight
from gateway.service.registry import Endpoint, ServedModel
from gateway.service.scheduler import BatchPolicy
from gateway.settings import GatewaySettings

# What one more model call costs, in tokens of compute, when batches are planned (contract/batching.py):
# a GPU call costs about a thousand tokens of bert-base compute or more in fixed overhead, a CPU call
# almost none. A GPU step that declares no shapes (an older build) gets widths of a multiple of 8.
_CALL_COST_TOKENS = {"GPU": 1024, "CPU": 64}


def batch_policy(settings: GatewaySettings, model: ServedModel, endpoint: Endpoint) -> BatchPolicy:
    """How batches for this step are formed: the settings, within what the step declares."""
    s = settings
    max_rows = min(s.max_batch_requests, endpoint.step_max_batch_size)
    budget = min(s.max_batch_tokens, endpoint.step_max_tokens) if endpoint.step_max_tokens else s.max_batch_tokens
    widths = endpoint.step_widths or (
        tuple(sorted({*range(8, model.max_seq_len, 8), model.max_seq_len})) if endpoint.step_on_gpu else ())
    rows = tuple(r for r in endpoint.step_rows if r <= max_rows)
    if rows and rows[-1] != max_rows:  # GATEWAY_MAX_BATCH_REQUESTS below the step's largest: a declared count
        max_rows = rows[-1]
    cost = s.batch_call_cost_tokens
    call_cost = _CALL_COST_TOKENS["GPU" if endpoint.step_on_gpu else "CPU"] if cost is None else cost
    pad_id = model.tokenizer.pad_token_id if model.tokenizer else 0
    if endpoint.step_layout == "packed":  # only real tokens count: no widths, no row counts, no padding bound
        return BatchPolicy(
            max_rows=s.max_batch_requests,  # a packed request is one of Triton's batch, whatever its rows
            max_tokens=max(budget, model.max_seq_len), max_in_flight=batches_in_flight(s, endpoint),
            shapes=Shapes(model.max_seq_len), call_cost_tokens=call_cost, pad_id=pad_id,
            max_queue_wait_s=s.max_queue_wait_s, layout="packed",
        )
    return BatchPolicy(
        max_rows=max_rows,
        max_tokens=max(budget, model.max_seq_len),
        max_in_flight=batches_in_flight(s, endpoint),
        shapes=Shapes(model.max_seq_len, widths, rows),
        call_cost_tokens=call_cost,
        pad_id=pad_id,
        max_queue_wait_s=s.max_queue_wait_s,
    )


def input_sizes(policy: BatchPolicy, max_seq_len: int) -> dict[str, int]:
    """Bytes of each input of the largest batch `policy` forms."""
    if policy.layout == "packed":
        token_bytes = policy.max_tokens * 4
        return {INPUT_IDS: token_bytes, TOKEN_TYPE_IDS: token_bytes, CU_SEQLENS: (policy.max_rows + 1) * 4}
    # dummy rows can take a batch past the token budget by ROW_PAD_LIMIT (contract/batching.py)
    token_bytes = int(policy.max_tokens * (1 + ROW_PAD_LIMIT) + max_seq_len) * 4
    return {name: token_bytes for name in TOKEN_INPUTS}


def token_shape(tensors: dict[str, np.ndarray], rows: int, dim: int) -> tuple[int, ...]:
    """The shape of a per-token output of `dim` floats per token (0: one) for a batch: [rows, width, dim]
    padded, [T, dim] packed."""
    lead = (tensors[INPUT_IDS].shape[1],) if CU_SEQLENS in tensors else (rows, tensors[INPUT_IDS].shape[1])
    return lead if dim == 0 else (*lead, dim)
