"""The training loop: config in, checkpoints and metrics out; resumable and multi-process.

`train` reads as its steps: setup (setup.py: devices, data, models, optimizer), resume from the
newest checkpoint, `run_steps` (train, log, evaluate + checkpoint on a cadence, stop on signals),
then export the best params and return a `TrainResult`.

A run that goes non-finite (NaN/Inf loss, gradient norm or params) stops with `TrainingDiverged`
at the next log step or save, naming the first such step: nothing of that state is saved or
exported, so the last checkpoint is the last finite one. The check costs no host sync per step:
each step's flag is folded into a device scalar, read when the loop syncs anyway.

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
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from dil_jax.atomic import write_atomic
from dil_jax.checkpoints import TRAINED_FROM_FILE, CheckpointError
from dil_jax.config import EncoderConfig
from dil_jax.errors import OutputPathError, TrainingDiverged
from dil_jax.mesh import DistributedSettings, data_mesh, maybe_initialize_distributed
from dil_jax.model.delayed import DelayedInteractionModel, Params
from dil_jax.rounding import round_up
from dil_jax.train import data as data_lib
from dil_jax.train import sharding as sharding_lib
from dil_jax.train.checkpointing import (
    BROKEN_DIR,
    TrainCheckpointer,
    abstract_like,
    named_few,
    nonfinite_leaves,
)
from dil_jax.train.config_rules import (
    check_config_paths,
    check_frozen_prefixes,
    validate_config,
    with_current_names,
)
from dil_jax.train.curves import CURVES_FILE
from dil_jax.train.log_writers import METRICS_FILE, TENSORBOARD_DIR, MetricWriter, Progress
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
from dil_jax.train.step import TrainState, init_train_state, make_eval_loss, make_train_step
from dil_jax.train.teacher_logits import with_stored_teacher

log = logging.getLogger(__name__)

EXPORT_DIR = "params"
CHECKPOINT_DIR = "checkpoints"
CONFIG_FILE = "config.json"
# Each config a resume replaced, one JSON line: what changed, and the whole previous config.
CONFIG_HISTORY_FILE = "config_history.jsonl"
# Written into every workdir train creates or adopts: the mark of a folder train owns.
WORKDIR_MARK = "dil_jax_train.json"
# What train writes into a workdir (beside hidden temporary files). A folder holding anything
# else is someone else's (a Hugging Face checkpoint has config.json too): train refuses it.
WORKDIR_ENTRIES = frozenset({
    WORKDIR_MARK, CHECKPOINT_DIR, BROKEN_DIR, CONFIG_FILE, CONFIG_HISTORY_FILE, METRICS_FILE,
    TENSORBOARD_DIR, EXPORT_DIR, EXPORT_DIR + ".new", CURVES_FILE})


@dataclasses.dataclass
class TrainResult:
    """What `train` returns: the final state, the student model, the last logged train and eval
    metrics, and the step of the best checkpoint (None without a best_metric)."""

    state: TrainState
    model: DelayedInteractionModel
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


def make_checkpointer(config: ml_collections.ConfigDict, has_val_loss: bool,
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
        f"{config.workdir}/{CHECKPOINT_DIR}", every_steps=int(config.checkpoint.every_steps),
        keep=int(config.checkpoint.keep), best_metric=best_metric,
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


# ----------------------------------------------------------------------------- divergence

NO_STEP = -1  # the first-non-finite-step scalar while every step was finite


def note_nonfinite(first: jax.Array, nonfinite: jax.Array, step: jax.Array) -> jax.Array:
    """`first` (the first flagged step so far, NO_STEP if none) after a step numbered `step`
    whose flag is `nonfinite`."""
    return jnp.where((first == NO_STEP) & nonfinite, step, first)


def tracking_nonfinite(step_fn, mesh):
    """`step_fn` (state, teacher params, batch, rng) -> (state, metrics) as one jitted call
    (..., first) -> (state, metrics, first) that folds metrics["nonfinite"] into `first`
    with `note_nonfinite`. Folded into the step's own dispatch: a second dispatch per step
    cost the tiny config ~2% more of its dispatch-bound ~1 ms CPU step (measured)."""
    rep, shard = sharding_lib.replicated(mesh), sharding_lib.batch_sharding(mesh)

    def tracked(state, teacher_params, batch, rng, first):
        state, metrics = step_fn(state, teacher_params, batch, rng)
        return state, metrics, note_nonfinite(first, metrics.pop("nonfinite"), state.step)

    return jax.jit(tracked, in_shardings=(rep, rep, shard, rep, rep),
                   out_shardings=(rep, rep, rep), donate_argnums=(0,))


def divergence_hints(config: ml_collections.ConfigDict) -> list[str]:
    """What to change after a divergence, most likely first, for this config's values."""
    hints = [f"lower config.optim.learning_rate (now {config.optim.learning_rate:g})"]
    if int(config.optim.warmup_steps) >= 0:
        hints.append(f"raise config.optim.warmup_steps (now {config.optim.warmup_steps})")
    else:
        hints.append(f"raise config.optim.warmup_fraction (now {config.optim.warmup_fraction:g})")
    if not config.optim.max_grad_norm:
        hints.append("clip gradients (config.optim.max_grad_norm = 1.0)")
    if config.model.dtype != "float32":
        hints.append("compute in config.model.dtype = 'float32'")
    return hints


