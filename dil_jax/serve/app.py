"""The HTTP side: a Starlette app over an `Engine` (docs/serving.md has the API).

Starlette rather than FastAPI (measured, docs/serving.md "Framework"): the request bodies are
checked by dil_jax.serve.schemas (plain functions that name the field and value in every
error, tested alone), so FastAPI's pydantic layer would check them a second time and answer
its own 422 format; the OpenAPI document is written out here instead (`openapi`), and /docs
renders it without the CDN-hosted Swagger UI FastAPI's /docs loads.

Every route runs through `_route`: the API key (when set, on /v1/*), the body limit, errors
as `{"error": {"field", "message", "value"}}` with their status, and the request metrics.
Requests only parse and wait: reading happens in the engine's worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import logging
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from dil_jax.errors import DilJaxError
from dil_jax.serve.answers import answer_payload, phase_ms
from dil_jax.serve.engine import Engine
from dil_jax.serve.metrics import CONTENT_TYPE
from dil_jax.serve.schemas import (
    ANSWER_FIELDS,
    READ_FIELDS,
    RequestError,
    parse_answer_request,
    parse_json_body,
    parse_read_request,
)
from dil_jax.serve.worker import NotAccepting, QueueFull

log = logging.getLogger(__name__)

API_KEY_ENV = "DIL_JAX_API_KEY"


@dataclasses.dataclass(frozen=True)
class AppSettings:
    api_key: str | None = None
    request_timeout_s: float = 60.0
    span_score: str = "logits"  # /v1/answer's default rule


class _Refused(Exception):
    """A response decided before the handler's work (status, payload, headers)."""

    def __init__(self, status: int, payload: dict, headers: dict[str, str] | None = None):
        self.status, self.payload, self.headers = status, payload, headers or {}


def _error(field: str, message: str) -> dict:
    return {"error": {"field": field, "message": message}}


def key_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison (hmac.compare_digest), so the time of a refusal does not
    tell how many leading characters of a guess were right."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def presented_key(request: Request) -> str | None:
    """The key a request presents: `Authorization: Bearer KEY` or `X-API-Key: KEY`."""
    authorization = request.headers.get("authorization", "")
    if authorization[:7].lower() == "bearer ":
        return authorization[7:].strip()
    return request.headers.get("x-api-key")


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 past `limit` bytes: by its Content-Length before reading,
    and while reading (a chunked body has none)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise RequestError(400, "content-length", f"Content-Length {declared!r} is not a "
                                                      "number of bytes")
        if int(declared) > limit:
            raise RequestError(413, "body", f"the body has {declared} bytes, more than the "
                                            f"{limit} this server takes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestError(413, "body", f"the body has more than the {limit} bytes this "
                                            "server takes")
    return bytes(body)


