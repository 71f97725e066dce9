"""TEI's error shape under /tei/: `{"error": str, "error_type": str}` with TEI's status codes.

Every failure of the gateway (a route's domain error, a validation error, the middleware's 401/413/429,
an unknown route) is answered in the gateway's one shape `{"error": {"type", "message"}}`. For a path
under /tei/ this outermost ASGI wrapper turns that answer into TEI's: the gateway's error type picks TEI's
status and `error_type` (TEI's six: Unhealthy, Backend, Overloaded, Validation, Tokenizer, Empty). Metrics
and the access log keep the gateway's own status and type, one vocabulary over every protocol.
"""

from __future__ import annotations

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.tei_schemas import TeiError, TeiErrorType
from gateway.errors import EMPTY_INPUT

TEI_PREFIX = "/tei/"

# The gateway's error type -> TEI's status and error_type, where TEI answers that case itself.
_BY_TYPE: dict[str, tuple[int, TeiErrorType]] = {
    EMPTY_INPUT: (400, "Empty"),
    "invalid_json": (400, "Validation"),  # axum's JSON syntax rejection is a 400 too
    "invalid_unicode": (400, "Validation"),
    "wrong_task": (424, "Backend"),  # TEI: "model is not a re-ranker model" and its kin
    "too_many_inputs": (422, "Validation"),  # TEI: "batch size N > maximum allowed batch size"
    "input_too_long": (422, "Validation"),  # TEI: "`inputs` must have less than N tokens"
    "overloaded": (429, "Overloaded"),
    "rate_limited": (429, "Overloaded"),
    "tokenizer_unavailable": (501, "Tokenizer"),
}
# The rest by the gateway's status. Cases TEI never meets (an unknown model, auth, a timeout) keep the
# gateway's status, with the nearest of TEI's six types.
_BY_STATUS: dict[int, tuple[int, TeiErrorType]] = {
    400: (422, "Validation"),  # a request TEI parses but refuses: an unknown prompt, dimensions, pairs
    413: (413, "Validation"),
    422: (422, "Validation"),
    429: (429, "Overloaded"),
    502: (424, "Backend"),  # Triton failed: TEI's backend error
    503: (503, "Unhealthy"),
}


def tei_status(status: int, type_: str) -> tuple[int, TeiErrorType]:
    """TEI's status code and error_type for a gateway error answered with `status` and `type_`."""
    if type_ in _BY_TYPE:
        return _BY_TYPE[type_]
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return status, "Backend" if status >= 500 else "Validation"


def tei_body(status: int, body: bytes) -> tuple[int, bytes] | None:
    """The TEI status and body for a gateway error body; None when `body` is not the gateway's error shape."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    error = payload.get("error") if isinstance(payload, dict) and len(payload) == 1 else None
    if not (isinstance(error, dict) and isinstance(error.get("type"), str) and isinstance(error.get("message"), str)):
        return None
    code, error_type = tei_status(status, error["type"])
    return code, orjson.dumps(TeiError(error=error["message"], error_type=error_type).model_dump())


class TeiErrorShape:
    """Pure-ASGI wrapper: error answers under /tei/ in TEI's shape; everything else passes untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(TEI_PREFIX):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        body = bytearray()  # an error body: at most about a kilobyte (api/errors.py bounds the message)

        async def send_tei(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held until the body is known
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            body.extend(message.get("body", b""))
            if message.get("more_body", False):
                return
            status, payload = start["status"], bytes(body)
            rewritten = tei_body(status, payload)
            if rewritten is not None:
                status, payload = rewritten
            headers = [(k, v) for k, v in start.get("headers", ()) if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(payload)).encode()))
            await send({**start, "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": payload})

        await self.app(scope, receive, send_tei)
