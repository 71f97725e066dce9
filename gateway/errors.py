"""The gateway's error vocabulary, shared by every layer (service, Triton client, HTTP).

`ErrorType` is every `type` a client can see in `{"error": {"type", "message"}}`, each member with its
`ErrorKind`: what went wrong, in the terms the HTTP edge maps to a status code (`api/errors.py` is
the only place that knows the codes; text-embeddings-inference's `ErrorType` split). Code below the
edge raises `GatewayError(ErrorType.X, message)`; control flow compares members, never strings.
gateway/README.md's error table documents every member (tests/gateway/test_error_types.py checks it).
"""

from __future__ import annotations

from enum import Enum, StrEnum, auto


class ErrorKind(Enum):
    """What went wrong, in terms the HTTP edge maps to a status code."""

    INVALID = auto()  # the request cannot be served as sent
    VALIDATION = auto()  # a field of the wrong type or shape (the request models' validation)
    UNAUTHORIZED = auto()
    FORBIDDEN = auto()  # a key was given, but not one that may do this
    NOT_FOUND = auto()
    METHOD_NOT_ALLOWED = auto()
    TOO_LARGE = auto()
    HEADERS_TOO_LARGE = auto()  # the request's head past the bound: its headers are not read
    REQUEST_TIMEOUT = auto()  # the client did not send its request in time
    UNSUPPORTED_MEDIA = auto()
    UNSUPPORTED_OUTPUT = auto()  # the model has no such output (e.g. /embed_sparse on a dense model)
    RATE_LIMITED = auto()  # this worker's in-flight limit
    INTERNAL = auto()
    NOT_IMPLEMENTED = auto()  # the deployment cannot do this (e.g. no tokenizer readable here)
    UPSTREAM = auto()  # Triton answered something the contract does not allow
    OVERLOADED = auto()  # queued work would not finish within the deadline: shed at once
    UNAVAILABLE = auto()  # Triton or the model is not there (restart, unload, shutdown)
    TIMEOUT = auto()