def create_app(engine: Engine, settings: AppSettings) -> Starlette:
    metrics = engine.metrics
    limits = engine.limits

    def route(name: str, protected: bool = False):
        def wrap(handler: Callable[[Request], Awaitable[Response]]):
            async def endpoint(request: Request) -> Response:
                started = time.perf_counter()
                try:
                    if protected and settings.api_key is not None and \
                            not key_matches(presented_key(request), settings.api_key):
                        raise _Refused(401, _error("api_key", "a valid API key is required "
                                                   "(Authorization: Bearer KEY or X-API-Key)"),
                                       {"WWW-Authenticate": "Bearer"})
                    response = await handler(request)
                except RequestError as error:
                    response = JSONResponse(error.payload(), error.status)
                except _Refused as refused:
                    response = JSONResponse(refused.payload, refused.status, refused.headers)
                metrics.observe_request(name, response.status_code,
                                        time.perf_counter() - started)
                return response

            return endpoint

        return wrap

    def submit(kind: str, reader: str, payload: Any):
        try:
            return engine.worker.submit(kind, reader, payload)
        except QueueFull as full:
            raise _Refused(503, _error("queue", str(full)),
                           {"Retry-After": str(full.retry_after)}) from full
        except NotAccepting as error:
            headers = {} if engine.worker.failure else {"Retry-After": "5"}
            raise _Refused(503, _error("server", str(error)), headers) from error

    async def wait(future):
        """The worker's Done, or a refusal: timeout 504, a bad input 422, a failure 500."""
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future),
                                          settings.request_timeout_s)
        except asyncio.TimeoutError:
            future.cancel()  # still queued: the worker skips it
            raise _Refused(504, _error("timeout", f"no answer within "
                                       f"{settings.request_timeout_s:g} s (the server's "
                                       "--request-timeout)")) from None
        except RequestError:
            raise
        except DilJaxError as error:
            raise _Refused(422, _error("question", str(error))) from error
        except Exception as error:
            log.exception("a read failed")
            raise _Refused(500, _error("server", f"the read failed: {type(error).__name__}: "
                                                 f"{error}")) from error

    @route("/v1/answer", protected=True)
    async def answer(request: Request) -> Response:
        data = parse_json_body(await read_body(request, limits.max_body_bytes))
        parsed = parse_answer_request(data, limits, engine.names, settings.span_score)
        done = await wait(submit("answer", parsed.reader, parsed.question))
        clock = time.perf_counter()
        served = engine.readers[parsed.reader]
        outcome = done.value
        timings = {"queue": round(1e3 * done.queue_s, 3), **phase_ms(outcome.timings)}
        payload = answer_payload(parsed, outcome.by_score[parsed.span_score], outcome.hits,
                                 served.reader.index.passages, engine.mu, served.abstention,
                                 timings, served.k, done.batch_size)
        payload["timings_ms"]["fuse"] = round(1e3 * (time.perf_counter() - clock), 3)
        metrics.phases.labels(parsed.reader, "queue").observe(done.queue_s)
        return JSONResponse(payload)

    @route("/v1/read", protected=True)
    async def read(request: Request) -> Response:
        data = parse_json_body(await read_body(request, limits.max_body_bytes))
        parsed = parse_read_request(data, limits, engine.names)
        done = await wait(submit("read", parsed.reader, parsed))
        answers = done.value
        # Hugging Face's pipeline returns the answer itself when there is exactly one.
        return JSONResponse(answers[0] if len(answers) == 1 else answers)

    @route("/v1/info")
    async def info(request: Request) -> Response:
        readers = {name: {"k": served.k, "kind": served.kind,
                          "layers": served.reader.reader.config.num_layers,
                          "checkpoint": served.checkpoint,
                          "abstention": served.abstention is not None}
                   for name, served in engine.readers.items()}
        first = next(iter(engine.readers.values())).reader
        return JSONResponse({"readers": readers, "passages": len(first.index.passages),
                             "limits": dataclasses.asdict(limits), "mu": engine.mu,
                             "api_key_required": settings.api_key is not None})

    @route("/healthz")
    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    @route("/readyz")
    async def readyz(request: Request) -> Response:
        worker = engine.worker
        ready = worker.accepting
        return JSONResponse({"ready": ready, "state": worker.state,
                             "progress": engine.progress, "queue": worker.depth},
                            200 if ready else 503)

    @route("/metrics")
    async def metrics_text(request: Request) -> Response:
        return Response(metrics.text(), media_type=CONTENT_TYPE)

    @route("/")
    async def page(request: Request) -> Response:
        return HTMLResponse(resources.files("dil_jax.serve").joinpath("page.html").read_text())

    @route("/openapi.json")
    async def openapi_json(request: Request) -> Response:
        return JSONResponse(openapi(engine.names, limits))

    @route("/docs")
    async def docs(request: Request) -> Response:
        return HTMLResponse(resources.files("dil_jax.serve").joinpath("docs.html").read_text())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        engine.worker.start()
        yield
        # Uvicorn ends here after the in-flight requests were answered (SIGTERM drains them):
        # the worker finishes what is queued and stops.
        await asyncio.get_running_loop().run_in_executor(None, engine.worker.stop, 60.0)

    routes = [Route("/v1/answer", answer, methods=["POST"]),
              Route("/v1/read", read, methods=["POST"]),
              Route("/v1/info", info), Route("/healthz", healthz), Route("/readyz", readyz),
              Route("/metrics", metrics_text), Route("/", page),
              Route("/openapi.json", openapi_json), Route("/docs", docs)]
    return Starlette(routes=routes, lifespan=lifespan)


