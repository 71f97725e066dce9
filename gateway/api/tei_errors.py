"""TEI's error shape under /tei/: `{"error": str, "error_type": str}` with TEI's status codes; on TEI's OpenAI routes
(/tei/{model}/v1/embeddings and /embeddings) TEI's OpenAI one, `{"message": str, "code": int, "type": str}`.

Every failure of the gateway (a route's domain error, a validation error, the edge's 401/413/429, an unknown
route) is answered in the gateway's one shape `{"error": {"type", "message"}}`. For a path under /tei/ the edge
(api/edge.py) turns that answer into TEI's with `tei_error`: the gateway's error type picks TEI's status and
`error_type` (TEI's six: Unhealthy, Backend, Overloaded, Validation, Tokenizer, Empty). Metrics and the access
log keep the gateway's own status and type, one vocabulary over every protocol.
"""

from __future__ import annotations

from collections.abc import Iterable

import orjson

from gateway.api.tei_schemas import TeiError, TeiErrorType, TeiOpenAIError
from gateway.errors import ErrorKind, ErrorType

TEI_PREFIX = "/tei/"  # each served model is a TEI server at /tei/{model} (api/tei.py)
TEI_OPENAI_ROUTES = ("/v1/embeddings", "/embeddings")  # TEI's OpenAI routes: their errors take TEI's OpenAI shape

# The gateway's error kind -> TEI's status and error_type. Cases TEI never meets (auth, an unknown model, a
# timeout) keep the gateway's status, with the nearest of TEI's six types.
_BY_KIND: dict[ErrorKind, tuple[int, TeiErrorType]] = {
    ErrorKind.INVALID: (422, "Validation"),  # a request TEI parses but refuses: an unknown prompt, dimensions, pairs
    ErrorKind.VALIDATION: (422, "Validation"),
    ErrorKind.UNAUTHORIZED: (401, "Validation"),
    ErrorKind.FORBIDDEN: (403, "Validation"),
    ErrorKind.NOT_FOUND: (404, "Validation"),
    ErrorKind.METHOD_NOT_ALLOWED: (405, "Validation"),
    ErrorKind.TOO_LARGE: (413, "Validation"),
    ErrorKind.HEADERS_TOO_LARGE: (431, "Validation"),
    ErrorKind.REQUEST_TIMEOUT: (408, "Validation"),
    ErrorKind.UNSUPPORTED_MEDIA: (415, "Validation"),
    ErrorKind.UNSUPPORTED_OUTPUT: (424, "Backend"),  # TEI: "Model is not an embedding model with SPLADE pooling"
    ErrorKind.RATE_LIMITED: (429, "Overloaded"),
    ErrorKind.INTERNAL: (500, "Backend"),
    ErrorKind.NOT_IMPLEMENTED: (501, "Backend"),
    ErrorKind.UPSTREAM: (424, "Backend"),  # Triton failed: TEI's backend error
    ErrorKind.OVERLOADED: (429, "Overloaded"),
    ErrorKind.UNAVAILABLE: (503, "Unhealthy"),
    ErrorKind.TIMEOUT: (504, "Backend"),
}
# Error types TEI answers otherwise than their kind.
_BY_TYPE: dict[ErrorType, tuple[int, TeiErrorType]] = {
    ErrorType.EMPTY_INPUT: (400, "Empty"),
    ErrorType.INVALID_JSON: (400, "Validation"),  # axum's JSON syntax rejection is a 400 too
    ErrorType.INVALID_UNICODE: (400, "Validation"),
    ErrorType.WRONG_TASK: (424, "Backend"),  # TEI: "model is not a re-ranker model" and its kin
    ErrorType.TOO_MANY_INPUTS: (422, "Validation"),  # TEI: "batch size N > maximum allowed batch size"
    ErrorType.INPUT_TOO_LONG: (422, "Validation"),  # TEI: "`inputs` must have less than N tokens"
    ErrorType.TOKENIZER_UNAVAILABLE: (501, "Tokenizer"),
}


def tei_status(type_: ErrorType) -> tuple[int, TeiErrorType]:
    """TEI's status code and error_type for a gateway error of `type_`."""
    return _BY_TYPE.get(type_) or _BY_KIND[type_.kind]


def openai_route(path: str) -> bool:
    """Whether `path` (under /tei/) is one of TEI's OpenAI routes of a model: /tei/NAME/v1/embeddings, /embeddings."""
    _, _, rest = path.removeprefix(TEI_PREFIX).partition("/")
    return path.startswith(TEI_PREFIX) and "/" + rest in TEI_OPENAI_ROUTES


def tei_body(body: bytes, openai: bool = False) -> tuple[int, bytes] | None:
    """The TEI status and body for a gateway error body (`openai`: TEI's OpenAI error shape); None when `body` is
    not the gateway's error shape."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    error = payload.get("error") if isinstance(payload, dict) and len(payload) == 1 else None
    if not (isinstance(error, dict) and isinstance(error.get("type"), str) and isinstance(error.get("message"), str)):
        return None
    try:
        code, error_type = tei_status(ErrorType(error["type"]))  # type: ignore[call-arg]  # by value, not __new__
    except ValueError:  # not one of the gateway's types: left as it is
        return None
    if openai:
        return code, orjson.dumps(TeiOpenAIError(message=error["message"], code=code, type=error_type).model_dump())
    return code, orjson.dumps(TeiError(error=error["message"], error_type=error_type).model_dump())


def tei_error(status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes, path: str
              ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """An error answer to `path` under /tei/ as TEI's: status and body rewritten when the body is the gateway's
    error shape (`tei_body`), and the Content-Length, set anew, last among the headers."""
    rewritten = tei_body(body, openai_route(path))
    if rewritten is not None:
        status, body = rewritten
    kept = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    kept.append((b"content-length", str(len(body)).encode()))
    return status, kept, body
