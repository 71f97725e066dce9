"""Admin routes: the model families in Triton's repository, and load / unload / reload of one of them.

Guarded by GATEWAY_ADMIN_KEYS at the edge (api/edge.py) (off, 404, when none is set). An operation
answers once Triton has finished it, with the family's state after it. The request's model (a metric label) is the
family only once the repository is known to have it: a name nobody serves adds no series.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.responses import OrjsonResponse
from gateway.api.schemas import ErrorResponse, FamilyList, ModelFamily
from gateway.service.admin import ModelAdmin
from gateway.service.registry import Family

_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": ErrorResponse} for code in (401, 403, 404, 502, 503, 504)}
admin = APIRouter(prefix="/admin/models", tags=["admin"], responses=_ERRORS)


def _admin(request: Request) -> ModelAdmin:
    return request.app.state.admin  # type: ignore[no-any-return]


def _card(request: Request, family: Family) -> dict[str, Any]:
    served = _admin(request).serves(family.name)
    return {"name": family.name, "state": family.state, "reason": family.reason, "served": served,
            "entries": [{"name": e.name, "version": e.version, "state": e.state, "reason": e.reason}
                        for e in family.entries]}


@admin.get("", response_class=OrjsonResponse, responses={200: {"model": FamilyList}})
async def list_families(request: Request) -> Response:
    """Every model family in Triton's repository with its state and its entries' versions."""
    families = await _admin(request).families()
    return OrjsonResponse({"object": "list", "data": [_card(request, f) for f in families.values()]})


@admin.get("/{name}", response_class=OrjsonResponse, responses={200: {"model": ModelFamily}})
async def get_family(name: str, request: Request) -> Response:
    """One model family; 404 when the repository has none of its entries."""
    return OrjsonResponse(_card(request, await _admin(request).family(name, request.state)))


@admin.post("/{name}/load", response_class=OrjsonResponse, responses={200: {"model": ModelFamily}})
async def load_family(name: str, request: Request) -> Response:
    """Load the family (tokenizer and steps with each ensemble); it is served when this answers."""
    return OrjsonResponse(_card(request, await _admin(request).load(name, request.state)))


@admin.post("/{name}/reload", response_class=OrjsonResponse, responses={200: {"model": ModelFamily}})
async def reload_family(name: str, request: Request) -> Response:
    """Load the family again from the repository (after `builder build` published a new version).
    The loaded version answers until the new one is ready: no request fails or waits for it."""
    return OrjsonResponse(_card(request, await _admin(request).load(name, request.state)))


@admin.post("/{name}/unload", response_class=OrjsonResponse, responses={200: {"model": ModelFamily}})
async def unload_family(name: str, request: Request) -> Response:
    """Unload the family: it leaves /v1/models and its requests get 404. Accepted requests finish; answered once
    Triton holds none of its models."""
    return OrjsonResponse(_card(request, await _admin(request).unload(name, request.state)))
