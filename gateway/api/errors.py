"""The HTTP edge of errors: each `ErrorKind` answered with its status code in the one JSON shape
`{"error": {"type", "message"}}` (the `ErrorType` of gateway/errors.py), and the handlers that turn every
failure into it."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.api.responses import OrjsonResponse
from gateway.errors import ErrorKind, ErrorType, GatewayError
from gateway.metrics import ERRORS

log = logging.getLogger("gateway.errors")

STATUS: dict[ErrorKind, int] = {
    ErrorKind.INVALID: 400,
    ErrorKind.UNAUTHORIZED: 401,
    ErrorKind.FORBIDDEN: 403,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.METHOD_NOT_ALLOWED: 405,
    ErrorKind.TOO_LARGE: 413,
    ErrorKind.UNSUPPORTED_MEDIA: 415,
    ErrorKind.RATE_LIMITED: 429,
    ErrorKind.INTERNAL: 500,
    ErrorKind.NOT_IMPLEMENTED: 501,
    ErrorKind.UPSTREAM: 502,
    ErrorKind.VALIDATION: 422,
    ErrorKind.UNSUPPORTED_OUTPUT: 424,  # text-embeddings-inference's answer to /embed_sparse on a dense model
    ErrorKind.OVERLOADED: 503,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.TIMEOUT: 504,
}
MAX_MESSAGE_CHARS = 1000  # error messages may quote input; keep every error body small


def status_of(type_: ErrorType) -> int:
    """The status code an error type is answered with."""
    return STATUS[type_.kind]


def error_response(
    type_: ErrorType, message: str, retry_after_s: float | None = None, *, status: int | None = None
) -> OrjsonResponse:
    """Build the JSON error response (bounded in size) and count it. `status`: only for an HTTP error of a code
    no kind has."""
    ERRORS.labels(type_).inc()
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 3] + "..."
    headers = {"WWW-Authenticate": "Bearer"} if type_.kind is ErrorKind.UNAUTHORIZED else {}
    if retry_after_s is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
    return OrjsonResponse({"error": {"type": type_, "message": message}}, status_code=status or status_of(type_),
                          headers=headers)


def gateway_error_response(exc: GatewayError) -> OrjsonResponse:
    """The response for a domain error."""
    return error_response(exc.type, exc.message, exc.retry_after_s)


async def _gateway_error(_: Request, exc: Exception) -> OrjsonResponse:
    assert isinstance(exc, GatewayError)
    return gateway_error_response(exc)


async def _validation_error(_: Request, exc: Exception) -> OrjsonResponse:
    assert isinstance(exc, RequestValidationError)
    return validation_error_response(exc.errors())


def validation_error_response(errors: Sequence[Mapping[str, Any]]) -> OrjsonResponse:
    """The 400/422 of a body that failed to parse or validate (pydantic's errors; a `body` location prefix,
    as FastAPI's path adds it, is left out)."""
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(ErrorType.INVALID_JSON, "request body is not valid JSON")
    unicode = next((e for e in errors if e.get("type") == "string_unicode"), None)
    if unicode is not None:  # JSON may escape a lone UTF-16 surrogate ("\ud800"): no Unicode text has one
        where = ".".join(str(p) for p in unicode.get("loc", ()) if p != "body" and "str" not in str(p))
        where = where or "a field name"  # an unknown key holding a surrogate has no location of its own
        return error_response(ErrorType.INVALID_UNICODE, f"{where}: text is not valid Unicode (a lone surrogate)")
    parts = []
    for e in errors[:5]:
        loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
        parts.append(f"{loc}: {e.get('msg', 'invalid')}" if loc else str(e.get("msg", "invalid")))
    return error_response(ErrorType.VALIDATION_ERROR, "; ".join(parts) or "invalid request")


def _unparsable_body(cause: BaseException | None) -> str:
    """Why FastAPI could not parse a JSON body, where json.loads raised something else than a JSONDecodeError."""
    if isinstance(cause, UnicodeDecodeError):
        return f"request body is not valid JSON: not UTF-8 text (invalid byte at position {cause.start})"
    if isinstance(cause, RecursionError):
        return "request body is not valid JSON for this API: nested too deeply"
    if isinstance(cause, ValueError):  # e.g. an integer literal of more than 4300 digits
        return "request body is not valid JSON for this API: a number too long"
    return "request body is not valid JSON"


def unparsable_body_response(cause: BaseException | None) -> OrjsonResponse:
    """The 400 of a body json.loads failed on with something else than a JSONDecodeError."""
    return error_response(ErrorType.INVALID_JSON, _unparsable_body(cause))


_HTTP_ERRORS = {404: ErrorType.NOT_FOUND, 405: ErrorType.METHOD_NOT_ALLOWED, 413: ErrorType.BODY_TOO_LARGE}


async def _http_error(_: Request, exc: Exception) -> OrjsonResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400:  # FastAPI's "There was an error parsing the body" (the only 400 HTTPException here)
        return unparsable_body_response(exc.__cause__)
    type_ = _HTTP_ERRORS.get(exc.status_code)
    if type_ is None:  # none raised here; answered with its own code all the same
        fallback = ErrorType.INTERNAL_ERROR if exc.status_code >= 500 else ErrorType.INVALID_REQUEST
        return error_response(fallback, str(exc.detail), status=exc.status_code)
    return error_response(type_, str(exc.detail))


async def _unexpected(_: Request, exc: Exception) -> OrjsonResponse:
    log.exception("unhandled error", exc_info=exc)
    return error_response(ErrorType.INTERNAL_ERROR, "internal error")


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure to the one JSON error shape (no stack trace ever reaches clients)."""
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)  # api/middleware.py's LastResort answers first, with the id
