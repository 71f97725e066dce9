"""Fast JSON responses (orjson, numpy arrays serialized natively), and large answers encoded off the event loop."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import numpy as np
import orjson
from starlette.responses import JSONResponse, Response

from gateway import tracing

# An answer expected to be larger than this is encoded in a worker thread (orjson lets other threads run while it
# encodes): on the event loop it would hold up every other request of the worker, probes included, for as long as
# it takes. Below it the thread hand-over costs more than the encoding.
OFF_LOOP_BYTES = 1 << 20
FLOAT_BYTES = 11  # a float32 in JSON: up to 9 significant digits, its sign, point and comma
TOKEN_BYTES = 64  # one /tokenize token: {"id", "text", "special", "start", "stop"}


class OrjsonResponse(JSONResponse):
    """JSON via orjson; numpy arrays are written without a Python-list detour. A JSONResponse, so that
    FastAPI's OpenAPI documents the bodies of routes answering with it as JSON."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        with tracing.span("serialize"):
            return _dumps(content)


def _dumps(content: Any) -> bytes:
    return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


async def json_answer(content: Any, *, floats: int = 0, tokens: int = 0) -> Response:
    """The JSON answer of `content`, which holds about `floats` numbers and `tokens` /tokenize tokens: encoded in a
    worker thread when it is expected to be over OFF_LOOP_BYTES, so that the worker's loop keeps serving."""
    if floats * FLOAT_BYTES + tokens * TOKEN_BYTES <= OFF_LOOP_BYTES:
        return OrjsonResponse(content)
    with tracing.span("serialize"):
        body = await asyncio.to_thread(_dumps, content)
    return Response(body, media_type=OrjsonResponse.media_type)


def base64_rows(vectors: np.ndarray) -> list[str]:
    """Each row of a float32 matrix as base64 of its little-endian bytes (what the openai client decodes)."""
    return [base64.b64encode(row.tobytes()).decode() for row in vectors.astype("<f4", copy=False)]
