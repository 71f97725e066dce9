"""Optional bearer API keys (off when GATEWAY_API_KEYS is empty)."""

from __future__ import annotations

import hmac

from fastapi import Request

from gateway.api.errors import Unauthorized


async def require_api_key(request: Request) -> None:
    """FastAPI dependency: 401 unless `Authorization: Bearer <key>` names a configured key."""
    keys: list[str] = request.app.state.runtime.settings.api_keys
    if not keys:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized("missing bearer API key")
    supplied = token.strip().encode()
    if not any(hmac.compare_digest(supplied, k.encode()) for k in keys):
        raise Unauthorized("invalid API key")
