"""The HTTP side: a Starlette app over an `Engine` (docs/serving.md has the API).

Starlette rather than FastAPI (measured, docs/results/serving_log.md "Framework"): the request
bodies are checked by dil_jax.serve.schemas (plain functions that name the field and value in every
error, tested alone), so FastAPI's pydantic layer would check them a second time and answer its own
422 format; the OpenAPI document is written out here instead (`openapi`), and /docs
renders it without the CDN-hosted Swagger UI FastAPI's /docs loads.

Every route runs through `route`: the API key (when set, on /v1/*), the content type and the
body limit and read timeout of the POST routes, and the request metrics. The error path is one
place: every 4xx / 5xx this service answers is `{"error": {"field", "message", "value"?}}`,
counted in /metrics by route and status: a `RequestError` or `_Refused` of a route, an
unexpected exception of one (500, logged with its traceback), Starlette's 404 / 405
(`http_error`, route "other" when no route matched), and a connection whose headers did not
arrive in time (408, `header_timeout_protocol`, route "other"). Requests only parse and wait:
reading happens in the engine's worker thread; a request whose client leaves before its answer
cancels its job (`wait`), so the worker skips it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from dil_jax.errors import DilJaxError
from dil_jax.open_domain.abstention import retrieval_match
from dil_jax.serve.answers import answer_payload, phase_ms
from dil_jax.serve.engine import AnswerJob, Engine
from dil_jax.serve.metrics import CONTENT_TYPE, ServeMetrics
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
    # A request's headers, then its body, must arrive within this many seconds (slow clients
    # would otherwise hold their sockets, and a truncated body its request, for ever).
    read_timeout_s: float = 10.0


ROUTE_PATHS = ("/v1/answer", "/v1/read", "/v1/info", "/healthz", "/readyz", "/metrics", "/",
               "/openapi.json", "/docs")
# The route label of a request no route matched (404) or whose headers never came (408): one
# label, so that scanning for paths cannot grow /metrics without bound.
OTHER_ROUTE = "other"
# What nginx logs for a request whose client closed the connection before the answer.
CLIENT_GONE = 499


class _Refused(Exception):
    """A response decided before the handler's work (status, payload, headers)."""

    def __init__(self, status: int, payload: dict, headers: dict[str, str] | None = None):
        self.status, self.payload, self.headers = status, payload, headers or {}


def _error(field: str, message: str) -> dict:
    return {"error": {"field": field, "message": message}}


def is_json_content_type(header: str | None) -> bool:
    """Content-Type application/json (parameters such as charset allowed) or application/*+json.
    Anything else is refused: a page of another origin can POST a form or text/plain without
    a CORS preflight, but not application/json."""
    media = (header or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                           and media.endswith("+json"))


def shown_checkpoint(checkpoint: str) -> str:
    """A reader's checkpoint as /v1/info shows it, without the machine's absolute paths: a
    bundled reader's folder name, a path under the working directory relative to it, a
    relative path or a hub name as given, any other path by its folder name."""
    from pathlib import Path

    path = Path(checkpoint)
    assets = (Path(__file__).resolve().parents[1] / "assets")
    resolved = path.resolve()
    if resolved.parent == assets:
        return f"{path.name} (bundled)"
    if not path.is_absolute():
        return checkpoint
    try:
        return str(resolved.relative_to(Path.cwd().resolve()))
    except ValueError:
        return path.name


def pruning_info(served, max_p: int, mu: float) -> dict[str, Any]:
    """A reader's window pruning as /v1/info shows it: its label (None: every window is read),
    whether its answers are the full read's ("stop") or an approximation ("stop:H"), why it
    was chosen (`pruning.resolve_pruning`), and which requests it reads
    (`answers.reads_pruned`: null when none)."""
    pruning = served.pruning
    if pruning is None:
        return {"pruning": None, "pruning_exact": None,
                "pruning_reason": served.pruning_reason or None, "pruned_requests": None}
    return {"pruning": pruning.label, "pruning_exact": pruning.exact,
            "pruning_reason": served.pruning_reason or None,
            "pruned_requests": {"use_ir": True, "mu": mu,
                                "span_score": served.reader.span_score, "p": max_p,
                                "top_k": 1}}


