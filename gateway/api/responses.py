"""Fast JSON responses (orjson, numpy arrays serialized natively)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


class OrjsonResponse(Response):
    """JSON via orjson; numpy arrays are written without a Python-list detour."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)
