"""The training loop: config in, checkpoints and metrics out; resumable and multi-process.

`train` reads as its steps: setup (setup.py: devices, data, models, optimizer), claim the workdir
and record its config (workdir.py), resume from the newest checkpoint, `run_steps` (train, log,
evaluate + checkpoint on a cadence, stop on signals), then export the best params (export.py) and
return a `TrainResult`.

A run that goes non-finite (NaN/Inf loss, gradient norm or params) stops with `TrainingDiverged`
at the next log step or save, naming the first such step: nothing of that state is saved or
exported, so the last checkpoint is the last finite one. The check costs no host sync per step:
each step's flag is folded into a device scalar, read when the loop syncs anyway
(divergence.py).

    result = train(config)                                   # features from config.data
    result = train(config, train_features=f, evaluate_fn=g)  # the integrator's featurizer/metric

Every process runs this same function (SPMD). Per step each process builds only its rows of the
global batch; checkpoints, JSONL and TensorBoard are handled so that they are written once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from dil_jax.checkpoints import CheckpointError
from dil_jax.mesh import data_mesh, maybe_initialize_distributed
from dil_jax.model.delayed import Params
from dil_jax.readers.protocol import Reader
from dil_jax.rounding import round_up
from dil_jax.train import data as data_lib
from dil_jax.train import sharding as sharding_lib
from dil_jax.train.checkpointing import TrainCheckpointer, abstract_like
from dil_jax.train.config_rules import check_config_paths, check_frozen_prefixes, validate_config
from dil_jax.train.divergence import NO_STEP, check_finite, tracking_nonfinite
from dil_jax.train.export import export_reader
from dil_jax.train.log_writers import MetricWriter, Progress
from dil_jax.train.setup import (
    EvaluateFn,
    RunData,
    is_remote,
    load_run_data,
    load_run_models,
    loss_weights,
    make_run_optimizer,
    metrics_dir,
)
from dil_jax.train.step import (
    TrainState,
    init_train_state,
    make_eval_loss,
    make_train_step,
    weights_of,
)
from dil_jax.train.teacher_logits import with_stored_teacher
from dil_jax.train.train_config import TrainConfig
from dil_jax.train.workdir import CHECKPOINT_DIR, EXPORT_DIR, claim_workdir, record_config

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainResult:
    """What `train` returns: the final state, the student (the Reader trained: its model, and
    the params it started from), the last logged train and eval metrics, and the step of the
    best checkpoint (None without a best_metric)."""

    state: TrainState
    student: Reader
    last_metrics: dict[str, float]
    eval_metrics: dict[str, float]
    best_step: int | None
    workdir: Path | str
    total_steps: int = 0
    # "SIGTERM", "SIGINT" or "preemption" when a signal stopped the run before total_steps
    # (a checkpoint of the last finished step was saved); None otherwise.
    interrupted_by: str | None = None
    # True when eval.patience evaluations passed without a new best (early stopping).
    stopped_early: bool = False


# ----------------------------------------------------------------------------- evaluation


def validation_loss(eval_fn, params: Params, windows: data_lib.Windows, mesh,
                    batch_size: int) -> float:
    """Mean span CE over all validation windows (the last batch padded with weight-0 rows)."""
    batch_size = round_up(batch_size, mesh.devices.size)  # equal device rows
    rows_of_process = sharding_lib.process_rows(mesh, 1, batch_size)
    total = count = 0.0
    for begin in range(0, len(windows), batch_size):
        rows = np.arange(begin, begin + batch_size)
        weights = (rows < len(windows)).astype(np.float32)
        rows = np.where(rows < len(windows), rows, 0)[None, rows_of_process]
        local = windows.batch(rows)
        local["weight"] = weights[None, rows_of_process]
        batch = sharding_lib.put_process_batch(local, mesh, batch_size)
        weight = batch.pop("weight")
        loss_sum, weight_sum = eval_fn(params, batch, weight)
        total += float(loss_sum)
        count += float(weight_sum)
    return total / max(count, 1.0)


# ----------------------------------------------------------------------------- loop


class StopFlag:
    """Set by SIGTERM/SIGINT (single process): the loop saves a checkpoint and returns."""

    def __init__(self) -> None:
        self.set = False
        self.signal_name: str | None = None

    def handle(self, signum, _frame) -> None:
        self.signal_name = signal.Signals(signum).name
        log.warning("%s: saving a checkpoint at the end of this step", self.signal_name)
        self.set = True


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopFlag]:
    """Installs SIGTERM/SIGINT handlers for the duration of the loop (main thread only).

    Multi-process runs use JAX's preemption sync point instead: all hosts must agree on the step.
    """
    flag, previous = StopFlag(), {}
    if jax.process_count() == 1:
        try:
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, flag.handle)
        except ValueError:  # not the main thread: no handlers
            pass
    try:
        yield flag
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def make_checkpointer(config: TrainConfig, has_val_loss: bool,
                      has_evaluator: bool) -> TrainCheckpointer:
    """The checkpointer of config.checkpoint; best_metric is dropped (with a warning) when
    this run cannot produce it."""
    best_metric = config.checkpoint.best_metric or None
    produced = ({"val_loss"} if has_val_loss else set()) | (
        {"exact", "f1"} if has_evaluator else set())
    if best_metric and best_metric not in produced and not has_evaluator:
        # Without the metric every save would count as "no metrics"; say so once, up front.
        log.warning("checkpoint.best_metric %r is not produced by this run (metrics: %s; set "
                    "eval.evaluator for exact/f1): keeping only the last %d checkpoints",
                    best_metric, sorted(produced) or "none", config.checkpoint.keep)
        best_metric = None
    return TrainCheckpointer(
        f"{config.workdir}/{CHECKPOINT_DIR}", every_steps=config.checkpoint.every_steps,
        keep=config.checkpoint.keep, best_metric=best_metric,
        best_mode=config.checkpoint.best_mode, async_save=bool(config.checkpoint.async_save))


def resume(checkpointer: TrainCheckpointer, state: TrainState, sharding, data: RunData,
           dropout_rng: jax.Array, workdir: str | Path
           ) -> tuple[TrainState, jax.Array, int]:
    """(state, dropout key, first step) of the newest intact checkpoint, or the inputs and step
    0 when there is none. A broken newer checkpoint is set aside with a warning; one of another
    model shape or data order is refused by name."""
    restored = checkpointer.restore_latest(abstract_like(state, sharding))
    if restored is None:
        return state, dropout_rng, 0
    state, meta = restored
    _check_resume(meta, data_identity(data), workdir)
    dropout_rng = jax.random.wrap_key_data(jnp.asarray(meta["rng_key"], jnp.uint32))
    log.info("resumed from step %d (epoch %d, batch %d of the epoch)", int(meta["step"]),
             meta["epoch"], meta["position_in_epoch"])
    return state, dropout_rng, int(meta["step"])


def checkpoint_meta(step: int, data: RunData, dropout_rng: jax.Array) -> dict[str, Any]:
    """What a checkpoint records beside the state: the data position and the dropout key."""
    epoch, position = data_lib.data_position(step, data.per_epoch)
    return {"step": step, "epoch": epoch, "position_in_epoch": position,
            **data_identity(data),
            "rng_key": np.asarray(jax.random.key_data(dropout_rng)).tolist(),
            "total_steps": data.total_steps}


def data_identity(data: RunData) -> dict[str, Any]:
    """What fixes the data order: the seed, the windows (distractors included), the units the
    order permutes (windows, or question groups of `group_size` with loss.shared_norm; 0 = no
    groups) and the global batch. Checkpoints record it; a resume must find it unchanged."""
    return {"data_seed": data.seed, "num_windows": len(data.train),
            "num_units": data.train.num_units, "group_size": data.train.group_size,
            "global_batch": data.global_batch,
            "length_buckets": [] if data.buckets is None else list(data.buckets.lengths)}


def evaluate(params: Params, step: int, *, eval_loss_fn, evaluate_fn: EvaluateFn | None,
             data: RunData, mesh, batch_size: int, writer: MetricWriter) -> dict[str, float]:
    """Validation loss and/or the evaluator's metrics at `step`, logged; {} when neither."""
    metrics: dict[str, float] = {}
    if eval_loss_fn is not None:
        metrics["val_loss"] = validation_loss(eval_loss_fn, params, data.validation, mesh,
                                              batch_size)
    if evaluate_fn is not None:
        metrics.update({k: float(v) for k, v in evaluate_fn(params).items()})
    if metrics:
        writer.write(step, "eval", metrics)
        log.info("step %d eval %s", step, json.dumps(metrics))
        writer.draw_curves()
    return metrics


