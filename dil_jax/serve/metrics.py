"""The service's Prometheus metrics (`GET /metrics`, text format 0.0.4), and the count of XLA
compilations.

Each app gets its own `CollectorRegistry` (tests build several apps in one process, and a
second registration in the global registry would fail). Compilations are counted by a
`jax.monitoring` listener on the backend-compile event, process-wide (XLA compiles for the
process, whichever app asked): `CompileCounter.count` is what `/metrics` exports and what the
tests compare before and after a request.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# jax/_src/dispatch.py BACKEND_COMPILE_EVENT: one event per program XLA makes. It times
# `compiler.compile_or_get_cached` (jax/_src/interpreters/pxla.py), so a program read back
# from the persistent compilation cache (`dil-jax serve --compilation-cache`) counts too: a
# program the warm-up missed shows after /readyz either way.
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

# Seconds: from a millisecond (retrieval) to a minute (a large batch on a busy CPU).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                   10.0, 30.0, 60.0)


class CompileCounter:
    """XLA programs made in this process since the listener was registered (once): compiled
    (`seconds` is their compile time) or read from the persistent compilation cache."""

    _lock = threading.Lock()
    _registered = False
    count = 0
    seconds = 0.0
    # Of `count`, those made by the thread inside `in_background` (the serve worker's idle
    # warm-up): told apart at the event, in the compiling thread, so no count races a request.
    background = 0
    _background_thread: int | None = None

    @classmethod
    @contextlib.contextmanager
    def in_background(cls) -> Iterator[None]:
        """Counts this thread's compilations meanwhile as background ones too."""
        cls._background_thread = threading.get_ident()
        try:
            yield
        finally:
            cls._background_thread = None

    @classmethod
    def register(cls) -> None:
        import jax

        with cls._lock:
            if cls._registered:
                return
            jax.monitoring.register_event_duration_secs_listener(cls._listener)
            cls._registered = True

    @classmethod
    def _listener(cls, event: str, duration: float, **_: object) -> None:
        if event == BACKEND_COMPILE_EVENT:
            with cls._lock:
                cls.count += 1
                cls.seconds += duration
                if threading.get_ident() == cls._background_thread:
                    cls.background += 1


class _CompileCollector:
    def __init__(self, metrics: ServeMetrics):
        self.metrics = metrics

    def collect(self):
        total = CounterMetricFamily("dil_jax_compilations",
                                    "XLA programs compiled (or read from the persistent "
                                    "compilation cache) by this process", labels=["stage"])
        at_ready = self.metrics.ready_counts
        if at_ready is None:
            total.add_metric(["startup"], CompileCounter.count)
            total.add_metric(["background"], 0)
            total.add_metric(["serving"], 0)
        else:
            total.add_metric(["startup"], at_ready[0])
            # The narrower chunk programs compiled between requests after /readyz.
            total.add_metric(["background"], CompileCounter.background - at_ready[1])
            # Programs compiled by requests: a shape the warm-up missed (should stay 0).
            total.add_metric(["serving"], self.metrics.compiles_by_requests())
        yield total
        yield CounterMetricFamily("dil_jax_compile_seconds",
                                  "seconds spent compiling XLA programs",
                                  value=CompileCounter.seconds)


class ServeMetrics:
    """Every metric of one app."""

    def __init__(self):
        self.registry = CollectorRegistry()
        # (CompileCounter.count, .background) when /readyz turned 200; None before.
        self.ready_counts: tuple[int, int] | None = None
        self.requests = Counter("dil_jax_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=self.registry)
        self.latency = Histogram("dil_jax_request_seconds", "HTTP request latency by route",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.phases = Histogram("dil_jax_phase_seconds",
                                "seconds of each phase of a read, by reader (queue: waiting "
                                "for the worker; the others per batch)",
                                ["reader", "phase"], buckets=LATENCY_BUCKETS,
                                registry=self.registry)
        self.batch_size = Histogram("dil_jax_batch_size", "jobs read together by the worker",
                                    ["kind", "reader"],
                                    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64),
                                    registry=self.registry)
        self.queue_depth = Gauge("dil_jax_queue_depth", "jobs waiting for the worker",
                                 registry=self.registry)
        self.ready = Gauge("dil_jax_ready",
                           "1 once the server answers (the widest chunk programs compiled)",
                           registry=self.registry)
        self.registry.register(_CompileCollector(self))
        CompileCounter.register()

    def mark_ready(self) -> None:
        self.ready_counts = (CompileCounter.count, CompileCounter.background)
        self.ready.set(1)

    def compiles_by_requests(self) -> int:
        """Programs compiled after /readyz other than by the idle warm-up (0 before ready)."""
        if self.ready_counts is None:
            return 0
        count, background = self.ready_counts
        return (CompileCounter.count - count) - (CompileCounter.background - background)

    def observe_request(self, route: str, status: int, seconds: float | None = None) -> None:
        """Counts a request by route and status; its latency too when it has one (a refusal
        made outside a route, such as a 404, has none worth a histogram's bucket)."""
        self.requests.labels(route, str(status)).inc()
        if seconds is not None:
            self.latency.labels(route).observe(seconds)

    def text(self) -> bytes:
        return generate_latest(self.registry)