def chunk_info(served) -> dict[str, Any]:
    """A reader's pairs per chunk as /v1/info shows it: the size, where it came from ("given",
    "measured now", "read from the record", "default") and why, in one line
    (`chunk_size.ChunkChoice`); for a reader loaded without one, its grid's size (if any) and
    nulls."""
    if getattr(served, "chunk", None) is None:
        grid = getattr(served.reader, "grid", None)
        return {"chunk_size": getattr(grid, "chunk_size", None), "chunk_size_source": None,
                "chunk_size_reason": None}
    return served.chunk.info()


def matmul_info(served) -> dict[str, Any]:
    """What a reader's dense matmuls read (`--matmul-dtype`) and why, as /v1/info shows it;
    float32 and no reason for a reader loaded without a setting (the tests' fakes)."""
    return {"matmul_dtype": getattr(served, "matmul_dtype", "float32"),
            "matmul_dtype_reason": getattr(served, "matmul_reason", "") or None}


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


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The body, refused with 413 past `limit` bytes: by its Content-Length before reading,
    and while reading (a chunked body has none); with 408 when it has not all arrived within
    `timeout_s` seconds (a client that stalls mid-body would hold its request for ever); 499
    when the client left while sending it."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit() or len(declared) > 20:
            raise RequestError(400, "content-length", f"Content-Length {declared[:40]!r} is "
                                                      "not a number of bytes")
        if int(declared) > limit:
            raise RequestError(413, "body", f"the body has {declared} bytes, more than the "
                                            f"{limit} this server takes")

    async def collect() -> bytes:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise RequestError(413, "body", f"the body has more than the {limit} bytes "
                                                "this server takes")
        return bytes(body)

    try:
        return await asyncio.wait_for(collect(), timeout_s)
    except asyncio.TimeoutError:
        # Connection: close: the rest of the body may still come, and is not a next request.
        raise _Refused(408, _error("body", f"the body did not arrive within {timeout_s:g} s "
                                           "(the server's --read-timeout)"),
                       {"Connection": "close"}) from None
    except ClientDisconnect:
        raise _Refused(CLIENT_GONE, _error("client", "the client closed the connection while "
                                                     "sending the body")) from None


