"""The inference routes without FastAPI's per-request machinery (an ASGI layer in front of the router).

A POST to a route of the routers given (each handler `async def route(body: Model, request) -> Response`,
at a fixed path) is served here: the JSON check, one parse of the body (orjson), the model's
validation, the handler, its response. That is the work FastAPI does for these routes, less its
routing, dependency solving and per-request wrappers, which cost about a quarter of a worker's CPU
per single-text request (loadtest/results). FastAPI keeps the same routes: they document the API
(OpenAPI, /docs) and serve every other method. Errors are the ones FastAPI's path gives, word
for word (api/errors.py formats both).

`model_routes` makes the same of the POST routes under a model's path (api/tei.py's /tei/{model}/...), whose
handlers take the model's name first; only api/direct.py serves those.
"""

from __future__ import annotations

import functools
import json
import typing
from collections.abc import Awaitable, Callable, Iterable

import orjson
from fastapi import APIRouter
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request, empty_receive
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.errors import gateway_error_response, unparsable_body_response, validation_error_response
from gateway.api.routes import json_media_error
from gateway import tracing
from gateway.errors import GatewayError

Handler = Callable[..., Awaitable[Response]]  # (body, request), or (request) for a handler that reads its body


HotRoute = tuple[APIRoute, type[BaseModel] | None, Handler, bool]  # body model None: the handler reads the body


def hot_routes(routers: Iterable[APIRouter]) -> dict[str, HotRoute]:
    """path -> (route, body model, handler, JSON check) of every POST route at a fixed path whose handler
    takes exactly (body, request)."""
    table: dict[str, HotRoute] = {}
    for router in routers:
        for route in router.routes:
            if not (isinstance(route, APIRoute) and route.methods == {"POST"} and not route.param_convertors):
                continue
            hints = typing.get_type_hints(route.endpoint)
            params = [name for name in hints if name != "return"]
            body = hints.get(params[0]) if params else None
            if len(params) == 2 and hints[params[1]] is Request and isinstance(body, type) and issubclass(body, BaseModel):
                table[route.path] = (route, body, route.endpoint, _json_check(route))
    return table


def model_routes(router: APIRouter) -> dict[str, HotRoute]:
    """Path after the prefix (`/embed`, "" for the prefix itself) -> hot route of every POST route of a router at
    `.../{model}`, whose handler takes (model, body, request), or (model, request) when it reads the body itself.
    `bind` gives a request's handler its model."""
    assert router.prefix.endswith("/{model}"), router.prefix
    table: dict[str, HotRoute] = {}
    for route in router.routes:
        if not (isinstance(route, APIRoute) and route.methods == {"POST"} and [*route.param_convertors] == ["model"]):
            continue
        hints = typing.get_type_hints(route.endpoint)
        params = [hints[name] for name in hints if name != "return"]
        body = params[1] if len(params) == 3 else None
        if (params[:1] == [str] and params[-1:] == [Request]
                and (len(params) == 2 or isinstance(body, type) and issubclass(body, BaseModel))):
            table[route.path.removeprefix(router.prefix)] = (route, body, route.endpoint, _json_check(route))
    return table


def bind(entry: HotRoute, model: str) -> HotRoute:
    """A `model_routes` entry for a request naming `model` (passed as FastAPI passes the path parameter)."""
    route, body, handler, json_check = entry
    return route, body, functools.partial(handler, model), json_check


def _json_check(route: APIRoute) -> bool:
    return any(getattr(d.dependency, "__name__", "") == "require_json" for d in route.dependencies)


class HotRoutes:
    """Serves the routes of `hot_routes` directly; everything else goes on to the app."""

    def __init__(self, app: ASGIApp, routes: dict[str, HotRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        entry = self.routes.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if entry is None:
            await self.app(scope, receive, send)
            return
        scope["route"] = entry[0]  # what routing sets: the access log and metrics name the route by it
        tracing.route_selected("POST", entry[0].path)
        response = await respond(entry, scope, await _read_body(receive), receive)
        await response(scope, receive, send)


async def respond(entry: HotRoute, scope: Scope, body: bytes, receive: Receive = empty_receive) -> Response:
    """The answer of a hot route to a request (`scope`, whose route is set) with `body`: the JSON check, the
    parse, the model's validation, the handler; a domain error (or a handler's validation error) as its response."""
    _, model, handler, json_check = entry
    try:
        if json_check and (media := json_media_error(_content_type(scope))) is not None:
            raise media
        if model is None:
            return await handler(Request(scope, _replay(body)))
        parsed = _parse(body, model)
        if isinstance(parsed, BaseModel):
            return await handler(parsed, Request(scope, receive))
        return parsed
    except GatewayError as exc:
        return gateway_error_response(exc)
    except RequestValidationError as exc:  # raised by a handler that validates its body itself, as FastAPI answers it
        return validation_error_response(exc.errors())


def _replay(body: bytes) -> Receive:
    """A receive that gives the body read already (to `Request.body()`)."""
    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}
    return receive


def _content_type(scope: Scope) -> str:
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == b"content-type"), "")


def _parse(body: bytes, model: type[BaseModel]) -> BaseModel | Response:
    """The body as `model`, or the error response FastAPI's path gives for it."""
    if not body:
        return validation_error_response([{"type": "missing", "loc": (), "msg": "Field required"}])
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:  # what FastAPI (json.loads) makes of it: some bodies orjson refuses are JSON to it
            data = json.loads(body)
        except json.JSONDecodeError:
            return validation_error_response([{"type": "json_invalid", "loc": (), "msg": "JSON decode error"}])
        except Exception as exc:  # noqa: BLE001 - FastAPI answers any other parse failure with a 400
            return unparsable_body_response(exc)
    if not isinstance(data, dict):
        return validation_error_response([{"type": "model_attributes_type", "loc": (),
                                           "msg": "Input should be a valid dictionary or object to extract fields "
                                                  "from"}])
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        return validation_error_response(exc.errors(include_url=False))


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message: Message = await receive()
        if message["type"] != "http.request":
            return b""  # the client left; nobody reads the answer
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)
