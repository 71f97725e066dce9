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
    ErrorKind.HEADERS_TOO_LARGE: 431,
    ErrorKind.REQUEST_TIMEOUT: 408,
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


def validation_error(errors: Sequence[Mapping[str, Any]]) -> GatewayError:
    """The 400/422 of a body that failed the request model's validation (pydantic's errors), located by the API's
    own field paths (`inputs.0`): FastAPI's `body` prefix and pydantic's names of union members are left out."""
    if any(e.get("type") == "json_invalid" for e in errors):
        return GatewayError(ErrorType.INVALID_JSON, "request body is not valid JSON")
    unicode = next((e for e in errors if e.get("type") == "string_unicode"), None)
    if unicode is not None:  # JSON may escape a lone UTF-16 surrogate ("\ud800"): no Unicode text has one
        where = _location(unicode) or "a field name"  # an unknown key holding a surrogate has no location of its own
        return GatewayError(ErrorType.INVALID_UNICODE, f"{where}: text is not valid Unicode (a lone surrogate)")
    parts = []
    for e in errors[:5]:
        loc, msg = _location(e), str(e.get("msg", "invalid"))
        part = f"{loc}: {msg}" if loc else msg
        if part not in parts:
            parts.append(part)
    return GatewayError(ErrorType.VALIDATION_ERROR, "; ".join(parts) or "invalid request")


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none", "bytes"}


def _location(error: Mapping[str, Any]) -> str:
    """An error's location as the API's field path: the members of a union (`constrained-str`, `list[str]`) are
    pydantic's names, not the API's; an unknown field's name is kept whatever it is."""
    loc = [p for p in error.get("loc", ()) if p != "body"]
    if error.get("type") != "extra_forbidden":
        loc = [p for p in loc if isinstance(p, int) or not ("[" in p or "-" in p or p in _TYPE_NAMES)]
    return ".".join(str(p) for p in loc)


def validation_error_response(errors: Sequence[Mapping[str, Any]]) -> OrjsonResponse:
    """The response of `validation_error`."""
    return gateway_error_response(validation_error(errors))


_HTTP_ERRORS = {404: ErrorType.NOT_FOUND, 405: ErrorType.METHOD_NOT_ALLOWED, 413: ErrorType.BODY_TOO_LARGE}


async def _http_error(_: Request, exc: Exception) -> OrjsonResponse:
    assert isinstance(exc, StarletteHTTPException)
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
    app.add_exception_handler(Exception, _unexpected)  # the edge's last resort answers first, with the request id
