"""The one error shape `{"error": {"type", "message"}}` and the exception handlers producing it."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from gateway.api.responses import OrjsonResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.metrics import ERRORS

log = logging.getLogger("gateway.errors")


class GatewayError(Exception):
    """An error answered to the client as `status` with a stable `type` string."""

    status: int = 500
    type: str = "internal_error"

    def __init__(self, message: str, *, status: int | None = None, type: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type


class BadRequest(GatewayError):
    status, type = 400, "invalid_request"


class Unauthorized(GatewayError):
    status, type = 401, "authentication_error"


class ModelNotFound(GatewayError):
    status, type = 404, "model_not_found"


class PayloadTooLarge(GatewayError):
    status, type = 413, "too_many_inputs"


class InputTooLong(GatewayError):
    status, type = 413, "input_too_long"


class TooManyRequests(GatewayError):
    status, type = 429, "rate_limited"


class TritonUnavailable(GatewayError):
    status, type = 503, "triton_unavailable"


class GatewayTimeout(GatewayError):
    status, type = 504, "timeout"


def error_response(status: int, type_: str, message: str, headers: dict[str, str] | None = None) -> OrjsonResponse:
    """Build the JSON error response and count it."""
    ERRORS.labels(type_).inc()
    return OrjsonResponse({"error": {"type": type_, "message": message}}, status_code=status, headers=headers)


async def _gateway_error(_: Request, exc: Exception) -> OrjsonResponse:
    assert isinstance(exc, GatewayError)
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return error_response(exc.status, exc.type, exc.message, headers)


async def _validation_error(_: Request, exc: Exception) -> OrjsonResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(400, "invalid_json", "request body is not valid JSON")
    parts = []
    for e in errors[:5]:
        loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
        parts.append(f"{loc}: {e.get('msg', 'invalid')}" if loc else str(e.get("msg", "invalid")))
    return error_response(422, "validation_error", "; ".join(parts) or "invalid request")


async def _http_error(_: Request, exc: Exception) -> OrjsonResponse:
    assert isinstance(exc, StarletteHTTPException)
    kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(exc.status_code, kind, str(exc.detail))


async def _unexpected(_: Request, exc: Exception) -> OrjsonResponse:
    log.exception("unhandled error", exc_info=exc)
    return error_response(500, "internal_error", "internal error")


def install_error_handlers(app: FastAPI) -> None:
    """Route every failure to the one JSON error shape (no stack trace ever reaches clients)."""
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
