"""`dil-jax serve`: the open-domain readers as an HTTP service (docs/serving.md).

    dil-jax demo                      # builds runs/demo-index once
    dil-jax serve                     # http://127.0.0.1:8000/ : the page; /v1/answer, /v1/read
    curl -s localhost:8000/v1/answer -H 'Content-Type: application/json' \
         -d '{"question": "Who wrote Hamlet?"}'
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from dil_jax.commands.arguments import (
    CHUNK_SIZE_HELP,
    add_compilation_cache_arguments,
    add_matmul_argument,
    add_pruning_argument,
    cache_storage,
    chunk_size_setting,
    non_negative_int,
    option_type,
    positive_float,
    positive_int,
    unit_interval,
)
from dil_jax.defaults import OPEN_DOMAIN_BATCH_SIZE, OPEN_DOMAIN_MAX_QUESTION_LEN, SPAN_SCORES
from dil_jax.errors import UsageError

log = logging.getLogger(__name__)

API_KEY_ENV = "DIL_JAX_API_KEY"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="the open-domain readers as an HTTP service (API, web page, metrics)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", default="runs/demo-index",
                        help="index folder (dil-jax demo builds runs/demo-index)")
    parser.add_argument("--full-checkpoint", default=None,
                        help="the full reader, read at k = 0 (default: the bundled one)")
    parser.add_argument("--delayed-checkpoint", default=None,
                        help="the delayed-interaction reader (default: the bundled one)")
    parser.add_argument("--k", type=positive_int, default=None,
                        help="split of the delayed reader (default: the one it was trained "
                             "with)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind; anything but loopback exposes the service "
                             "(give --api-key then)")
    parser.add_argument("--port", type=_port, default=8000, help="port to bind")
    parser.add_argument("--api-key", default=None,
                        help=f"require this key on /v1/* (Authorization: Bearer KEY or "
                             f"X-API-Key); or set {API_KEY_ENV} (default: none required)")
    parser.add_argument("--top-p", type=positive_int, default=29,
                        help="passages read per question, the most a request's p may ask "
                             "(29: the open-domain protocol's depth, as ask; demo reads 10)")
    parser.add_argument("--batch-size", type=positive_int, default=OPEN_DOMAIN_BATCH_SIZE,
                        help="most questions read together (one batch of the worker)")
    parser.add_argument("--batch-shapes", type=positive_int, nargs="+", default=[1],
                        metavar="QUESTIONS",
                        help="smaller batches (question counts) padded to their own passage "
                             "rows instead of a whole batch's: a lone question then copies "
                             "~1/8 of the cached states (docs/serving.md); each count is "
                             "one more set of programs for the warm-up; --batch-size is always "
                             "one")
    parser.add_argument("--max-wait-ms", type=non_negative_int, default=5,
                        help="how long the worker waits for more questions after the first of "
                             "a batch arrives (not after a lone batch: a lone request then "
                             "leaves at once)")
    parser.add_argument("--max-queue", type=positive_int, default=64,
                        help="requests waiting for the worker before new ones get 503 with "
                             "Retry-After")
    parser.add_argument("--request-timeout", type=positive_float, default=60.0,
                        metavar="SECONDS", help="a request not answered by then gets 504")
    parser.add_argument("--max-body-bytes", type=positive_int, default=64 * 1024,
                        help="larger request bodies get 413")
    parser.add_argument("--read-timeout", type=positive_float, default=10.0, metavar="SECONDS",
                        help="a request's headers, then its body, must arrive within this "
                             "time: a connection still sending its headers is answered 408 "
                             "and closed, a body still arriving gets 408")
    parser.add_argument("--max-question-chars", type=positive_int, default=1000,
                        help="longer questions get 422")
    parser.add_argument("--max-context-chars", type=positive_int, default=20000,
                        help="longer /v1/read contexts get 422")
    parser.add_argument("--max-top-k", type=positive_int, default=20,
                        help="the most answers a request may ask for")
    parser.add_argument("--mu", type=unit_interval, default=0.5,
                        help="fusion weight of the reader score when a request has use_ir")
    parser.add_argument("--span-score", choices=SPAN_SCORES, default="logits",
                        help="a request's default span score rule (docs/open_domain.md)")
    add_pruning_argument(
        parser, "; a reader prunes only the requests its pruning is settled for (use_ir, "
                "--span-score, p = --top-p, top_k 1: docs/serving.md, \"Window pruning\"), "
                "the others read every window", default="calibrated")
    parser.add_argument("--max-question-len", type=option_type("max_question_len"),
                        default=OPEN_DOMAIN_MAX_QUESTION_LEN,
                        help="tokens of `[CLS] question [SEP]` (the bundled readers were "
                             "trained with 32)")
    parser.add_argument("--chunk-size", type=chunk_size_setting, default="auto",
                        help=CHUNK_SIZE_HELP + "; the start log and /v1/info say which and "
                                               "why")
    parser.add_argument("--cache-dtype", dest="storage", type=cache_storage, default=None,
                        metavar="STORAGE",
                        help="the storage the index's caches were built with (default: read "
                             "from each cache, as ask: the demo's are int8; naming one refuses "
                             "a cache stored otherwise)")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer folder (default: each reader's own)")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="skip compiling every program before /readyz (development only: "
                             "early requests then pay compilations)")
    add_matmul_argument(parser)
    # A restart reads the warm-up's programs back instead of compiling them again.
    add_compilation_cache_arguments(parser)
    parser.set_defaults(func=run)


def _port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 1..65535, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    from dil_jax.serve.app import bind_sockets
    from dil_jax.serve.loading import ReadSettings, default_specs, load_served_readers
    from dil_jax.serve.schemas import Limits

    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    if api_key is not None and not api_key.strip():
        raise UsageError("--api-key is blank: give a key, or leave it out")
    if args.host not in LOOPBACK and api_key is None:
        log.warning("binding %s without --api-key: anyone who reaches this address can use "
                    "the service", args.host)
    too_big = [n for n in args.batch_shapes if n > args.batch_size]
    if too_big:
        raise UsageError(f"--batch-shapes {too_big[0]}: above --batch-size {args.batch_size} "
                         "(a batch never holds more questions)")
    specs = default_specs(args.full_checkpoint, args.delayed_checkpoint, args.k)
    settings = ReadSettings(top_p=args.top_p, batch_size=args.batch_size,
                            chunk_size=args.chunk_size, max_question_len=args.max_question_len,
                            storage=args.storage, span_score=args.span_score,
                            tokenizer=args.tokenizer, batch_shapes=tuple(args.batch_shapes),
                            pruning=args.prune_windows, mu=args.mu,
                            matmul_dtype=args.matmul_dtype)
    limits = Limits(max_question_chars=args.max_question_chars,
                    max_context_chars=args.max_context_chars, max_top_k=args.max_top_k,
                    max_p=args.top_p, max_body_bytes=args.max_body_bytes)
    # The port first: one in use is said now, not after loading and the warm-up.
    sockets = bind_sockets(args.host, args.port)
    try:
        readers = load_served_readers(args.index, specs, settings,
                                      say=lambda line: print(line, file=sys.stderr, flush=True))
        return serve(readers, limits, args, api_key, sockets)
    finally:
        for sock in sockets:
            sock.close()


def reader_lines(readers) -> list[str]:
    """The start log's lines of each served reader: its window pruning, its pairs per chunk
    and what its matmuls read, each with why."""
    lines = []
    for name, served in readers.items():
        shown = "all" if served.pruning is None else served.pruning.label
        why = f" ({served.pruning_reason})" if served.pruning_reason else ""
        lines.append(f"  window pruning of the {name} reader: {shown}{why}")
        if served.chunk is not None:
            lines.append(f"  pairs per chunk of the {name} reader: {served.chunk.reason}")
        if getattr(served, "matmul_reason", ""):
            lines.append(f"  matmuls of the {name} reader: {served.matmul_reason}")
    return lines


def serve(readers, limits, args: argparse.Namespace, api_key: str | None,
          sockets: list | None = None) -> int:
    """Runs uvicorn until SIGTERM / Ctrl-C: in-flight requests are answered first (uvicorn's
    graceful shutdown, then the app's lifespan stops the worker), then exit status 0.
    sockets: listening already (`bind_sockets`), else uvicorn binds --host / --port."""
    from dil_jax.serve.app import AppSettings, create_app, run_server
    from dil_jax.serve.engine import Engine
    from dil_jax.serve.metrics import ServeMetrics

    engine = Engine(readers, limits, ServeMetrics(), mu=args.mu, max_batch=args.batch_size,
                    max_wait_s=args.max_wait_ms / 1e3, max_queue=args.max_queue,
                    warm=not args.no_warm_up)
    app = create_app(engine, AppSettings(api_key=api_key,
                                         request_timeout_s=args.request_timeout,
                                         span_score=args.span_score,
                                         read_timeout_s=args.read_timeout))
    print(f"serving {', '.join(readers)} over {args.index} on http://{args.host}:{args.port}/ "
          "(compiling first: GET /readyz says when ready)", file=sys.stderr, flush=True)
    for line in reader_lines(readers):
        print(line, file=sys.stderr, flush=True)
    run_server(app, args.host, args.port, graceful_s=args.request_timeout + 5,
               sockets=sockets)
    if engine.worker.failure is not None:
        raise UsageError(f"the server could not start: {engine.worker.failure}")
    return 0
