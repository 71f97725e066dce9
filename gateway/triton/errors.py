"""Triton's failures as gateway errors, and the few of them the client acts on itself (a region Triton lost,
a region still in use)."""

from __future__ import annotations

from typing import Literal

from tritonclient.utils import InferenceServerException

from gateway.errors import ErrorKind, ErrorType, GatewayError, unavailable


def status_name(exc: InferenceServerException) -> str:
    """The gRPC status code name of a failure ("NOT_FOUND", ...); "" for one tritonclient raised itself."""
    return str(exc.status() or "").removeprefix("StatusCode.")


def translate_error(exc: InferenceServerException) -> GatewayError:
    """Map a Triton/gRPC failure to a gateway error: by its gRPC status code first, by Triton's message only
    where one code covers several cases (the messages are pinned in tests/gateway/test_triton_errors.py)."""
    status, message = status_name(exc), exc.message() or str(exc)
    lower = message.lower()
    if status == "DEADLINE_EXCEEDED":
        return GatewayError(ErrorType.TIMEOUT, "Triton did not answer within the deadline")
    if status == "CANCELLED":
        return GatewayError(ErrorType.TIMEOUT, "the Triton call was cancelled")
    if status == "UNAVAILABLE":  # Triton unreachable or stopping, or a model's queue refusing work
        if "exceeds maximum queue size" in lower:  # an opt-in queue policy (max_queue_size)
            return GatewayError(ErrorType.OVERLOADED, "the model's queue is full", retry_after_s=1)
        if "timeout expired" in lower:  # an opt-in queue policy: the request waited past its `timeout`
            return GatewayError(ErrorType.TIMEOUT, "the request expired in Triton's queue")
        return unavailable("Triton is unavailable")
    if status == "NOT_FOUND" and not shm_missing(exc):  # unknown, unloaded or still loading
        return unavailable(f"model not available in Triton: {message}", type=ErrorType.MODEL_UNAVAILABLE)
    return GatewayError(ErrorType.TRITON_ERROR, f"Triton error: {message}")


def shm_missing(exc: InferenceServerException) -> bool:
    """A call named a region Triton does not know (it restarted and lost the registrations)."""
    return status_name(exc) == "NOT_FOUND" and "shared memory region" in (exc.message() or "").lower()


def in_use(exc: InferenceServerException) -> bool:
    """Triton refused to unregister a region a request still holds."""
    return status_name(exc) == "INTERNAL" and "currently in use" in (exc.message() or "").lower()


def repository_error(exc: InferenceServerException, model: str, action: Literal["load", "unload"]) -> GatewayError:
    """A failed load or unload: Triton unreachable, or Triton's reason (e.g. a model that does not load)."""
    error = translate_error(exc)
    if error.kind in (ErrorKind.UNAVAILABLE, ErrorKind.TIMEOUT) and error.type is not ErrorType.MODEL_UNAVAILABLE:
        return error
    failed = ErrorType.LOAD_FAILED if action == "load" else ErrorType.UNLOAD_FAILED
    return GatewayError(failed, f"Triton could not {action} {model}: {exc.message() or exc}")


def contract_mismatch(model: str, detail: str) -> GatewayError:
    """Triton's answer does not have the shape the repository contract gives it."""
    return GatewayError(ErrorType.CONTRACT_MISMATCH, f"{model} answered outside the repository contract: {detail}")
