"""The one thread that owns the device: a bounded queue of jobs, batches, results by request.

Requests (on the event loop) `submit` a job and await its `Future`; the worker thread takes
the oldest job, waits for more until that job's arrival + `max_wait_s` (one deadline, so a
request never waits longer than that for company, and under load, when the worker was busy
past the deadline, a batch leaves at once) or until `max_batch` jobs, groups them by (kind,
reader) and hands each group to its handler in one call. A lone job after a lone batch leaves
at once (`batch_deadline`): one client sending one request at a time never has company, and
would wait max_wait_s for nothing each time. Every job carries its own Future, so results go
back to the request that asked, whatever order the handler computed them in.

Idle work (the narrower programs' warm-up) runs only once the queue has been empty for
`idle_after_s` since the last batch: a piece of it cannot be interrupted (a compile, ~1 s), and
a client sending its next request as soon as it has an answer would otherwise find the worker
compiling, and wait, every time.

Why one thread: JAX programs run one at a time on a device anyway, and a single owner makes
the warm-up's guarantee (every shape compiled before the first request) hold: no other thread
can trace a new shape meanwhile.

Nothing a job holds can stop the thread: a handler's exception fails only the jobs of its group
(each Future gets it), and a result that is an exception fails only its job.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

log = logging.getLogger(__name__)

# (reader, payloads) -> one result per payload, in order; a result may be an Exception, which
# fails that job only.
Handler = Callable[[str, Sequence[Any]], Sequence[Any]]


# What `_gather` returns when the queue is empty and idle work remains; compared by identity
# (a batch whose jobs were all cancelled is another, empty, list).
IDLE: list = []

# How long the queue must have been empty since the last batch before idle work starts.
IDLE_AFTER_S = 0.5


def batch_deadline(oldest: float, max_wait_s: float, queued: int, last_batch: int) -> float:
    """When a batch whose oldest job arrived at `oldest` leaves (unless max_batch jobs come
    first): max_wait_s later while there is company to wait for (more than one job queued, or
    the last batch held several: concurrent clients), else at once (a lone job after a lone
    batch: nobody else is sending, and the wait would only add to its latency)."""
    return oldest + max_wait_s if queued > 1 or last_batch > 1 else oldest



class QueueFull(Exception):
    """The queue holds max_queue jobs; retry_after: seconds a client should wait."""

    def __init__(self, depth: int, retry_after: int):
        super().__init__(f"the queue is full ({depth} requests waiting); retry in "
                         f"{retry_after} s")
        self.depth, self.retry_after = depth, retry_after


class NotAccepting(Exception):
    """The worker is not taking jobs: still starting, stopping, or failed to start."""


@dataclasses.dataclass(eq=False)  # a job is itself: the queue removes it by identity
class Job:
    kind: str
    reader: str
    payload: Any
    future: Future
    enqueued: float = dataclasses.field(default_factory=time.monotonic)


@dataclasses.dataclass(frozen=True)
class Done:
    """A job's result: the handler's value, with how long the job queued and how many jobs
    its handler call read together."""

    value: Any
    queue_s: float
    batch_size: int


class Worker:
    """See the module docstring. start() runs `setup` (loading, warm-up) in the thread first;
    `ready` is set once it returned, `failure` holds what it raised."""

    def __init__(self, handlers: Mapping[str, Handler], *, max_batch: int = 8,
                 max_wait_s: float = 0.005, max_queue: int = 64,
                 idle_after_s: float = IDLE_AFTER_S,
                 setup: Callable[[], None] | None = None,
                 on_batch: Callable[[str, str, int, float], None] | None = None,
                 on_depth: Callable[[int], None] | None = None,
                 idle: Callable[[], bool] | None = None):
        """on_batch(kind, reader, size, seconds) after each handler call; on_depth(depth)
        whenever the queue's length changes; idle(): a short piece of background work, run in
        the thread whenever the queue has been empty for idle_after_s since the last batch,
        until it returns False (more to do: True)."""
        if max_batch < 1 or max_queue < 1 or max_wait_s < 0 or idle_after_s < 0:
            raise ValueError(f"max_batch {max_batch}, max_queue {max_queue}: must be >= 1; "
                             f"max_wait_s {max_wait_s}, idle_after_s {idle_after_s}: must be "
                             ">= 0")
        self.handlers = dict(handlers)
        self.max_batch, self.max_wait_s, self.max_queue = max_batch, max_wait_s, max_queue
        self.idle_after_s = idle_after_s
        # The jobs of the last batch and when it ended (`batch_deadline`, the idle work's wait;
        # before any batch: when the worker became ready).
        self._last_batch, self._last_done = 1, -math.inf
        self._setup, self._on_batch, self._on_depth = setup, on_batch, on_depth
        self._idle, self._idle_pending = idle, idle is not None
        self._queue: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._busy_s = collections.deque(maxlen=16)  # recent handler call times, for Retry-After
        self.ready = threading.Event()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="dil-jax-serve-worker",
                                        daemon=True)

    # ------------------------------------------------------------------ the request side

    def start(self) -> None:
        if not self._thread.is_alive() and self._thread.ident is None:
            self._thread.start()

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def accepting(self) -> bool:
        return self.ready.is_set() and not self._stopping and self._thread.is_alive()

    def retry_after(self) -> int:
        """Whole seconds until the queue has likely room again: the batches ahead of a new job
        times the recent handler call time (at least 1)."""
        per_batch = sum(self._busy_s) / len(self._busy_s) if self._busy_s else 1.0
        return max(1, math.ceil(per_batch * (self.depth / self.max_batch + 1)))

    def submit(self, kind: str, reader: str, payload: Any) -> Future:
        """Queues a job; its Future gets a `Done` (or the handler's exception)."""
        if kind not in self.handlers:
            raise ValueError(f"unknown job kind {kind!r}; kinds: {sorted(self.handlers)}")
        with self._cond:
            if not self.accepting:
                raise NotAccepting("the server is " + self.state)
            if len(self._queue) >= self.max_queue:
                raise QueueFull(len(self._queue), self.retry_after())
            job = Job(kind, reader, payload, Future())
            self._queue.append(job)
            self._depth_changed()
            self._cond.notify_all()
        job.future.add_done_callback(lambda _, job=job: self._drop_if_cancelled(job))
        return job.future

    def _drop_if_cancelled(self, job: Job) -> None:
        """A job cancelled while queued (its request timed out or its client left) leaves the
        queue at once: it holds no place a new request could take, and is never read."""
        if not job.future.cancelled():
            return
        with self._cond:
            try:
                self._queue.remove(job)
            except ValueError:  # the worker took it already (and skips it)
                return
            self._depth_changed()

    @property
    def state(self) -> str:
        if self.failure is not None:
            return f"failed to start: {self.failure}"
        if self._stopping:
            return "shutting down"
        if not self.ready.is_set():
            return "starting (loading and compiling)"
        return "ready"

    def stop(self, timeout: float | None = None) -> bool:
        """Takes no new job, finishes every queued one, ends the thread; True when it ended
        within `timeout` seconds."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.ident is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ------------------------------------------------------------------ the worker thread

    def _depth_changed(self) -> None:
        if self._on_depth is not None:
            self._on_depth(len(self._queue))

    def _run(self) -> None:
        try:
            if self._setup is not None:
                self._setup()
        except BaseException as error:  # reported by /readyz and the log, never re-raised
            self.failure = error
            log.exception("the serve worker failed to start")
            return
        # A client that starts as soon as /readyz says so does not find the worker compiling.
        self._last_done = time.monotonic()
        self.ready.set()
        while (jobs := self._gather()) is not None:
            if jobs is IDLE:
                self._run_idle()
            else:
                self._process(jobs)

    def _run_idle(self) -> None:
        """One piece of the idle work; an exception ends the idle work, not the thread."""
        try:
            self._idle_pending = bool(self._idle())
        except Exception:
            log.exception("the serve worker's idle work failed; it is not resumed")
            self._idle_pending = False

    def _gather(self) -> list[Job] | None:
        """The next batch: up to max_batch jobs, waiting until the oldest job's deadline for
        more (`batch_deadline`); IDLE when the queue has been empty for idle_after_s since the
        last batch and idle work remains (run outside the lock, so requests can queue
        meanwhile); None once stopping and the queue is empty."""
        with self._cond:
            while not self._queue:
                if self._stopping:
                    return None
                if not self._idle_pending:
                    self._cond.wait()
                    continue
                quiet = self._last_done + self.idle_after_s - time.monotonic()
                if quiet <= 0:
                    return IDLE
                self._cond.wait(quiet)
            deadline = batch_deadline(self._queue[0].enqueued, self.max_wait_s,
                                      len(self._queue), self._last_batch)
            while len(self._queue) < self.max_batch and not self._stopping:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            jobs = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
            self._last_batch = len(jobs)
            self._depth_changed()
        # A job whose request gave up (timeout, disconnect) is cancelled: skip it.
        return [job for job in jobs if job.future.set_running_or_notify_cancel()]

    def _process(self, jobs: list[Job]) -> None:
        try:
            self._process_groups(jobs)
        finally:
            self._last_done = time.monotonic()

    def _process_groups(self, jobs: list[Job]) -> None:
        groups: dict[tuple[str, str], list[Job]] = {}
        for job in jobs:
            groups.setdefault((job.kind, job.reader), []).append(job)
        for (kind, reader), group in groups.items():
            started = time.monotonic()
            try:
                results = self.handlers[kind](reader, [job.payload for job in group])
                if len(results) != len(group):
                    raise RuntimeError(f"the {kind} handler returned {len(results)} results "
                                       f"for {len(group)} jobs")
            except Exception as error:  # fails this group's jobs, not the thread
                log.exception("%s jobs of reader %s failed", kind, reader)
                results = [error] * len(group)
            seconds = time.monotonic() - started
            self._busy_s.append(seconds)
            if self._on_batch is not None:
                self._on_batch(kind, reader, len(group), seconds)
            for job, result in zip(group, results):
                if isinstance(result, BaseException):
                    job.future.set_exception(result)
                else:
                    job.future.set_result(Done(result, started - job.enqueued, len(group)))