def diverged_error(first_step: int, last_finite: int | None, directory: str,
                   config: ml_collections.ConfigDict) -> TrainingDiverged:
    """The one-line TrainingDiverged of a run whose step `first_step` went non-finite."""
    if last_finite is None:
        where = f"no checkpoint was saved before it ({directory} holds none)"
    else:
        where = (f"the last finite checkpoint is step {last_finite} in {directory} (a rerun "
                 "with the fix resumes from it)")
    return TrainingDiverged(
        f"training diverged: the loss, gradient norm or params became non-finite (NaN/Inf) at "
        f"step {first_step}; nothing from that step on was saved or exported; {where}. To fix: "
        + ", or ".join(divergence_hints(config)), first_step, last_finite)


def check_finite(first_nonfinite: jax.Array, checkpointer: TrainCheckpointer,
                 config: ml_collections.ConfigDict) -> None:
    """Raises TrainingDiverged when a step so far was flagged. Reading the scalar waits for
    the steps dispatched before it: call it where the loop syncs anyway (log steps, saves)."""
    first = int(jax.device_get(first_nonfinite))
    if first != NO_STEP:
        checkpointer.wait_until_finished()  # an in-flight async save is a finite one
        raise diverged_error(first, checkpointer.latest_step(), checkpointer.directory, config)


def patience_exhausted(checkpointer: TrainCheckpointer, step: int, every_steps: int,
                       patience: int) -> bool:
    """Whether `patience` evaluations (one every `every_steps`) have passed since the best
    checkpoint. Read from the checkpointer's best step, so a resumed run agrees with the run
    it continues."""
    best = checkpointer.best_step()
    if patience <= 0 or best is None:
        return False
    return (step - best) // every_steps >= patience


def evaluation_interval(config: ml_collections.ConfigDict) -> int:
    """Steps between evaluations: eval.every_steps, or every checkpoint when it is 0 (a
    multiple of checkpoint.every_steps, so every evaluation has its checkpoint: the rules
    check it)."""
    every = int(config.eval.get("every_steps", 0))
    return every if every > 0 else int(config.checkpoint.every_steps)


@dataclasses.dataclass
class LoopOutcome:
    state: TrainState
    step: int  # the last step run
    last_metrics: dict[str, float]
    eval_metrics: dict[str, float]
    interrupted_by: str | None
    stopped_early: bool = False


