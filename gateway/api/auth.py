"""Optional bearer API keys (off when GATEWAY_API_KEYS is empty); keys are never logged."""

from __future__ import annotations

import hmac

from fastapi import Request

from gateway.errors import ErrorKind, GatewayError


def key_matches(supplied: bytes, keys: list[str]) -> bool:
    """Whether `supplied` is one of `keys`, compared in constant time against every key."""
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(supplied, key.encode())
    return matched


async def require_api_key(request: Request) -> None:
    """FastAPI dependency: 401 unless `Authorization: Bearer <key>` names a configured key."""
    keys: list[str] = request.app.state.runtime.settings.api_keys
    if not keys:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise GatewayError(ErrorKind.UNAUTHORIZED, "missing bearer API key")
    if not key_matches(token.strip().encode(), keys):
        raise GatewayError(ErrorKind.UNAUTHORIZED, "invalid API key")