def patience_exhausted(checkpointer: TrainCheckpointer, step: int, every_steps: int,
                       patience: int) -> bool:
    """Whether `patience` evaluations (one every `every_steps`) have passed since the best
    checkpoint. Read from the checkpointer's best step, so a resumed run agrees with the run
    it continues."""
    best = checkpointer.best_step()
    if patience <= 0 or best is None:
        return False
    return (step - best) // every_steps >= patience


def evaluation_interval(config: TrainConfig) -> int:
    """Steps between evaluations: eval.every_steps, or every checkpoint when it is 0 (a
    multiple of checkpoint.every_steps, so every evaluation has its checkpoint: the rules
    check it)."""
    every = config.eval.every_steps
    return every if every > 0 else config.checkpoint.every_steps


@dataclasses.dataclass
class LoopOutcome:
    state: TrainState
    step: int  # the last step run
    last_metrics: dict[str, float]
    eval_metrics: dict[str, float]
    interrupted_by: str | None
    stopped_early: bool = False


# Asynchronous dispatch lets the host queue steps far ahead of the device (up to the next sync,
# a whole log window). A signal is seen by the host, so a SIGTERM would then wait for every queued
# step to run before the save (minutes of a preempted machine's ~30 s): the host keeps at most
# this many steps queued, which still overlaps the next batch's preparation with a running step.
MAX_STEPS_IN_FLIGHT = 2