class ErrorType(StrEnum):
    """Every public error type, with its kind (`ErrorType.WRONG_TASK.kind is ErrorKind.INVALID`)."""

    kind: ErrorKind

    def __new__(cls, value: str, kind: ErrorKind) -> ErrorType:
        member = str.__new__(cls, value)
        member._value_ = value
        member.kind = kind
        return member

    # 400: the request names something the served models do not offer, or cannot be read
    INVALID_REQUEST = "invalid_request", ErrorKind.INVALID
    INVALID_JSON = "invalid_json", ErrorKind.INVALID
    INVALID_UNICODE = "invalid_unicode", ErrorKind.INVALID
    WRONG_TASK = "wrong_task", ErrorKind.INVALID
    MODEL_REQUIRED = "model_required", ErrorKind.INVALID
    BACKEND_NOT_AVAILABLE = "backend_not_available", ErrorKind.INVALID
    UNSUPPORTED_DIMENSIONS = "unsupported_dimensions", ErrorKind.INVALID
    UNKNOWN_PROMPT = "unknown_prompt", ErrorKind.INVALID
    PAIRS_REQUIRED = "pairs_required", ErrorKind.INVALID
    PAIRS_NOT_SUPPORTED = "pairs_not_supported", ErrorKind.INVALID
    INVALID_TOKEN_ID = "invalid_token_id", ErrorKind.INVALID
    TOKEN_INPUT_UNSUPPORTED = "token_input_unsupported", ErrorKind.INVALID
    PROMPT_WITH_TOKEN_INPUT = "prompt_with_token_input", ErrorKind.INVALID
    EMPTY_INPUT = "empty_input", ErrorKind.INVALID  # /tei/: an empty text or list (TEI's `Empty`)
    UNSUPPORTED_OPTION = "unsupported_option", ErrorKind.INVALID  # a protocol option not honoured exactly
    NOT_CALIBRATED = "not_calibrated", ErrorKind.INVALID  # int8/uint8 of a model built without calibrated ranges
    VALIDATION_ERROR = "validation_error", ErrorKind.VALIDATION
    AUTHENTICATION_ERROR = "authentication_error", ErrorKind.UNAUTHORIZED
    FORBIDDEN = "forbidden", ErrorKind.FORBIDDEN
    MODEL_NOT_FOUND = "model_not_found", ErrorKind.NOT_FOUND
    NOT_FOUND = "not_found", ErrorKind.NOT_FOUND  # no such route (or the admin API is off)
    METHOD_NOT_ALLOWED = "method_not_allowed", ErrorKind.METHOD_NOT_ALLOWED
    BODY_TOO_LARGE = "body_too_large", ErrorKind.TOO_LARGE
    TOO_MANY_INPUTS = "too_many_inputs", ErrorKind.TOO_LARGE
    INPUT_TOO_LONG = "input_too_long", ErrorKind.TOO_LARGE
    ANSWER_TOO_LARGE = "answer_too_large", ErrorKind.TOO_LARGE  # a small request whose answer would be huge
    HEADERS_TOO_LARGE = "headers_too_large", ErrorKind.HEADERS_TOO_LARGE
    REQUEST_TIMEOUT = "request_timeout", ErrorKind.REQUEST_TIMEOUT
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type", ErrorKind.UNSUPPORTED_MEDIA
    SPARSE_NOT_SUPPORTED = "sparse_not_supported", ErrorKind.UNSUPPORTED_OUTPUT
    OUTPUT_NOT_AVAILABLE = "output_not_available", ErrorKind.UNSUPPORTED_OUTPUT
    RATE_LIMITED = "rate_limited", ErrorKind.RATE_LIMITED
    INTERNAL_ERROR = "internal_error", ErrorKind.INTERNAL
    TOKENIZER_UNAVAILABLE = "tokenizer_unavailable", ErrorKind.NOT_IMPLEMENTED
    PIPELINE_UNSUPPORTED = "pipeline_unsupported", ErrorKind.NOT_IMPLEMENTED
    TRITON_ERROR = "triton_error", ErrorKind.UPSTREAM
    LOAD_FAILED = "load_failed", ErrorKind.UPSTREAM
    UNLOAD_FAILED = "unload_failed", ErrorKind.UPSTREAM
    CONTRACT_MISMATCH = "contract_mismatch", ErrorKind.UPSTREAM
    OVERLOADED = "overloaded", ErrorKind.OVERLOADED
    TOO_MANY_CONNECTIONS = "too_many_connections", ErrorKind.OVERLOADED
    TRITON_UNAVAILABLE = "triton_unavailable", ErrorKind.UNAVAILABLE
    MODEL_UNAVAILABLE = "model_unavailable", ErrorKind.UNAVAILABLE
    MODEL_LOADING = "model_loading", ErrorKind.UNAVAILABLE
    SHUTTING_DOWN = "shutting_down", ErrorKind.UNAVAILABLE
    TIMEOUT = "timeout", ErrorKind.TIMEOUT


class GatewayError(Exception):
    """A failure with a public type (and so a kind), a client-facing message and, for shedding and
    unavailability, a retry hint in seconds."""

    def __init__(self, type: ErrorType, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.type = type
        self.kind = type.kind
        self.message = message
        self.retry_after_s = retry_after_s


def invalid(message: str, type: ErrorType = ErrorType.INVALID_REQUEST) -> GatewayError:
    """A 4xx for a request that cannot be served as sent."""
    assert type.kind is ErrorKind.INVALID, type
    return GatewayError(type, message)


def unavailable(message: str, type: ErrorType = ErrorType.TRITON_UNAVAILABLE, retry_after_s: float = 1.0) -> GatewayError:
    """Triton, a model or this worker cannot serve right now; a retry shortly may succeed."""
    return GatewayError(type, message, retry_after_s=retry_after_s)
