"""The training loop: config in, checkpoints and metrics out; resumable and multi-process.

    result = train(config)                                   # features from config.data
    result = train(config, train_features=f, evaluate_fn=g)  # the integrator's featurizer/metric

Every process runs this same function (SPMD). Per step each process builds only its rows of the
global batch; checkpoints, JSONL and TensorBoard are handled so that they are written once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import logging
import math
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
from dil_jax.checkpoints import CheckpointError
from dil_jax.config import EncoderConfig
from dil_jax.errors import UsageError
from dil_jax.mesh import data_mesh
from dil_jax.model.delayed import DelayedInteractionModel, Params
from dil_jax.train import data as data_lib
from dil_jax.train import sharding as sharding_lib
from dil_jax.train.checkpointing import TrainCheckpointer, abstract_like
from dil_jax.train.default_config import validate_config
from dil_jax.train.log_writers import MetricWriter, Progress
from dil_jax.train.losses import LossWeights
from dil_jax.train.optim import make_optimizer
from dil_jax.train.step import TrainState, init_train_state, make_eval_loss, make_train_step

log = logging.getLogger(__name__)

EvaluateFn = Callable[[Params], dict[str, float]]
SAME_INIT = "student_init"
EXPORT_DIR = "params"


@dataclasses.dataclass
class TrainResult:
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


# ----------------------------------------------------------------------------- setup


def maybe_initialize_distributed(cfg: ml_collections.ConfigDict) -> None:
    """jax.distributed.initialize when configured; must run before any other JAX call.

    On Cloud TPU all arguments may stay None (JAX discovers the pod); elsewhere give the
    coordinator "host:port", the process count and this process's id. CPU processes use gloo
    collectives (JAX's default CPU collectives since 0.5).
    """
    if cfg.num_cpu_devices and jax.config.jax_num_cpu_devices != int(cfg.num_cpu_devices):
        # Only possible before the CPU backend starts (i.e. before any JAX computation).
        jax.config.update("jax_num_cpu_devices", int(cfg.num_cpu_devices))
    if not cfg.initialize or jax.distributed.is_initialized():
        return
    kwargs = {name: cfg[name] for name in ("coordinator_address", "num_processes", "process_id")
              if cfg[name] is not None}
    jax.distributed.initialize(**kwargs)
    log.info("process %d of %d, %d local / %d global devices", jax.process_index(),
             jax.process_count(), jax.local_device_count(), jax.device_count())


def is_remote(workdir: str | Path) -> bool:
    """gs://... and other URLs: orbax writes there; plain files (metrics, export) cannot."""
    return "://" in str(workdir)


def metrics_dir(config: ml_collections.ConfigDict) -> Path:
    """Where process 0 appends metrics.jsonl and TensorBoard events: the workdir if local,
    else `log.local_dir` (object stores such as GCS cannot append to a file)."""
    if is_remote(config.workdir):
        return Path(config.log.local_dir or "runs/" + str(config.workdir).rstrip("/")
                    .rsplit("/", 1)[-1])
    return Path(config.workdir)


def resolve_callable(spec: str, key: str = "") -> Callable:
    """"package.module:function" -> the function; `key` (e.g. "data.featurizer") names the
    config key in errors."""
    where = f"config.{key} = {spec!r}" if key else repr(spec)
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise UsageError(f"{where}: expected 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(f"{where}: cannot import {module_name!r} ({error})") from None
    if not callable(getattr(module, attribute, None)):
        raise UsageError(f"{where}: {module_name} has no function {attribute!r}")
    return getattr(module, attribute)


def _reader_overrides(model_cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    overrides = {"num_lower_layers": model_cfg.num_lower_layers,
                 "max_question_len": model_cfg.max_question_len, "dtype": model_cfg.dtype}
    for name in ("hidden_dropout", "attention_dropout"):
        if model_cfg.get(name) is not None:
            overrides[name] = model_cfg[name]
    return overrides


def load_or_init_params(checkpoint: str | None, encoder: dict[str, Any] | None,
                        overrides: dict[str, Any], rng: jax.Array
                        ) -> tuple[EncoderConfig, Params]:
    """A reader's (config, params): random init, a dil_jax orbax folder, or a Hugging Face one."""
    from dil_jax.checkpoints import ENCODER_CONFIG_FILE, load_hf_checkpoint, load_params

    if not checkpoint:
        fields = {field.name for field in dataclasses.fields(EncoderConfig)}
        unknown = sorted(set(encoder or {}) - fields)
        if unknown:
            raise UsageError(f"config.model.encoder has unknown field(s) {unknown}; "
                             f"EncoderConfig takes {sorted(fields)}")
        config = EncoderConfig(**{**dict(encoder or {}), **overrides})
        params = DelayedInteractionModel(config).init(rng)
        return config, jax.tree.map(np.asarray, params)
    if (Path(checkpoint) / ENCODER_CONFIG_FILE).is_file():
        config, params = load_params(checkpoint, **overrides)
        return config, jax.tree.map(np.asarray, params)
    config, params, _ = load_hf_checkpoint(checkpoint, rng=rng, **overrides)
    return config, params


def build_teacher(config: ml_collections.ConfigDict, student_config: EncoderConfig,
                  student_params: Params, rng: jax.Array
                  ) -> tuple[DelayedInteractionModel | None, Params | None]:
    """The frozen full-model (k = 0) teacher, or (None, None) when no loss needs one."""
    weights = loss_weights(config)
    source = config.teacher.checkpoint
    if not weights.needs_teacher:
        return None, None
    if not source:
        raise UsageError("loss.kd_weight / loss.lrs_weight > 0 need a teacher: set "
                         f"teacher.checkpoint to a checkpoint or {SAME_INIT!r}")
    if source == SAME_INIT:
        teacher_config, params = student_config.replace(num_lower_layers=0), student_params
    else:
        overrides = {"num_lower_layers": 0, "max_question_len": student_config.max_question_len,
                     "dtype": student_config.dtype}
        teacher_config, params = load_or_init_params(source, None, overrides, rng)
    if weights.lrs > 0 and (teacher_config.num_layers, teacher_config.hidden_size) != (
            student_config.num_layers, student_config.hidden_size):
        raise UsageError(f"config.teacher.checkpoint = {source!r}: LRS compares layers one to "
                         "one: teacher and student need the same "
                         f"num_layers and hidden_size, got teacher ({teacher_config.num_layers}, "
                         f"{teacher_config.hidden_size}), student ({student_config.num_layers}, "
                         f"{student_config.hidden_size})")
    return DelayedInteractionModel(teacher_config), params


def loss_weights(config: ml_collections.ConfigDict) -> LossWeights:
    return LossWeights(ce=float(config.loss.ce_weight), kd=float(config.loss.kd_weight),
                       lrs=float(config.loss.lrs_weight),
                       temperature=float(config.loss.temperature))


def load_split(config: ml_collections.ConfigDict, split: str) -> data_lib.Windows | None:
    """Windows of `split` ("train"/"validation") from the configured featurizer, or None."""
    if not config.data.featurizer:
        return None
    featurize = resolve_callable(config.data.featurizer, "data.featurizer")
    features = featurize(config.data, split, max_question_len=config.model.max_question_len)
    return None if features is None else data_lib.windows_from_features(features)


def batch_geometry(config: ml_collections.ConfigDict, num_devices: int) -> tuple[int, int, int]:
    """(global batch, accumulation steps, micro-batch) checked against the device count."""
    global_batch, accum = int(config.batch_size), int(config.grad_accum_steps)
    if accum < 1 or global_batch % accum:
        raise UsageError(f"config.batch_size = {global_batch} is not a multiple of "
                         f"config.grad_accum_steps = {accum}")
    micro = global_batch // accum
    if micro % num_devices:
        raise UsageError(f"micro-batch {micro} (config.batch_size / config.grad_accum_steps) is "
                         f"not a multiple of the {num_devices} devices; every device needs equal "
                         "rows: change config.batch_size")
    return global_batch, accum, micro


def total_train_steps(config: ml_collections.ConfigDict, num_windows: int,
                      global_batch: int) -> int:
    if config.num_train_steps > 0:
        return int(config.num_train_steps)
    per_epoch = data_lib.steps_per_epoch(num_windows, global_batch)
    return max(1, math.ceil(config.num_epochs * per_epoch))


def warmup_steps(config: ml_collections.ConfigDict, total_steps: int) -> int:
    if config.optim.warmup_steps >= 0:
        return int(config.optim.warmup_steps)
    return round(config.optim.warmup_fraction * total_steps)


# ----------------------------------------------------------------------------- evaluation


def validation_loss(eval_fn, params: Params, windows: data_lib.Windows, mesh,
                    batch_size: int) -> float:
    """Mean span CE over all validation windows (the last batch padded with weight-0 rows)."""
    batch_size = -(-batch_size // mesh.devices.size) * mesh.devices.size  # equal device rows
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
    maybe_initialize_distributed(config.distributed)
    workdir = config.workdir if is_remote(config.workdir) else Path(config.workdir)
    is_main = jax.process_index() == 0
    mesh = data_mesh()
    global_batch, accum, micro = batch_geometry(config, mesh.devices.size)

    train_windows = (data_lib.windows_from_features(train_features) if train_features is not None
                     else load_split(config, "train"))
    if train_windows is None:
        raise UsageError("no training data: pass train_features or set config.data.featurizer")
    if data_lib.steps_per_epoch(len(train_windows), global_batch) == 0:
        raise UsageError(f"config.batch_size = {global_batch} is larger than the "
                         f"{len(train_windows)} training windows: one step cannot be filled; "
                         "lower config.batch_size or add training data")
    val_windows = (data_lib.windows_from_features(val_features) if val_features is not None
                   else load_split(config, "validation") if config.eval.use_validation_loss
                   else None)
    total_steps = total_train_steps(config, len(train_windows), global_batch)
    per_epoch = data_lib.steps_per_epoch(len(train_windows), global_batch)
    data_seed = int(config.data_seed)

    root = jax.random.key(int(config.seed))
    init_rng, dropout_rng, teacher_rng = jax.random.split(root, 3)
    encoder = config.model.encoder.to_dict() if config.model.encoder else None
    student_config, params = load_or_init_params(config.model.checkpoint, encoder,
                                                 _reader_overrides(config.model), init_rng)
    student = DelayedInteractionModel(student_config)
    teacher, teacher_params = build_teacher(config, student_config, params, teacher_rng)
    if evaluate_fn is None and config.eval.evaluator:
        evaluate_fn = resolve_callable(config.eval.evaluator, "eval.evaluator")(config, student)

    tx, schedule = make_optimizer(
        config.optim.learning_rate, total_steps, warmup_steps(config, total_steps),
        weight_decay=config.optim.weight_decay, max_grad_norm=config.optim.max_grad_norm,
        b1=config.optim.b1, b2=config.optim.b2, eps=config.optim.eps,
        frozen=tuple(name for name in config.optim.frozen.split(",") if name))
    rep = sharding_lib.replicated(mesh)
    state = jax.jit(lambda p: init_train_state(p, tx), out_shardings=rep)(
        sharding_lib.replicate(params, mesh))
    teacher_params = (None if teacher_params is None
                      else sharding_lib.replicate(teacher_params, mesh))

    best_metric = config.checkpoint.best_metric or None
    produced = ({"val_loss"} if val_windows is not None else set()) | (
        {"exact", "f1"} if evaluate_fn is not None else set())
    if best_metric and best_metric not in produced and evaluate_fn is None:
        # Without the metric every save would count as "no metrics"; say so once, up front.
        log.warning("checkpoint.best_metric %r is not produced by this run (metrics: %s; set "
                    "eval.evaluator for exact/f1): keeping only the last %d checkpoints",
                    best_metric, sorted(produced) or "none", config.checkpoint.keep)
        best_metric = None
    checkpointer = TrainCheckpointer(
        f"{config.workdir}/checkpoints", every_steps=int(config.checkpoint.every_steps),
        keep=int(config.checkpoint.keep), best_metric=best_metric,
        best_mode=config.checkpoint.best_mode, async_save=bool(config.checkpoint.async_save))
    start_step = 0
    # The newest intact checkpoint (a broken newer one is set aside with a warning); a
    # checkpoint of another model shape is refused by name.
    restored = checkpointer.restore_latest(abstract_like(state, rep))
    if restored is not None:
        state, meta = restored
        _check_resume(meta, data_seed, len(train_windows), global_batch, config.workdir)
        dropout_rng = jax.random.wrap_key_data(jnp.asarray(meta["rng_key"], jnp.uint32))
        start_step = int(meta["step"])
        log.info("resumed from step %d (epoch %d, batch %d of the epoch)", start_step,
                 meta["epoch"], meta["position_in_epoch"])
    log_dir = metrics_dir(config)
    if is_main:
        log_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(log_dir / "config.json", config.to_json_best_effort(indent=2))

    step_fn = make_train_step(student, teacher, loss_weights(config), tx, schedule, mesh)
    eval_loss_fn = make_eval_loss(student, mesh) if val_windows is not None else None
    rows_of_process = sharding_lib.process_rows(mesh, accum, micro)
    # Rows past the resumed step are dropped: those steps run again and are logged again.
    writer = MetricWriter(log_dir, enabled=is_main, tensorboard=bool(config.log.tensorboard),
                          resume_step=start_step)
    progress = Progress(total_steps, start_step, global_batch,
                        enabled=is_main and bool(config.log.progress))
    last_metrics: dict[str, float] = {}
    eval_metrics: dict[str, float] = {}

    def evaluate(step: int) -> dict[str, float]:
        metrics: dict[str, float] = {}
        if eval_loss_fn is not None:
            metrics["val_loss"] = validation_loss(eval_loss_fn, state.params, val_windows, mesh,
                                                  int(config.eval.batch_size))
        if evaluate_fn is not None:
            metrics.update({k: float(v) for k, v in evaluate_fn(state.params).items()})
        if metrics:
            writer.write(step, "eval", metrics)
            log.info("step %d eval %s", step, json.dumps(metrics))
        return metrics

    def meta_of(step: int) -> dict[str, Any]:
        epoch, position = data_lib.data_position(step, per_epoch)
        return {"step": step, "epoch": epoch, "position_in_epoch": position,
                "data_seed": data_seed, "num_windows": len(train_windows),
                "global_batch": global_batch,
                "rng_key": np.asarray(jax.random.key_data(dropout_rng)).tolist(),
                "total_steps": total_steps}

    step = start_step
    interrupted_by: str | None = None
    window_start, window_steps = time.perf_counter(), 0
    try:
        with stop_on_signals() as stop:
            while step < total_steps:
                rows = data_lib.global_batch_rows(step, len(train_windows), global_batch,
                                                  data_seed).reshape(accum, micro)
                local = train_windows.batch(rows[:, rows_of_process])
                batch = sharding_lib.put_process_batch(local, mesh, micro)
                state, metrics = step_fn(state, teacher_params, batch, dropout_rng)
                step += 1
                window_steps += 1
                final = step == total_steps
                preempted = stop.set or checkpointer.reached_preemption(step)
                if step % int(config.log.every_steps) == 0 or final or preempted:
                    last_metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
                    elapsed = time.perf_counter() - window_start
                    last_metrics["examples_per_sec"] = window_steps * global_batch / elapsed
                    last_metrics["epoch"] = step / per_epoch
                    window_start, window_steps = time.perf_counter(), 0
                    writer.write(step, "train", last_metrics)
                    progress.update(step, last_metrics["loss"])
                # Our own cadence (orbax's default policy would also save the very first step).
                save_now = step % int(config.checkpoint.every_steps) == 0 or final or preempted
                if save_now:
                    eval_metrics = evaluate(step)
                    checkpointer.save(step, state, meta_of(step), metrics=eval_metrics or None,
                                      force=True)
                if preempted and not final:
                    interrupted_by = stop.signal_name or "preemption"
                if preempted or (stop_after_step is not None and step >= stop_after_step):
                    break
    finally:
        progress.close()
        checkpointer.close()  # waits for an in-flight async save
        writer.close()
    best_step = checkpointer.best_step()
    if config.checkpoint.export_params and step == total_steps and not is_remote(workdir):
        export_reader(checkpointer, best_step, state, rep, workdir / EXPORT_DIR, student_config)
    return TrainResult(state=state, model=student, last_metrics=last_metrics,
                       eval_metrics=eval_metrics, best_step=best_step, workdir=workdir,
                       total_steps=total_steps, interrupted_by=interrupted_by)


def export_reader(checkpointer: TrainCheckpointer, best_step: int | None, state: TrainState,
                  sharding, directory: Path, config: EncoderConfig) -> Path | None:
    """Writes the best (else final) params with `save_params`, the format readers load.

    Single-process only: `save_params` writes from one process with no cross-host barrier; a pod
    run's readers restore from its checkpoints/ instead (or export on one host afterwards).
    """
    from dil_jax.checkpoints import save_params

    if jax.process_count() > 1:
        log.warning("multi-process run: not exporting %s (export from the checkpoint on one "
                    "host)", directory)
        return None
    params = state.params
    if best_step is not None and best_step != int(state.step):
        params = checkpointer.restore(best_step, abstract_like(state, sharding))[0].params
    staging = directory.with_name(directory.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    save_params(staging, jax.device_get(params), config)
    # Swap in the new export; the old one survives until the new one is complete.
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(staging, directory)
    (directory / "trained_from.json").write_text(json.dumps(
        {"step": best_step if best_step is not None else int(state.step),
         "best_step": best_step, "final_step": int(state.step)}, indent=2))
    log.info("exported reader params (step %s) to %s",
             best_step if best_step is not None else int(state.step), directory)
    return directory


def _check_resume(meta: dict[str, Any], data_seed: int, num_windows: int,
                  global_batch: int, workdir: str | Path = "") -> None:
    """A resumed run must see the same data order, or its data position means nothing."""
    saved = (meta["data_seed"], meta["num_windows"], meta["global_batch"])
    if saved != (data_seed, num_windows, global_batch):
        raise CheckpointError(
            f"{workdir}/checkpoints step {meta['step']}: the checkpoint was trained with "
            f"(data_seed, num_windows, global_batch) = {saved}, this run has "
            f"{(data_seed, num_windows, global_batch)}: resuming would not continue the same "
            "data order; use a new workdir (config.workdir) or the run's own settings")
