"""The routes the edge serves (api/edge.py), derived from the app's FastAPI routes: every POST route.

A route is declared once, by its router (`@api.post("/embed", ...)`): FastAPI documents it (OpenAPI, /docs) and
the edge serves it, by the same handler. The edge does for it what FastAPI would: the JSON check (415), one parse of
the body (orjson), the body model's validation, the handler. A handler's parameters may be the body model, the path's
parameter (one whole segment, such as /tei/{model}) and the `Request`; the app factory refuses any other, so that no
route is ever served another way. `@runs(task)` marks a handler that runs a model of that task: while the model sheds
load, the edge refuses its requests before their bodies are validated.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import orjson
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import Scope, Message, Receive

from contract import Task
from gateway.api.errors import validation_error
from gateway.errors import ErrorType, GatewayError

Handler = Callable[..., Awaitable[Response]]
H = TypeVar("H", bound=Handler)
RunsTask = Task | Literal[""]  # "": the task of the model the request names
_RUNS = "runs_task"


def runs(task: Task | None) -> Callable[[H], H]:
    """Mark a handler as running a model of `task` (None: the model's own task, whichever it is)."""
    def mark(handler: H) -> H:
        setattr(handler, _RUNS, task or "")
        return handler
    return mark


def json_media_error(content_type: str) -> GatewayError | None:
    """The 415 of a POST body not declared as JSON (a form or text body would fail obscurely later)."""
    media = content_type.partition(";")[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        return GatewayError(ErrorType.UNSUPPORTED_MEDIA_TYPE, "send the body as JSON with Content-Type: "
                            f"application/json (got {media or 'no Content-Type'!r})")
    return None


def _unparsable(cause: Exception) -> GatewayError:
    """Why a body json.loads failed on is no JSON for this API."""
    if isinstance(cause, UnicodeDecodeError):
        reason = f": not UTF-8 text (invalid byte at position {cause.start})"
    elif isinstance(cause, RecursionError):
        reason = " for this API: nested too deeply"
    elif isinstance(cause, ValueError) and not isinstance(cause, json.JSONDecodeError):
        reason = " for this API: a number too long"  # an integer literal of more than 4300 digits
    else:
        reason = ""
    return GatewayError(ErrorType.INVALID_JSON, f"request body is not valid JSON{reason}")


def json_object(body: bytes) -> dict[str, Any]:
    """The body's JSON object; a 400 when it is no JSON, a 422 when it is JSON but no object."""
    if not body.strip():
        raise GatewayError(ErrorType.INVALID_JSON, "request body is empty: send a JSON object")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:  # JSON orjson refuses that json.loads reads, such as a lone surrogate's escape: the model says why
            data = json.loads(body)
        except Exception as exc:  # noqa: BLE001 - any failure to read it is the client's
            raise _unparsable(exc) from None
    if not isinstance(data, dict):
        raise GatewayError(ErrorType.VALIDATION_ERROR, f"request body must be a JSON object, not {_kind(data)}")
    return data


def _kind(value: object) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def _replay(body: bytes) -> Receive:
    """A receive that gives the body read already (to `Request.body()`)."""
    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}
    return receive


@dataclass(frozen=True, slots=True, eq=False)
class EdgeRoute:
    """One POST route: its FastAPI route, template, body model (None: the handler reads the body itself) and the task
    it runs (None: no model, or not one the edge sheds for)."""

    route: APIRoute
    path: str
    body: type[BaseModel] | None
    task: RunsTask | None
    handler: Handler
    arguments: tuple[str, ...]  # per parameter of the handler: "body", "request" or "path"
    json_body: bool  # it takes a JSON body (a body model, or a request body its OpenAPI declares): 415 otherwise
    prefix: str = ""  # the template around its path parameter, if it has one
    suffix: str = ""

    def path_model(self, path: str) -> str | None:
        """The value of the path's parameter (the model /tei/{model} names), or None."""
        return path[len(self.prefix):len(path) - len(self.suffix)] if self.prefix else None

    async def respond(self, scope: Scope, body: bytes, content_type: bytes) -> Response:
        """The handler's answer to `body` (scope: the handler's `Request`): JSON check, parse, validation, handler."""
        if self.json_body and (media := json_media_error(content_type.decode("latin-1"))) is not None:
            raise media
        parsed = None
        if self.body is not None:
            try:
                parsed = self.body.model_validate(json_object(body))
            except ValidationError as exc:
                raise validation_error(exc.errors(include_url=False)) from None
        request = Request(scope, _no_body if self.body is not None else _replay(body))
        values = {"body": parsed, "request": request, "path": self.path_model(scope["path"])}
        return await self.handler(*[values[kind] for kind in self.arguments])


def _edge_route(route: APIRoute) -> EdgeRoute:
    """`route` as the edge serves it; a TypeError for a handler the edge cannot call."""
    where = f"POST {route.path} ({route.endpoint.__qualname__})"
    params = [*route.param_convertors]
    prefix = suffix = ""
    if len(params) > 1:
        raise TypeError(f"{where}: the edge serves routes with at most one path parameter")
    if params:
        prefix, _, rest = route.path.partition("{")
        suffix = rest.partition("}")[2]
        whole_segment = getattr(route.param_convertors[params[0]], "regex", "") == "[^/]+"
        if not (prefix.endswith("/") and suffix[:1] in ("", "/") and whole_segment):
            raise TypeError(f"{where}: the edge serves a path parameter that is one whole segment")
    hints = typing.get_type_hints(route.endpoint)
    arguments, body = [], None
    for name in inspect.signature(route.endpoint).parameters:
        hint = hints.get(name)
        if hint is Request:
            arguments.append("request")
        elif name in params and hint is str:
            arguments.append("path")
        elif isinstance(hint, type) and issubclass(hint, BaseModel) and body is None:
            arguments.append("body")
            body = hint
        else:
            raise TypeError(f"{where}: parameter {name!r} is neither the body model, the path's parameter nor the "
                            "Request, so the edge cannot serve it")
    json_body = body is not None or "requestBody" in (route.openapi_extra or {})
    return EdgeRoute(route, route.path, body, getattr(route.endpoint, _RUNS, None), route.endpoint, tuple(arguments),
                     json_body, prefix, suffix)


class RouteTable:
    """Every POST route of an app's routes, found by the request's path."""

    def __init__(self, routes: Iterable[BaseRoute]) -> None:
        self.all = list(routes)
        self.fixed: dict[str, EdgeRoute] = {}
        self.templated: dict[str, dict[str, EdgeRoute]] = {}  # prefix -> suffix -> route
        for route in self.all:
            if isinstance(route, APIRoute) and route.methods == {"POST"}:
                served = _edge_route(route)
                if served.prefix:
                    self.templated.setdefault(served.prefix, {})[served.suffix] = served
                else:
                    self.fixed[served.path] = served

    def match(self, method: str, path: str) -> EdgeRoute | None:
        """The route a request to `path` (percent-decoded, no query) takes, or None (FastAPI's router answers it)."""
        if method != "POST":
            return None
        found = self.fixed.get(path)
        if found is not None or not self.templated:
            return found
        for prefix, by_suffix in self.templated.items():
            if path.startswith(prefix):
                value, slash, rest = path[len(prefix):].partition("/")
                if value:
                    found = by_suffix.get(slash + rest)
                    if found is not None:
                        return found
        return None

    def template(self, path: str) -> str:
        """The route template a request for no route of the table is counted on: the first of the app's routes whose
        path matches it (FastAPI's router takes the same), else "unmatched"."""
        for route in self.all:
            regex = getattr(route, "path_regex", None)
            if regex is not None and regex.match(path):
                return str(getattr(route, "path"))
        return "unmatched"