def wait_for_steps_in_flight(in_flight: deque, metrics: Any,
                             limit: int = MAX_STEPS_IN_FLIGHT) -> None:
    """Records the step just dispatched (its `metrics`, device values) and blocks until all but
    the newest `limit` dispatched steps have run."""
    in_flight.append(metrics)
    while len(in_flight) > limit:
        jax.block_until_ready(in_flight.popleft())


def run_steps(config: TrainConfig, data: RunData, state: TrainState, *,
              step_fn, teacher_params: Params | None, dropout_rng: jax.Array, mesh,
              start_step: int, checkpointer: TrainCheckpointer, writer: MetricWriter,
              progress: Progress, evaluate_at: Callable[[Params, int], dict[str, float]],
              stop_after_step: int | None) -> LoopOutcome:
    """Steps from `start_step` until total_steps, a signal/preemption or stop_after_step; logs
    every config.log.every_steps, checkpoints every config.checkpoint.every_steps and evaluates
    every eval.every_steps (0: at every checkpoint; always at the last step; on a signal only
    with checkpoint.evaluate_on_signal);
    stops early per config.eval.patience (counted in evaluations)."""
    rows_of_process = sharding_lib.process_rows(mesh, data.accum, data.micro)
    last_metrics: dict[str, float] = {}
    eval_metrics: dict[str, float] = {}
    step = start_step
    interrupted_by: str | None = None
    every_steps, patience = config.checkpoint.every_steps, config.eval.patience
    evaluate_on_signal = config.checkpoint.evaluate_on_signal
    eval_every = evaluation_interval(config)
    # A rerun of an early-stopped run trains no further (its checkpoints say it stopped).
    stopped_early = start_step > 0 and patience_exhausted(checkpointer, start_step, eval_every,
                                                          patience)
    window_start, window_steps = time.perf_counter(), 0
    tracked_step = tracking_nonfinite(step_fn, mesh)
    first_nonfinite = jax.jit(lambda: jnp.asarray(NO_STEP, jnp.int32),
                              out_shardings=sharding_lib.replicated(mesh))()
    in_flight: deque = deque()  # metrics of the steps dispatched and maybe not yet run
    with stop_on_signals() as stop:
        while step < data.total_steps and not stopped_early:
            local = data.step_batch(step, rows_of_process)
            batch = sharding_lib.put_process_batch(local, mesh, data.micro)
            state, metrics, first_nonfinite = tracked_step(state, teacher_params, batch,
                                                           dropout_rng, first_nonfinite)
            step += 1
            wait_for_steps_in_flight(in_flight, metrics)
            window_steps += 1
            final = step == data.total_steps
            preempted = stop.set or checkpointer.reached_preemption(step)
            if step % config.log.every_steps == 0 or final or preempted:
                last_metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
                elapsed = time.perf_counter() - window_start
                last_metrics["examples_per_sec"] = window_steps * data.global_batch / elapsed
                last_metrics["epoch"] = step / data.per_epoch
                window_start, window_steps = time.perf_counter(), 0
                writer.write(step, "train", last_metrics)  # a NaN row too: it shows the failure
                progress.update(step, last_metrics["loss"])
                check_finite(first_nonfinite, checkpointer, config)
            # Our own cadence (orbax's default policy would also save the very first step).
            save_now = step % every_steps == 0 or final or preempted
            if save_now:
                check_finite(first_nonfinite, checkpointer, config)  # never save a NaN state
                # A checkpoint between evaluations is saved without metrics: it serves resuming
                # (LatestN keeps it), never "best". So is one on a signal or a preemption, at
                # once (config.checkpoint.evaluate_on_signal says why), unless asked otherwise.
                if preempted and not final:
                    evaluated = evaluate_on_signal
                else:
                    evaluated = step % eval_every == 0 or final
                paused = time.perf_counter()
                eval_metrics = evaluate_at(weights_of(state), step) if evaluated else {}
                checkpointer.save(step, state, checkpoint_meta(step, data, dropout_rng),
                                  metrics=eval_metrics or None, force=True)
                # examples/s measures training steps: evaluations and saves are left out.
                paused = time.perf_counter() - paused
                window_start += paused
                progress.exclude(paused)
                stopped_early = not final and evaluated and patience_exhausted(
                    checkpointer, step, eval_every, patience)
                if stopped_early:
                    log.info("early stopping at step %d: no better %s in %d evaluations since "
                             "step %d", step, config.checkpoint.best_metric, patience,
                             checkpointer.best_step())
            if preempted and not final:
                interrupted_by = stop.signal_name or "preemption"
            if preempted or (stop_after_step is not None and step >= stop_after_step):
                break
    check_finite(first_nonfinite, checkpointer, config)  # the state returned (and exported)
    return LoopOutcome(state, step, last_metrics, eval_metrics, interrupted_by, stopped_early)