def run_steps(config: ml_collections.ConfigDict, data: RunData, state: TrainState, *,
              step_fn, teacher_params: Params | None, dropout_rng: jax.Array, mesh,
              start_step: int, checkpointer: TrainCheckpointer, writer: MetricWriter,
              progress: Progress, evaluate_at: Callable[[Params, int], dict[str, float]],
              stop_after_step: int | None) -> LoopOutcome:
    """Steps from `start_step` until total_steps, a signal/preemption or stop_after_step; logs
    every config.log.every_steps, checkpoints every config.checkpoint.every_steps and evaluates
    every eval.every_steps (0: at every checkpoint; always at the last step and on a signal);
    stops early per config.eval.patience (counted in evaluations)."""
    rows_of_process = sharding_lib.process_rows(mesh, data.accum, data.micro)
    last_metrics: dict[str, float] = {}
    eval_metrics: dict[str, float] = {}
    step = start_step
    interrupted_by: str | None = None
    every_steps, patience = int(config.checkpoint.every_steps), int(config.eval.get("patience", -1))
    eval_every = evaluation_interval(config)
    # A rerun of an early-stopped run trains no further (its checkpoints say it stopped).
    stopped_early = start_step > 0 and patience_exhausted(checkpointer, start_step, eval_every,
                                                          patience)
    window_start, window_steps = time.perf_counter(), 0
    tracked_step = tracking_nonfinite(step_fn, mesh)
    first_nonfinite = jax.jit(lambda: jnp.asarray(NO_STEP, jnp.int32),
                              out_shardings=sharding_lib.replicated(mesh))()
    with stop_on_signals() as stop:
        while step < data.total_steps and not stopped_early:
            local = data.step_batch(step, rows_of_process)
            batch = sharding_lib.put_process_batch(local, mesh, data.micro)
            state, metrics, first_nonfinite = tracked_step(state, teacher_params, batch,
                                                           dropout_rng, first_nonfinite)
            step += 1
            window_steps += 1
            final = step == data.total_steps
            preempted = stop.set or checkpointer.reached_preemption(step)
            if step % int(config.log.every_steps) == 0 or final or preempted:
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
                # (LatestN keeps it), never "best".
                evaluated = step % eval_every == 0 or final or preempted
                eval_metrics = evaluate_at(state.params, step) if evaluated else {}
                checkpointer.save(step, state, checkpoint_meta(step, data, dropout_rng),
                                  metrics=eval_metrics or None, force=True)
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


# ----------------------------------------------------------------------------- workdir


def workdir_problem(workdir: str | Path) -> str | None:
    """Why train must not write into the local `workdir`, or None when it may: it is new, empty,
    or a train workdir (the mark, or one written by older code: checkpoints/, or nothing but
    train's own files beside metrics.jsonl). The rule of `dil-jax index --out`: never write
    into a folder another tool filled (config.json would overwrite a Hugging Face model's)."""
    if not str(workdir).strip():
        return ("--config.workdir is empty: train would write checkpoints/, config.json and "
                "params/ into the current folder; give a folder path, e.g. runs/NAME")
    folder = Path(workdir)
    if not folder.is_dir() or (folder / WORKDIR_MARK).is_file():
        return None  # a file is refused by check_output_folder, naming it
    if (folder / CHECKPOINT_DIR).is_dir():
        return None  # an older train workdir: resuming it keeps working
    foreign = sorted(entry.name for entry in folder.iterdir()
                     if entry.name not in WORKDIR_ENTRIES and not entry.name.startswith("."))
    if not foreign and ((folder / METRICS_FILE).is_file() or not any(
            not entry.name.startswith(".") for entry in folder.iterdir())):
        return None
    held = named_few(sorted(e.name for e in folder.iterdir() if not e.name.startswith(".")),
                     limit=4)
    return (f"--config.workdir {folder} is a folder that train did not write (it holds {held}; "
            f"no {WORKDIR_MARK} or {CHECKPOINT_DIR}/ marks it as a train workdir): training "
            f"would write {CONFIG_FILE}, {CHECKPOINT_DIR}/ and {EXPORT_DIR}/ among its files; "
            "choose a new or empty folder")


