"""Triton's failures as gateway errors, and the few of them the client acts on itself (a region Triton lost,
a region still in use, a repository key Triton refused).

What a client is answered names no Triton internals: Triton's own message (its model names, file paths, a python
model's traceback) is logged here, and the answer says what failed in plain words. An admin call's answer keeps
Triton's reason in short: its first line, file paths by their file name only.
"""

from __future__ import annotations

import logging
import re
from typing import Literal

from tritonclient.utils import InferenceServerException

from gateway.errors import ErrorType, GatewayError, unavailable

log = logging.getLogger("gateway.triton")
# Triton's answer to a call of a protocol restricted with --grpc-restricted-protocol (or --http-restricted-api)
# when the call does not carry the protocol's key
RESTRICTED = "is restricted, expecting header"
_PATH = re.compile(r"(?<![\w.])(?:/[^\s'\":,()/]+)+/([^\s'\":,()/]*)")
REASON_CHARS = 300


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
        if RESTRICTED in lower:  # a deployment mistake, not an outage: say which setting fixes it
            log.error("Triton refused a repository call for want of its key: %s", message)
            return GatewayError(ErrorType.TRITON_ERROR, "Triton's model-repository API refused the gateway's key: "
                                "GATEWAY_TRITON_REPOSITORY_KEY_FILE must hold the key Triton restricts it with")
        return unavailable("Triton is unavailable")
    if status == "NOT_FOUND" and not shm_missing(exc):  # unknown, unloaded or still loading
        log.debug("model not available in Triton: %s", message)
        return unavailable("the model is not available in Triton (unloaded, or not loaded yet)",
                           type=ErrorType.MODEL_UNAVAILABLE)
    log.warning("Triton error (%s): %s", status or "no status", message)
    return GatewayError(ErrorType.TRITON_ERROR, "Triton failed the call (its reason is in the gateway's log)")


def shm_missing(exc: InferenceServerException) -> bool:
    """A call named a region Triton does not know (it restarted and lost the registrations)."""
    return status_name(exc) == "NOT_FOUND" and "shared memory region" in (exc.message() or "").lower()


def in_use(exc: InferenceServerException) -> bool:
    """Triton refused to unregister a region a request still holds."""
    return status_name(exc) == "INTERNAL" and "currently in use" in (exc.message() or "").lower()


def plain_reason(reason: str) -> str:
    """Triton's reason as an admin answer gives it: the first line (a python model's traceback follows it), each
    file path by its file name (the server's layout is not the client's business), at most REASON_CHARS."""
    first = next((line.strip() for line in reason.splitlines() if line.strip()), "")
    first = _PATH.sub(lambda m: m.group(1) or "/", first)
    return first if len(first) <= REASON_CHARS else first[: REASON_CHARS - 3] + "..."


def repository_error(exc: InferenceServerException, model: str, action: Literal["load", "unload"]) -> GatewayError:
    """A failed load or unload: Triton unreachable, or Triton's reason (e.g. a model that does not load), in short
    (the whole of it is logged)."""
    if status_name(exc) in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"):
        return translate_error(exc)  # Triton unreachable or stopping, the deadline, or a key it refused
    message = exc.message() or str(exc)
    log.warning("Triton could not %s %s: %s", action, model, message)
    failed = ErrorType.LOAD_FAILED if action == "load" else ErrorType.UNLOAD_FAILED
    return GatewayError(failed, f"Triton could not {action} {model}: {plain_reason(message)}")


def contract_mismatch(model: str, detail: str) -> GatewayError:
    """Triton's answer does not have the shape the repository contract gives it (logged with the model's Triton
    name; the answer names neither)."""
    log.error("%s answered outside the repository contract: %s", model, detail)
    return GatewayError(ErrorType.CONTRACT_MISMATCH, "the model answered outside the repository contract (the "
                        "details are in the gateway's log)")