def train(config: ml_collections.ConfigDict, *,
          train_features: data_lib.FeaturesLike | None = None,
          val_features: data_lib.FeaturesLike | None = None,
          evaluate_fn: EvaluateFn | None = None,
          stop_after_step: int | None = None) -> TrainResult:
    """Trains per `config` (see configs/*.py), resuming from `config.workdir` if it holds
    checkpoints.

    train_features / val_features: featurizer output; default: `config.data.featurizer`.
    evaluate_fn: params -> {"exact", "f1", ...} on the validation split; default:
      `config.eval.evaluator` ("module:factory", factory(config, student) -> evaluate_fn, the
      student a Reader), if set.
      It is called on every process with globally-replicated params.
    stop_after_step: return right after this step (and its checkpoint, if one is due), as an
      interrupted run would; the next call resumes.
    """
    config = validate_config(config)  # before anything loads: a bad value is named by its key
    check_config_paths(config)  # the files it names exist (before any model loads)
    maybe_initialize_distributed(config.distributed)
    claim_workdir(config.workdir)
    workdir = config.workdir if is_remote(config.workdir) else Path(config.workdir)
    is_main = jax.process_index() == 0
    mesh = data_mesh()
    # Models first: their length check is cheap, featurizing the data is not.
    models = load_run_models(config, evaluate_fn)
    check_frozen_prefixes(config.optim.frozen, models.student.params)
    data = load_run_data(config, models.student, mesh.devices.size, train_features,
                         val_features)
    data, models = with_stored_teacher(config, data, models)  # teacher.logits_file

    tx, schedule = make_run_optimizer(config, data.total_steps, models.student)
    rep = sharding_lib.replicated(mesh)
    state = jax.jit(lambda p: init_train_state(p, tx), out_shardings=rep)(
        sharding_lib.replicate(models.student.params, mesh))
    teacher_params = (None if models.teacher is None
                      else sharding_lib.replicate(models.teacher.params, mesh))
    checkpointer = make_checkpointer(config, data.validation is not None,
                                     models.evaluate_fn is not None)
    state, dropout_rng, start_step = resume(checkpointer, state, rep, data, models.dropout_rng,
                                            config.workdir)
    log_dir = metrics_dir(config)
    if is_main:
        log_dir.mkdir(parents=True, exist_ok=True)
        record_config(log_dir, config.source.to_json_best_effort(indent=2), start_step)

    teacher = None if models.teacher is None else models.teacher.model
    step_fn = make_train_step(models.student, teacher, loss_weights(config), tx, schedule, mesh)
    eval_loss_fn = (make_eval_loss(models.student, mesh) if data.validation is not None
                    else None)
    # Rows past the resumed step are dropped: those steps run again and are logged again.
    writer = MetricWriter(log_dir, enabled=is_main, tensorboard=config.log.tensorboard,
                          resume_step=start_step)
    progress = Progress(data.total_steps, start_step, data.global_batch,
                        enabled=is_main and config.log.progress)
    evaluate_at = functools.partial(
        evaluate, eval_loss_fn=eval_loss_fn, evaluate_fn=models.evaluate_fn, data=data,
        mesh=mesh, batch_size=config.eval.batch_size, writer=writer)
    try:
        outcome = run_steps(config, data, state, step_fn=step_fn, teacher_params=teacher_params,
                            dropout_rng=dropout_rng, mesh=mesh, start_step=start_step,
                            checkpointer=checkpointer, writer=writer, progress=progress,
                            evaluate_at=evaluate_at, stop_after_step=stop_after_step)
    finally:
        progress.close()
        checkpointer.close()  # waits for an in-flight async save
        writer.close()
    best_step = checkpointer.best_step()
    finished = outcome.step == data.total_steps or outcome.stopped_early
    if config.checkpoint.export_params and finished and not is_remote(workdir):
        reads_text = train_features is None and data_lib.featurizes_text(config.data.featurizer)
        export_reader(checkpointer, best_step, outcome.state, rep, workdir / EXPORT_DIR,
                      models.student,
                      exported_metrics(checkpointer, best_step, outcome),
                      # Features handed in were windowed by their maker, as the config may not
                      # say; synthetic ones have no windows or tokenizer to record.
                      config.data.trained_windows() if reads_text else None,
                      config.data.tokenizer if reads_text else None)
    return TrainResult(state=outcome.state, student=models.student,
                       last_metrics=outcome.last_metrics, eval_metrics=outcome.eval_metrics,
                       best_step=best_step, workdir=workdir, total_steps=data.total_steps,
                       interrupted_by=outcome.interrupted_by,
                       stopped_early=outcome.stopped_early)