def claim_workdir(workdir: str | Path) -> None:
    """Refuses (OutputPathError) a workdir train may not write into; marks a local one as
    train's, so a later run recognises it whatever it then holds. Remote workdirs are left to
    the checkpointer."""
    if is_remote(workdir):
        return
    problem = workdir_problem(workdir)
    if problem:
        raise OutputPathError(problem)
    mark = Path(workdir) / WORKDIR_MARK
    if jax.process_index() == 0 and not mark.is_file():
        write_atomic(mark, json.dumps({"written_by": "dil-jax train", "note": (
            "marks a training workdir: train resumes in it, and refuses folders without it "
            "that hold files it did not write")}, indent=2))


def flat_config(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"optim.learning_rate": 3e-05, ...} of a config's JSON dict: one entry per leaf."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(flat_config(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """"key old -> new" for every leaf that differs (absent: "(none)"; a renamed key: no change)."""
    old_flat, new_flat = with_current_names(flat_config(old)), flat_config(new)
    return [f"{key} {old_flat.get(key, '(none)')!s} -> {new_flat.get(key, '(none)')!s}"
            for key in sorted(old_flat.keys() | new_flat.keys())
            if old_flat.get(key, "(none)") != new_flat.get(key, "(none)")]


def record_config(log_dir: Path, config_json: str, start_step: int) -> list[str]:
    """Writes the run's config.json. One of an earlier run with other values is not lost: it
    is appended to config_history.jsonl with the changed keys, which a WARNING lists (a resume
    with another learning rate is a different run from that step on). Returns the changes."""
    path = log_dir / CONFIG_FILE
    changes: list[str] = []
    if path.is_file():
        old_text = path.read_text(encoding="utf-8")
        try:
            old: Any = json.loads(old_text)
        except ValueError:
            old = old_text  # unreadable: kept as it is
        changes = (config_changes(old, json.loads(config_json)) if isinstance(old, dict)
                   else ["(the previous config.json was not readable JSON)"])
        if changes:
            history = log_dir / CONFIG_HISTORY_FILE
            entry = json.dumps({"replaced_at_step": start_step, "time": time.time(),
                                "changed": changes, "config": old})
            previous = history.read_text(encoding="utf-8") if history.is_file() else ""
            write_atomic(history, previous + entry + "\n")
            log.warning("the config differs from %s of the run this one continues (from step "
                        "%d): %s; the previous config is kept in %s", path, start_step,
                        "; ".join(changes), history)
    write_atomic(path, config_json)
    return changes


