"""Optional bearer API keys (off when GATEWAY_API_KEYS is empty); keys are never logged.

Checked by the edge (api/edge.py) before the body is read, so a client without a key
costs no body parsing. Health, readiness, metrics and the docs stay public (TEI's split), and so
does each model's TEI health route, `/tei/{model}/health`.
The admin routes (/admin/...) take only admin keys (GATEWAY_ADMIN_KEYS) and are off without one.
"""

from __future__ import annotations

import hmac

from gateway.api.probes import PROBE_PATHS
from gateway.api.tei_errors import TEI_PREFIX
from gateway.errors import ErrorType, GatewayError

PUBLIC_PATHS = PROBE_PATHS | {"/docs", "/openapi.json"}
ADMIN_PREFIX = "/admin/"


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.startswith("/docs/") or is_tei_health(path)


def is_tei_health(path: str) -> bool:
    """`/tei/{model}/health`: public, as text-embeddings-inference's own /health is."""
    model, _, rest = path.removeprefix(TEI_PREFIX).partition("/")
    return path.startswith(TEI_PREFIX) and bool(model) and rest == "health"


def key_matches(supplied: bytes, keys: list[str]) -> bool:
    """Whether `supplied` is one of `keys`, compared in constant time against every key."""
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(supplied, key.encode())
    return matched


def bearer_token(authorization: str) -> bytes | None:
    """The key of an `Authorization: Bearer <key>` header, or None."""
    scheme, _, token = authorization.partition(" ")
    return token.strip().encode() if scheme.lower() == "bearer" and token else None


def check_api_key(authorization: str, keys: list[str]) -> GatewayError | None:
    """None when `keys` is empty or the `Authorization: Bearer <key>` header names one, else the 401."""
    if not keys:
        return None
    token = bearer_token(authorization)
    if token is None:
        return GatewayError(ErrorType.AUTHENTICATION_ERROR, "missing bearer API key")
    if not key_matches(token, keys):
        return GatewayError(ErrorType.AUTHENTICATION_ERROR, "invalid API key")
    return None


def is_admin(path: str) -> bool:
    return path.startswith(ADMIN_PREFIX) or path == ADMIN_PREFIX.rstrip("/")


def check_admin_key(authorization: str, admin_keys: list[str]) -> GatewayError | None:
    """None when the header names an admin key; 404 when no admin key is set (the routes are off),
    401 without a bearer key, 403 with a key that is not an admin key (an API key, or a wrong one)."""
    if not admin_keys:
        return GatewayError(ErrorType.NOT_FOUND, "the admin API is off: set GATEWAY_ADMIN_KEYS to enable it")
    token = bearer_token(authorization)
    if token is None:
        return GatewayError(ErrorType.AUTHENTICATION_ERROR, "missing bearer admin key")
    if not key_matches(token, admin_keys):
        return GatewayError(ErrorType.FORBIDDEN, "this key may not use the admin API")
    return None