def exported_metrics(checkpointer: TrainCheckpointer, best_step: int | None,
                     outcome: LoopOutcome) -> dict[str, float]:
    """The evaluation metrics of the step `export_reader` exports: the best step's, as saved
    with it, else (no best_metric) the final step's evaluation; {} when neither is known."""
    step = best_step if best_step is not None else outcome.step
    saved = checkpointer.metrics(step)
    if saved is not None:
        return saved
    return outcome.eval_metrics if step == outcome.step else {}


def _check_resume(meta: dict[str, Any], identity: dict[str, Any],
                  workdir: str | Path = "") -> None:
    """A resumed run must see the same data order, or its data position means nothing.

    identity: `data_identity` of this run. Checkpoints written before shared normalisation have
    no num_units / group_size: they trained on single windows (units = windows, no groups);
    those written before length buckets, none: one length.
    """
    defaults = {"num_units": meta["num_windows"], "group_size": 0, "length_buckets": []}
    saved = {key: meta.get(key, defaults.get(key)) for key in identity}
    if saved != identity:
        changed = ", ".join(f"{key} {saved[key]} -> {identity[key]}" for key in identity
                            if saved[key] != identity[key])
        raise CheckpointError(
            f"{workdir}/checkpoints step {meta['step']}: the checkpoint was trained on another "
            f"data order ({changed}): resuming would not continue the same data order; use a "
            "new workdir (config.workdir) or the run's own settings")
