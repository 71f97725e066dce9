"""Optional bearer API keys (off when GATEWAY_API_KEYS is empty); keys are never logged.

Checked by the request-context middleware before the body is read, so a client without a key
costs no body parsing. Health, readiness, metrics and the docs stay public (TEI's split).
"""

from __future__ import annotations

import hmac

from gateway.errors import ErrorKind, GatewayError

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/docs", "/openapi.json"})


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith("/docs/")


def key_matches(supplied: bytes, keys: list[str]) -> bool:
    """Whether `supplied` is one of `keys`, compared in constant time against every key."""
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(supplied, key.encode())
    return matched


def check_api_key(authorization: str, keys: list[str]) -> GatewayError | None:
    """None when `keys` is empty or the `Authorization: Bearer <key>` header names one, else the 401."""
    if not keys:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return GatewayError(ErrorKind.UNAUTHORIZED, "missing bearer API key")
    if not key_matches(token.strip().encode(), keys):
        return GatewayError(ErrorKind.UNAUTHORIZED, "invalid API key")
    return None