async def client_left(request: Request) -> None:
    """Returns once the client has closed the connection. After the body, the server's next
    message is http.disconnect: when the client goes, or once the response is sent."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def unexpected_error(error: BaseException) -> dict:
    """The JSON of a bug: its type and message (the traceback goes to the server's log)."""
    text = str(error)
    text = text if len(text) <= 200 else text[:200] + "..."
    return _error("server", f"internal error: {type(error).__name__}: {text} (the server's "
                            "log has the traceback)")


def create_app(engine: Engine, settings: AppSettings) -> Starlette:
    metrics = engine.metrics
    limits = engine.limits

    def route(name: str, protected: bool = False, json_body: bool = False):
        def wrap(handler: Callable[[Request], Awaitable[Response]]):
            async def endpoint(request: Request) -> Response:
                started = time.perf_counter()
                try:
                    if protected and settings.api_key is not None and \
                            not key_matches(presented_key(request), settings.api_key):
                        raise _Refused(401, _error("api_key", "a valid API key is required "
                                                   "(Authorization: Bearer KEY or X-API-Key)"),
                                       {"WWW-Authenticate": "Bearer"})
                    if json_body and not is_json_content_type(
                            request.headers.get("content-type")):
                        shown = request.headers.get("content-type", "none")[:80]
                        raise _Refused(415, _error("content-type", f"Content-Type {shown!r}: "
                                                   "send the body as application/json"))
                    response = await handler(request)
                except RequestError as error:
                    response = JSONResponse(error.payload(), error.status)
                except _Refused as refused:
                    response = JSONResponse(refused.payload, refused.status, refused.headers)
                except Exception as error:  # a bug: answered as JSON, counted, logged
                    log.exception("%s %s failed", request.method, name)
                    response = JSONResponse(unexpected_error(error), 500)
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

    async def wait(request: Request, future):
        """The worker's Done, or a refusal: timeout 504, the client gone 499, a bad input 422,
        a failure 500. Uvicorn does not cancel a request whose client left, so the job would
        be read for no one: the client's disconnect is watched beside the answer, and the
        job is cancelled (skipped by the worker if still queued) on either refusal."""
        answer = asyncio.wrap_future(future)
        gone = asyncio.ensure_future(client_left(request))
        try:
            done, _ = await asyncio.wait({answer, gone}, timeout=settings.request_timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not answer.done():
                answer.cancel()  # cancels `future` too
        if answer not in done:
            if gone in done:
                raise _Refused(CLIENT_GONE, _error("client", "the client closed the connection "
                                                             "before its answer"))
            raise _Refused(504, _error("timeout", f"no answer within "
                                       f"{settings.request_timeout_s:g} s (the server's "
                                       "--request-timeout)"))
        try:
            return answer.result()
        except RequestError:
            raise
        except DilJaxError as error:
            raise _Refused(422, _error("question", str(error))) from error
        except Exception as error:
            log.exception("a read failed")
            raise _Refused(500, _error("server", f"the read failed: {type(error).__name__}: "
                                                 f"{error}")) from error

    async def body_of(request: Request) -> dict:
        return parse_json_body(await read_body(request, limits.max_body_bytes,
                                               settings.read_timeout_s))

    @route("/v1/answer", protected=True, json_body=True)
    async def answer(request: Request) -> Response:
        data = await body_of(request)
        parsed = parse_answer_request(data, limits, engine.names, settings.span_score)
        job = AnswerJob(parsed.question, engine.reads_pruned(parsed))
        done = await wait(request, submit("answer", parsed.reader, job))
        clock = time.perf_counter()
        served = engine.readers[parsed.reader]
        outcome = done.value
        timings = {"queue": round(1e3 * done.queue_s, 3), **phase_ms(outcome.timings)}
        match = None
        if served.abstention is not None and served.abstention.uses_retrieval(
                parsed.span_score, parsed.use_ir):
            match = retrieval_match(outcome.hits,
                                    served.reader.index.retriever.attainable(parsed.question))
        payload = answer_payload(parsed, outcome.by_score[parsed.span_score], outcome.hits,
                                 served.reader.index.passages, engine.mu, served.abstention,
                                 timings, served.k, done.batch_size, match, outcome.pruning,
                                 outcome.pairs_read)
        payload["timings_ms"]["fuse"] = round(1e3 * (time.perf_counter() - clock), 3)
        metrics.phases.labels(parsed.reader, "queue").observe(done.queue_s)
        return JSONResponse(payload)

    @route("/v1/read", protected=True, json_body=True)
    async def read(request: Request) -> Response:
        data = await body_of(request)
        parsed = parse_read_request(data, limits, engine.names)
        done = await wait(request, submit("read", parsed.reader, parsed))
        answers = done.value
        # Hugging Face's pipeline returns the answer itself when there is exactly one.
        return JSONResponse(answers[0] if len(answers) == 1 else answers)

    @route("/v1/info", protected=True)
    async def info(request: Request) -> Response:
        readers = {name: {"k": served.k, "kind": served.kind,
                          "layers": served.reader.reader.config.num_layers,
                          "checkpoint": shown_checkpoint(served.checkpoint),
                          "abstention": served.abstention is not None,
                          **pruning_info(served, limits.max_p, engine.mu),
                          **chunk_info(served), **matmul_info(served)}
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

    async def http_error(request: Request, error: Exception) -> Response:
        """Starlette's own refusals (404 no route, 405 another method) and anything raised
        outside a route (500), in the routes' JSON and counted."""
        path = request.url.path
        name = path if path in ROUTE_PATHS else OTHER_ROUTE
        if isinstance(error, HTTPException) and error.status_code == 404:
            response = JSONResponse(_error("path", f"no route {path[:200]!r}: the routes are "
                                                   f"{list(ROUTE_PATHS)}"), 404)
        elif isinstance(error, HTTPException) and error.status_code == 405:
            allowed = (error.headers or {}).get("Allow", "")
            response = JSONResponse(_error("method", f"{path} takes {allowed}, not "
                                                     f"{request.method[:20]}"),
                                    405, error.headers)
        elif isinstance(error, HTTPException):
            response = JSONResponse(_error("request", str(error.detail)), error.status_code,
                                    error.headers)
        else:
            response = JSONResponse(unexpected_error(error), 500)
        metrics.observe_request(name, response.status_code)
        return response

    routes = [Route("/v1/answer", answer, methods=["POST"]),
              Route("/v1/read", read, methods=["POST"]),
              Route("/v1/info", info), Route("/healthz", healthz), Route("/readyz", readyz),
              Route("/metrics", metrics_text), Route("/", page),
              Route("/openapi.json", openapi_json), Route("/docs", docs)]
    assert [r.path for r in routes] == list(ROUTE_PATHS)
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error, Exception: http_error})
    # What the server around the app needs (`server_config`): the header timeout and where
    # to count the connections it closes.
    app.state.settings, app.state.metrics = settings, metrics
    return app


HEADER_TIMEOUT_BODY = json.dumps(_error(
    "headers", "the request's headers did not arrive in time (the server's --read-timeout)"))


def header_timeout_protocol(seconds: float, on_timeout: Callable[[], None]) -> type:
    """Uvicorn's h11 protocol with a deadline for a request's headers: `seconds` from the
    connection's opening, or on a kept-alive connection from the next request's first byte
    (idle time between requests is uvicorn's keep-alive timeout's). Past it the connection
    gets a 408 and is closed. Uvicorn has none (its keep-alive timeout stops at a request's
    first byte), so a client sending a header line now and then (slowloris) held its socket
    for ever."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    body = HEADER_TIMEOUT_BODY.encode()
    reply = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
             b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
             + body)

    class HeaderTimeoutProtocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(seconds, self._headers_late)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or (self.cycle is not None
                                               and not self.cycle.response_complete):
                return
            # Written past h11: it sends no response before a request's headers.
            self.transport.write(reply)
            self.transport.close()
            on_timeout()

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is None and (self.cycle is None
                                               or self.cycle.response_complete):
                self._arm()  # the first bytes of a kept-alive connection's next request
            super().data_received(data)

        def handle_events(self) -> None:
            cycle = self.cycle
            super().handle_events()
            if self.cycle is not cycle:  # a request's headers arrived
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderTimeoutProtocol


def server_config(app: Starlette, host: str, port: int, graceful_s: float = 30.0):
    """Uvicorn's config for `app` (made by `create_app`): its h11 protocol with the header
    deadline of the app's `read_timeout_s`, each timed-out connection counted as a 408."""
    import uvicorn

    settings: AppSettings = app.state.settings
    metrics: ServeMetrics = app.state.metrics
    protocol = header_timeout_protocol(
        settings.read_timeout_s, lambda: metrics.observe_request(OTHER_ROUTE, 408))
    return uvicorn.Config(app, host=host, port=port, log_level="warning", http=protocol,
                          timeout_graceful_shutdown=max(1, round(graceful_s)))


def bind_sockets(host: str, port: int) -> list:
    """Listening sockets on every address of `host` at `port` (as uvicorn binds them), taken
    before the warm-up so that a port in use is said at once, not after minutes of
    compiling; a UsageError naming --host and --port when one cannot be bound."""
    import socket

    from dil_jax.errors import UsageError

    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise UsageError(f"--host {host!r}: not an address of this machine "
                         f"({error.strerror})") from error
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(addresses):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(2048)
    except OSError as error:
        for sock in sockets:
            sock.close()
        raise UsageError(f"--host {host} --port {port}: cannot listen there "
                         f"({error.strerror or error}); is another server on that port? Give "
                         "another --port") from error
    return sockets


def run_server(app: Starlette, host: str, port: int, graceful_s: float,
               sockets: list | None = None) -> None:
    """Serves `app` with uvicorn until SIGTERM or Ctrl-C, answering the requests in flight
    first (uvicorn's graceful shutdown, at most graceful_s seconds, then the lifespan stops
    the worker). Returns normally: uvicorn itself re-raises the signal it drained on once it
    is done, so the process would die of it (status -15); a drained stop is a clean one.
    sockets: already listening (`bind_sockets`), else uvicorn binds host:port."""
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

    Server(server_config(app, host, port, graceful_s)).run(sockets=sockets)


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
                         "responses": {"200": {"description": "answers"},
                                       **{status: error for status in (
                                           "400", "401", "408", "413", "415", "422", "499",
                                           "500", "504")},
                                       "503": {"description": "queue full or not ready "
                                                              "(Retry-After)"}}}}

    def get(summary: str, protected: bool = False) -> dict:
        responses = {"200": {"description": "ok"}, **({"401": error} if protected else {})}
        return {"get": {"summary": summary, "responses": responses}}

    return {"openapi": "3.1.0",
            "info": {"title": "dil-jax serve", "version": "1"},
            "paths": {
                "/v1/answer": post("open-domain answers: retrieve, read, fuse", answer_body),
                "/v1/read": post("extractive QA on a given context, Hugging Face pipeline "
                                 "output", read_body_schema),
                "/v1/info": get("the readers and limits", protected=True),
                "/healthz": get("alive"),
                "/readyz": get("index open and the widest programs compiled (503 until then); "
                               "progress of the idle warm-up"),
                "/metrics": get("Prometheus text format")}}