def run_server(app: Starlette, host: str, port: int, graceful_s: float) -> None:
    """Serves `app` with uvicorn until SIGTERM or Ctrl-C, answering the requests in flight
    first (uvicorn's graceful shutdown, at most graceful_s seconds, then the lifespan stops
    the worker). Returns normally: uvicorn itself re-raises the signal it drained on once it
    is done, so the process would die of it (status -15); a drained stop is a clean one."""
    import signal
    import threading

    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    config = uvicorn.Config(app, host=host, port=port, log_level="warning",
                            timeout_graceful_shutdown=max(1, round(graceful_s)))
    Server(config).run()


def openapi(readers: list[str], limits) -> dict:
    """The API as an OpenAPI 3.1 document (written out: the checks are schemas.py's)."""
    from dil_jax.defaults import SPAN_SCORES

    def integer(low: int, high: int, default: int, about: str) -> dict:
        return {"type": "integer", "minimum": low, "maximum": high, "default": default,
                "description": about}

    answer_body = {"type": "object", "required": ["question"], "additionalProperties": False,
                   "properties": {
                       "question": {"type": "string", "minLength": 1,
                                    "maxLength": limits.max_question_chars},
                       "top_k": integer(1, limits.max_top_k, 1, "answers returned (<= p)"),
                       "p": integer(1, limits.max_p, limits.max_p, "passages read"),
                       "reader": {"enum": readers, "default": readers[0]},
                       "span_score": {"enum": list(SPAN_SCORES), "default": "logits"},
                       "use_ir": {"type": "boolean", "default": True,
                                  "description": "fuse the reader score with BM25's"}}}
    read_body_schema = {"type": "object", "required": ["question", "context"],
                        "additionalProperties": False, "properties": {
                            "question": {"type": "string", "minLength": 1},
                            "context": {"type": "string", "minLength": 1,
                                        "maxLength": limits.max_context_chars},
                            "reader": {"enum": readers, "default": readers[0]},
                            "top_k": integer(1, limits.max_top_k, 1, "answers returned"),
                            "max_answer_len": integer(1, limits.max_answer_len, 15, "tokens"),
                            "handle_impossible_answer": {"type": "boolean", "default": False}}}
    assert set(answer_body["properties"]) == set(ANSWER_FIELDS)
    assert set(read_body_schema["properties"]) == set(READ_FIELDS)
    error = {"description": "refused: {error: {field, message, value?}}"}

    def post(summary: str, body: dict) -> dict:
        return {"post": {"summary": summary,
                         "requestBody": {"required": True, "content": {
                             "application/json": {"schema": body}}},
                         "responses": {"200": {"description": "answers"}, "400": error,
                                       "401": error, "413": error, "422": error,
                                       "503": {"description": "queue full or not ready "
                                                              "(Retry-After)"},
                                       "504": error}}}

    def get(summary: str) -> dict:
        return {"get": {"summary": summary, "responses": {"200": {"description": "ok"}}}}

    return {"openapi": "3.1.0",
            "info": {"title": "dil-jax serve", "version": "1"},
            "paths": {
                "/v1/answer": post("open-domain answers: retrieve, read, fuse", answer_body),
                "/v1/read": post("extractive QA on a given context, Hugging Face pipeline "
                                 "output", read_body_schema),
                "/v1/info": get("the readers and limits"),
                "/healthz": get("alive"),
                "/readyz": get("index open and every program compiled (503 until then)"),
                "/metrics": get("Prometheus text format")}}
