"""Fast JSON responses (orjson, numpy arrays serialized natively)."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson
from starlette.responses import JSONResponse

from gateway import tracing


class OrjsonResponse(JSONResponse):
    """JSON via orjson; numpy arrays are written without a Python-list detour. A JSONResponse, so that
    FastAPI's OpenAPI documents the bodies of routes answering with it as JSON."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        with tracing.span("serialize"):
            return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


def base64_rows(vectors: np.ndarray) -> list[str]:
    """Each row of a float32 matrix as base64 of its little-endian bytes (what the openai client decodes)."""
    return [base64.b64encode(row.tobytes()).decode() for row in vectors.astype("<f4", copy=False)]
