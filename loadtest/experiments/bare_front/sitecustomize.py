"""The floor of a Python front end (issue 20's fourteenth pass): put this directory first on PYTHONPATH with
BARE_FRONT=bare or BARE_FRONT=logged, and every POST /embed is served by the connection's protocol itself instead of
uvicorn's ASGI cycle and the gateway's ASGI layers:

    PYTHONPATH=loadtest/experiments/bare_front:$PYTHONPATH BARE_FRONT=bare python3 -m loadtest bench7 ...

- `bare`: httptools' parse (uvicorn's protocol, as shipped), one pydantic validation straight from the JSON bytes,
  the embed service (the same tokenizer, scheduler and Triton client objects as the shipped route), one orjson dump
  of the answer, one write. No ASGI cycle, no layers, no access log, no request metrics.
- `logged`: the same, plus what the shipped layers must do for such a request: a request id echoed in a header, the
  request's metrics and its access-log line (api/middleware.py's `record`), the token counter.

Every other request (and every other path) takes the shipped path. What `bare` serves beyond the shipped gateway is the
most any leaner Python front end over the same service could give on that host; `logged` is what one that keeps the
gateway's observability could. Python runs a `sitecustomize` in every process at start, the gateway's spawned workers
included; the patch is applied when gateway.http_protocol is first imported. Without BARE_FRONT it does nothing.
"""

import os
import runpy
import time

MODE = os.environ.get("BARE_FRONT", "")
TARGET = "gateway.http_protocol"
# run by its path: no package of the checkout need be importable yet
ON_IMPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "_shared", "on_import.py")


def _patch(module):
    import orjson
    from pydantic import ValidationError

    from gateway.api.errors import gateway_error_response
    from gateway.api.middleware import _request_ids, record
    from gateway.api.routes import texts_of
    from gateway.api.schemas import EmbedRequest
    from gateway.errors import GatewayError
    from gateway.metrics import TOKENS
    from gateway.service.prompts import Prompt

    logged = MODE == "logged"
    base = module.NoDelayHttpToolsProtocol

    class State:
        __slots__ = ("model", "inputs", "request_id")

        def __init__(self):
            self.model, self.inputs, self.request_id = "", 0, ""

    def services_of(app):
        while not hasattr(getattr(app, "state", None), "services"):
            app = app.app
        return app.state.services

    def head(status, length, extra=b""):
        reason = b"OK" if status == 200 else b"Error"
        return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n"
                % (status, reason, length, extra))

    async def serve(proto, body, keep_alive):
        start = time.perf_counter()
        state = State()
        try:
            request = EmbedRequest.model_validate_json(body)
            result = await services_of(proto.app).embed.embed(
                state, request.model, texts_of(request.inputs), prompt=Prompt(request.prompt_name),
                normalize=request.normalize, dimensions=request.dimensions, truncate=request.truncate,
                direction=request.truncation_direction, backend=request.backend)
            vectors = result.vectors
            status, payload = 200, orjson.dumps(
                {"model": result.model, "embeddings": vectors, "dimensions": int(vectors.shape[1]),
                 "usage": {"tokens": result.tokens}}, option=orjson.OPT_SERIALIZE_NUMPY)
            if logged:
                TOKENS.labels("/embed", result.model).inc(result.tokens)
        except GatewayError as exc:
            response = gateway_error_response(exc)
            status, payload = response.status_code, bytes(response.body)
        except ValidationError as exc:
            status, payload = 422, orjson.dumps({"error": {"type": "invalid_request", "message": str(exc)[:500]}})
        extra = b""
        if logged:
            state.request_id = _request_ids.new()
            extra = b"x-request-id: %s\r\n" % state.request_id.encode()
        if not proto.transport.is_closing():
            proto.transport.write(head(status, len(payload), extra) + payload)
            if not keep_alive:
                proto.transport.close()
        if logged:
            record({"path": "/embed", "method": "POST"},
                   {"request_id": state.request_id, "model": state.model, "inputs": state.inputs},
                   status, time.perf_counter() - start)

    class BareEmbedProtocol(base):
        _bare = False

        def on_headers_complete(self):
            if (self.parser.get_method() == b"POST" and self.url == b"/embed"
                    and (self.cycle is None or self.cycle.response_complete)):
                self._bare, self._chunks = True, []
                return
            self._bare = False
            super().on_headers_complete()

        def on_body(self, body):
            if self._bare:
                self._chunks.append(body)
            else:
                super().on_body(body)

        def on_message_complete(self):
            if not self._bare:
                super().on_message_complete()
                return
            self._bare = False
            task = self.loop.create_task(serve(self, b"".join(self._chunks), self.parser.should_keep_alive()))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    module.NoDelayHttpToolsProtocol = BareEmbedProtocol


if MODE in ("bare", "logged"):
    runpy.run_path(ON_IMPORT)["patch_on_import"](TARGET, _patch)