def train(config: ml_collections.ConfigDict, *,
          train_features: data_lib.FeaturesLike | None = None,
          val_features: data_lib.FeaturesLike | None = None,
          evaluate_fn: EvaluateFn | None = None,
          stop_after_step: int | None = None) -> TrainResult:
    """Trains per `config` (see configs/*.py), resuming from `config.workdir` if it holds
    checkpoints.

    train_features / val_features: featurizer output; default: `config.data.featurizer`.
    evaluate_fn: params -> {"exact", "f1", ...} on the validation split; default:
      `config.eval.evaluator` ("module:factory", factory(config, model) -> evaluate_fn), if set.
      It is called on every process with globally-replicated params.
    stop_after_step: return right after this step (and its checkpoint, if one is due), as an
      interrupted run would; the next call resumes.
    """
    validate_config(config)  # before anything loads: a bad value is named by its key
    check_config_paths(config)  # the files it names exist (before any model loads)
    maybe_initialize_distributed(DistributedSettings.from_mapping(config.distributed))
    claim_workdir(config.workdir)
    workdir = config.workdir if is_remote(config.workdir) else Path(config.workdir)
    is_main = jax.process_index() == 0
    mesh = data_mesh()
    # Models first: their length check is cheap, featurizing the data is not.
    models = load_run_models(config, evaluate_fn)
    check_frozen_prefixes(config, models.student.params)
    data = load_run_data(config, mesh.devices.size, train_features, val_features)
    data, models = with_stored_teacher(config, data, models)  # teacher.logits_file

    tx, schedule = make_run_optimizer(config, data.total_steps)
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
        record_config(log_dir, config.to_json_best_effort(indent=2), start_step)

    teacher = None if models.teacher is None else models.teacher.model
    step_fn = make_train_step(models.student.model, teacher, loss_weights(config), tx, schedule,
                              mesh)
    eval_loss_fn = (make_eval_loss(models.student.model, mesh) if data.validation is not None
                    else None)
    # Rows past the resumed step are dropped: those steps run again and are logged again.
    writer = MetricWriter(log_dir, enabled=is_main, tensorboard=bool(config.log.tensorboard),
                          resume_step=start_step)
    progress = Progress(data.total_steps, start_step, data.global_batch,
                        enabled=is_main and bool(config.log.progress))
    evaluate_at = functools.partial(
        evaluate, eval_loss_fn=eval_loss_fn, evaluate_fn=models.evaluate_fn, data=data,
        mesh=mesh, batch_size=int(config.eval.batch_size), writer=writer)
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
        export_reader(checkpointer, best_step, outcome.state, rep, workdir / EXPORT_DIR,
                      models.student.config,
                      exported_metrics(checkpointer, best_step, outcome))
    return TrainResult(state=outcome.state, model=models.student.model,
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


def export_reader(checkpointer: TrainCheckpointer, best_step: int | None, state: TrainState,
                  sharding, directory: Path, config: EncoderConfig,
                  metrics: dict[str, float] | None = None) -> Path | None:
    """Writes the best (else final) params with `save_params`, the format readers load, and
    `trained_from.json`: the steps, and the null threshold when `metrics` (the exported step's
    evaluation) holds one (a SQuAD v2.0 run: `dil-jax predict` then uses it).

    Single-process only: `save_params` writes from one process with no cross-host barrier; a pod
    run's readers restore from its checkpoints/ instead (or export on one host afterwards).
    """
    from dil_jax.checkpoints.char_readers import save_reader_params  # any model kind

    if jax.process_count() > 1:
        log.warning("multi-process run: not exporting %s (export from the checkpoint on one "
                    "host)", directory)
        return None
    params = state.params
    if best_step is not None and best_step != int(state.step):
        params = checkpointer.restore(best_step, abstract_like(state, sharding))[0].params
        # Its bytes may have changed on disk since it was saved: never export NaN params.
        nonfinite = nonfinite_leaves(params)
        if nonfinite:
            raise CheckpointError(
                f"{checkpointer.directory} step {best_step} (the best checkpoint) holds "
                f"non-finite values (NaN/Inf) in {named_few(nonfinite)}: not exporting it; "
                "move that step aside and rerun to export the next best")
    staging = directory.with_name(directory.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    save_reader_params(staging, jax.device_get(params), config)
    record: dict[str, Any] = {"step": best_step if best_step is not None else int(state.step),
                              "best_step": best_step, "final_step": int(state.step)}
    if metrics and "null_threshold" in metrics:
        record["null_threshold"] = float(metrics["null_threshold"])
    # Staged with the params, so no reader sees params without their threshold.
    (staging / TRAINED_FROM_FILE).write_text(json.dumps(record, indent=2))
    # Swap in the new export; the old one survives until the new one is complete.
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(staging, directory)
    log.info("exported reader params (step %s%s) to %s", record["step"],
             f", null threshold {record['null_threshold']:g}" if "null_threshold" in record
             else "", directory)
    return directory


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
