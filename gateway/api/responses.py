"""Fast JSON responses (orjson, numpy arrays serialized natively)."""

from __future__ import annotations

from typing import Any

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
