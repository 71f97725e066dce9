"""Several outputs of one forward pass (/encode): an embedder's dense vectors, its sparse (lexical) weights and its
ColBERT vectors, as bge-m3's `BGEM3FlagModel.encode(return_dense=..., return_sparse=..., return_colbert_vecs=...)`
gives them. One call of the model step per batch computes every output asked for, and the tokens are billed once.
Each output is what its own route answers (/embed, /embed_sparse, /embed_multi_vector): the same step outputs, the
same finishing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from contract import COLBERT_VECTORS, PER_TOKEN_OUTPUTS, TOKEN_WEIGHTS, TruncationDirection
from gateway.errors import ErrorType, GatewayError
from gateway.service.embed import check_dimensions, finish
from gateway.service.inference import BatchResult, Inputs
from gateway.service.multi_vector import check_answer_size, has_output, leading_tokens_left_out
from gateway.service.prompts import prompt_text, with_prompt
from gateway.service.registry import Backend, ServedModel
from gateway.service.serving import Call, Service
from gateway.service.sparse import SparseVector, from_rows, from_token_weights, sparse_kind

EncodeOutput = Literal["dense", "sparse", "multi_vector"]
ENCODE_OUTPUTS: tuple[EncodeOutput, ...] = get_args(EncodeOutput)
_ROUTE_OF = {"dense": "/embed", "sparse": "/embed_sparse", "multi_vector": "/embed_multi_vector"}


@dataclass(frozen=True, slots=True)
class EncodeQuery:
    texts: list[str]
    outputs: tuple[EncodeOutput, ...] = ENCODE_OUTPUTS
    prompt_name: str | None = None
    normalize: bool | None = None  # dense: None as the model was trained
    dimensions: int | None = None  # dense: matryoshka width
    truncate: bool = True
    direction: TruncationDirection = "right"
    backend: Backend | None = None


@dataclass(frozen=True, slots=True)
class Encoded:
    """The outputs asked for, per input in order (None: not asked for)."""

    model: str
    dense: np.ndarray | None  # [n, dimensions] float32
    sparse: list[SparseVector] | None
    multi_vector: list[np.ndarray] | None  # [tokens_i, dim] float32 each
    tokens: int  # billed once


def step_output(model: ServedModel, output: EncodeOutput) -> str | None:
    """The model step's output an encode output is made of, or None when the model has none."""
    if output == "dense":
        return model.output_name if model.task == "embed" else None
    if output == "sparse":
        kind = sparse_kind(model)
        return None if kind is None else model.output_name if kind == "splade" else TOKEN_WEIGHTS
    return COLBERT_VECTORS if has_output(model, COLBERT_VECTORS) else None


def _has_any(model: ServedModel, outputs: tuple[EncodeOutput, ...]) -> bool:
    return any(step_output(model, output) is not None for output in outputs)


def _by_name(result: BatchResult, names: tuple[str, ...], pooled: str) -> dict[str, list[np.ndarray] | np.ndarray]:
    """Each step output of a result: the pooled one as [n, width] rows, a per-token one text by text."""
    if len(names) == 1:
        return {names[0]: result.rows if names[0] == pooled else result.per_text}
    columns = zip(*result.per_text_outputs)
    return {name: np.stack(column) if name == pooled else list(column) for name, column in zip(names, columns)}


class EncodeService(Service):
    """Every output of an embedder a request asks for, from one forward pass (/encode)."""

    async def encode(self, call: Call, model: str | None, query: EncodeQuery) -> Encoded:
        """The outputs `query.outputs` of every text; `model` None: the only served model with one of them."""
        self.check_texts(call, query.texts)
        served = await self.model_with(call, model, lambda m: _has_any(m, query.outputs),
                                       f"any of the outputs {', '.join(query.outputs)}")
        names = self._step_outputs(served, query.outputs)
        width = check_dimensions(served, query.dimensions) if "dense" in query.outputs else None
        inputs = Inputs(with_prompt(query.texts, prompt_text(served, query.prompt_name)), None, query.direction,
                        urgency=self.urgency(call))
        if COLBERT_VECTORS in names:
            await check_answer_size(self.inference, self.max_token_values, served, COLBERT_VECTORS, inputs)
        result = await self.within_deadline(call, lambda deadline: self.inference.run(
            served, inputs, truncate=query.truncate, backend=query.backend, deadline=deadline, outputs=names))
        found = _by_name(result, names, served.output_name)

        def of(output: EncodeOutput) -> list[np.ndarray] | np.ndarray | None:
            name = step_output(served, output)
            return found[name] if output in query.outputs and name is not None else None

        dense, sparse, multi = of("dense"), of("sparse"), of("multi_vector")
        if isinstance(sparse, np.ndarray):  # SPLADE: vocabulary-wide rows
            sparse_vectors: list[SparseVector] | None = from_rows(sparse)
        elif sparse is not None:
            assert result.ids is not None  # per-token outputs run on the scheduler pipeline, which knows the ids
            sparse_vectors = [from_token_weights(ids, weights, served.sparse_skip_ids)
                              for ids, weights in zip(result.ids, sparse)]
        else:
            sparse_vectors = None
        first = leading_tokens_left_out(COLBERT_VECTORS)
        return Encoded(
            served.name,
            None if dense is None else finish(served, np.asarray(dense), query.normalize, width),
            sparse_vectors,
            None if multi is None else [vectors[first:] for vectors in multi],
            result.tokens,
        )

    @staticmethod
    def _step_outputs(model: ServedModel, outputs: tuple[EncodeOutput, ...]) -> tuple[str, ...]:
        """The step outputs one call computes, in the step's order; 424 naming any output the model lacks."""
        missing = [output for output in outputs if step_output(model, output) is None]
        if missing:
            raise GatewayError(ErrorType.OUTPUT_NOT_AVAILABLE, f"model {model.name!r} has no {' or '.join(missing)} "
                               f"output (what {', '.join(_ROUTE_OF[m] for m in missing)} would serve); it has "
                               f"{', '.join(o for o in ENCODE_OUTPUTS if step_output(model, o) is not None) or 'none'}")
        order = (model.output_name, *PER_TOKEN_OUTPUTS)
        names = {step_output(model, output) for output in outputs}
        return tuple(name for name in order if name in names)
