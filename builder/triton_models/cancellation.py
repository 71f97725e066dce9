"""Shared by the python-backend models of the repository (copied next to each model.py): requests
their caller abandoned are answered with an error instead of being run."""

import time

import triton_python_backend_utils as pb_utils

# Requests cancelled while they waited (the caller cancelled, or its gRPC deadline passed) are answered
# with an error and left out of the batch. Without a queue policy (the builder's default) Triton 2.51
# hands cancelled queued requests to the model; with one it drops them itself. request.is_cancelled() is one round
# trip to the server per request (on a small CPU, more than tokenizing a short text), so the requests are
# checked only after a long execute(), behind which they may have waited long.
CHECK_CANCELLED_AFTER_S = 0.02


def _cancelled_response():
    """TritonError.CANCELLED exists from Triton 23.10 on; pb_utils gets its classes only once the stub
    runs, so they are looked up here, not at import."""
    code = getattr(pb_utils.TritonError, "CANCELLED", None)
    message = "request cancelled before it ran"
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    return pb_utils.InferenceResponse(error=error)


class SkipCancelled:
    """Wraps execute(requests) -> responses: cancelled requests get an error and are not run."""

    def __init__(self, execute):
        self.execute = execute
        self.previous_s = 0.0  # how long this instance's previous execute() took

    def __call__(self, requests):
        start = time.perf_counter()
        try:
            if self.previous_s < CHECK_CANCELLED_AFTER_S:
                return self.execute(requests)
            cancelled = [request.is_cancelled() for request in requests]
            if not any(cancelled):
                return self.execute(requests)
            live = iter(self.execute([r for r, c in zip(requests, cancelled) if not c]) if not all(cancelled) else ())
            return [_cancelled_response() if c else next(live) for c in cancelled]
        finally:
            self.previous_s = time.perf_counter() - start
