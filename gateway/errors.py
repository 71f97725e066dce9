"""The gateway's error kinds, shared by every layer (service, Triton client, HTTP).

Code below the HTTP edge raises `GatewayError(kind, message, type=...)`; only `api/errors.py`
knows which HTTP status a kind is answered with (the split text-embeddings-inference makes).
`type` is the stable string clients see in `{"error": {"type", "message"}}`; it defaults to the
kind's own name and may be more specific (e.g. `wrong_task` is an `invalid` request).
"""

from __future__ import annotations

from enum import StrEnum


class ErrorKind(StrEnum):
    """What went wrong, in terms the HTTP edge maps to a status code."""

    INVALID = "invalid_request"  # the request cannot be served as sent
    UNAUTHORIZED = "authentication_error"
    FORBIDDEN = "permission_denied"  # a key was given, but not one that may do this
    NOT_FOUND = "model_not_found"
    TOO_LARGE = "payload_too_large"
    UNSUPPORTED_MEDIA = "unsupported_media_type"
    RATE_LIMITED = "rate_limited"  # this worker's in-flight limit
    OVERLOADED = "overloaded"  # queued work would not finish within the deadline: shed at once
    UNAVAILABLE = "unavailable"  # Triton or the model is not there (restart, unload, shutdown)
    UPSTREAM = "upstream_error"  # Triton answered something the contract does not allow
    TIMEOUT = "timeout"
    NOT_IMPLEMENTED = "not_implemented"  # the deployment cannot do this (e.g. no tokenizer readable here)
    UNSUPPORTED_OUTPUT = "unsupported_output"  # the model has no such output (e.g. /embed_sparse on a dense model)
    INTERNAL = "internal_error"


# Error types of the peer-protocol routes (api/tei.py, api/cohere.py), more specific than their kind.
EMPTY_INPUT = "empty_input"  # INVALID: an empty text or list (what TEI answers as its `Empty`, 400)
UNSUPPORTED_OPTION = "unsupported_option"  # INVALID: a protocol option the gateway cannot honour exactly


class GatewayError(Exception):
    """A failure with a kind, a client-facing message and, for shedding, a retry hint in seconds."""

    def __init__(
        self, kind: ErrorKind, message: str, *, type: str | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.type = type or kind.value
        self.retry_after_s = retry_after_s


def invalid(message: str, type: str = ErrorKind.INVALID.value) -> GatewayError:
    """A 4xx for a request that cannot be served as sent."""
    return GatewayError(ErrorKind.INVALID, message, type=type)


def unavailable(message: str, type: str = "triton_unavailable", retry_after_s: float = 1.0) -> GatewayError:
    """Triton, a model or this worker cannot serve right now; a retry shortly may succeed."""
    return GatewayError(ErrorKind.UNAVAILABLE, message, type=type, retry_after_s=retry_after_s)
