"""From a training config to what the loop runs: devices, data, models and optimizer.

Each function reads one part of a validated, typed config (`train_config.TrainConfig`, the
sections of default_config.py):

    load_run_data                 config.data, batch_size, grad_accum_steps, the student
                                  -> RunData
    load_run_models               config.model, config.teacher, config.eval -> RunModels
    make_run_optimizer            config.optim -> (optax transformation, schedule)
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax

from dil_jax.errors import UsageError
from dil_jax.model.delayed import Params
from dil_jax.model.encoder_config import EncoderConfig, ReaderOverrides
from dil_jax.readers import Reader, init_reader, load_reader
from dil_jax.train import data as data_lib
from dil_jax.train.buckets import BucketedOrder, cut_passages, parse_buckets, unit_real_lengths
from dil_jax.train.char_data import windows_of
from dil_jax.train.losses import LossWeights
from dil_jax.train.null_windows import sample_null_windows
from dil_jax.train.optim import ema_params, make_optimizer
from dil_jax.train.reader_kinds import CHAR_READER_KINDS, char_student
from dil_jax.train.train_config import TrainConfig

log = logging.getLogger(__name__)

EvaluateFn = Callable[[Params], dict[str, float]]
# teacher.checkpoint value: the student's own initial params, read as a full (k = 0) model.
SAME_INIT = "student_init"


def is_remote(workdir: str | Path) -> bool:
    """gs://... and other URLs: orbax writes there; plain files (metrics, export) cannot."""
    return "://" in str(workdir)


def metrics_dir(config: TrainConfig) -> Path:
    """Where process 0 appends metrics.jsonl and TensorBoard events: the workdir if local,
    else `log.local_dir` (object stores such as GCS cannot append to a file)."""
    if is_remote(config.workdir):
        return Path(config.log.local_dir or "runs/" + config.workdir.rstrip("/")
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


def load_or_init_reader(checkpoint: str | None, encoder: dict[str, Any] | None,
                        overrides: ReaderOverrides, rng: jax.Array) -> Reader:
    """A reader to train, without a tokenizer (the featurizer has its own), params as host
    arrays: random init of `encoder` (EncoderConfig fields) when no checkpoint is given, else
    `load_reader` of a dil_jax or Hugging Face checkpoint. `overrides` win over both."""
    if not checkpoint:
        fields = {field.name for field in dataclasses.fields(EncoderConfig)}
        unknown = sorted(set(encoder or {}) - fields)
        if unknown:
            raise UsageError(f"config.model.encoder has unknown field(s) {unknown}; "
                             f"EncoderConfig takes {sorted(fields)}")
        return init_reader(overrides.config_of(dict(encoder or {})), rng)
    reader = load_reader(checkpoint, overrides=overrides, rng=rng, with_tokenizer=False)
    return reader.with_params(jax.tree.map(np.asarray, reader.params))


def build_teacher(config: TrainConfig, student: Reader, rng: jax.Array
                  ) -> Reader | None:
    """The frozen full-model (k = 0) teacher, or None when no loss needs one."""
    weights = loss_weights(config)
    source = config.teacher.checkpoint
    if not weights.needs_teacher:
        return None
    if not source:
        raise UsageError("loss.kd_weight / loss.lrs_weight > 0 need a teacher: set "
                         f"teacher.checkpoint to a checkpoint or {SAME_INIT!r}")
    if source == SAME_INIT:
        # The student's initial params read as the full model with full attention: the
        # student's own LSH blocks (model.lsh_attention_layers) are an approximation it trains with.
        teacher = student.with_config(num_lower_layers=0, lsh_attention_layers=())
    else:
        overrides = ReaderOverrides(num_lower_layers=0,
                                    max_question_len=student.config.max_question_len,
                                    dtype=student.config.dtype)
        teacher = load_or_init_reader(source, None, overrides, rng)
    if weights.lrs > 0 and (teacher.config.num_layers, teacher.config.hidden_size) != (
            student.config.num_layers, student.config.hidden_size):
        raise UsageError(f"config.teacher.checkpoint = {source!r}: LRS compares layers one to "
                         "one: teacher and student need the same "
                         f"num_layers and hidden_size, got teacher ({teacher.config.num_layers}, "
                         f"{teacher.config.hidden_size}), student ({student.config.num_layers}, "
                         f"{student.config.hidden_size})")
    return teacher


def shared_norm_group(config: TrainConfig) -> int:
    """G of the shared-normalisation groups (data.windows_per_question), 0 when loss.shared_norm
    is off."""
    return config.data.windows_per_question if config.loss.shared_norm else 0


def loss_weights(config: TrainConfig) -> LossWeights:
    return LossWeights(ce=float(config.loss.ce_weight), kd=float(config.loss.kd_weight),
                       lrs=float(config.loss.lrs_weight),
                       temperature=float(config.loss.temperature),
                       shared_norm_group=shared_norm_group(config))


def training_windows(config: TrainConfig, student: Reader,
                     features: data_lib.FeaturesLike) -> data_lib.Windows:
    """The training split's Windows for `student` (with characters where it reads them),
    grouped per question when loss.shared_norm is on.

    data.distractors_per_question > 0 needs a featurizer that marks distractor windows
    (`is_distractor`, as dil_jax.train.squad_data:featurize does): refused otherwise, instead of
    silently training without them.
    """
    wanted = config.data.distractors_per_question
    if wanted > 0 and getattr(features, "is_distractor", None) is None:
        raise UsageError(f"config.data.distractors_per_question = {wanted}: the training "
                         f"features (config.data.featurizer = {config.data.featurizer!r}) have "
                         "no distractor windows; use dil_jax.train.squad_data:featurize or set "
                         "it to 0")
    windows = windows_of(student, features, config.data.featurizer)
    fraction = float(config.data.null_window_fraction)
    if fraction < 1.0 and shared_norm_group(config):
        raise UsageError(f"config.data.null_window_fraction = {fraction:g} cannot be combined "
                         "with config.loss.shared_norm (a group holds all its question's "
                         "windows)")
    if fraction < 1.0:
        before = len(windows)
        windows = sample_null_windows(windows, fraction, config.data_seed)
        log.info("answer-less windows sampled (data.null_window_fraction = %g): %d of %d "
                 "training windows kept", fraction, len(windows), before)
    group = shared_norm_group(config)
    return windows.grouped(group) if group else windows


def load_split(config: TrainConfig, split: str) -> data_lib.FeaturesLike | None:
    """Features of `split` ("train"/"validation") from the configured featurizer, or None. The
    featurizer reads config.data as its config file wrote it (`TrainConfig.source`)."""
    if not config.data.featurizer:
        return None
    featurize = resolve_callable(config.data.featurizer, "data.featurizer")
    return featurize(config.source.data, split, max_question_len=config.model.max_question_len)


def batch_geometry(config: TrainConfig, num_devices: int) -> tuple[int, int, int]:
    """(global batch, accumulation steps, micro-batch) checked against the device count."""
    global_batch, accum = config.batch_size, config.grad_accum_steps
    if accum < 1 or global_batch % accum:
        raise UsageError(f"config.batch_size = {global_batch} is not a multiple of "
                         f"config.grad_accum_steps = {accum}")
    micro = global_batch // accum
    if micro % num_devices:
        raise UsageError(f"micro-batch {micro} (config.batch_size / config.grad_accum_steps) is "
                         f"not a multiple of the {num_devices} devices; every device needs equal "
                         "rows: change config.batch_size")
    return global_batch, accum, micro


def total_train_steps(config: TrainConfig, per_epoch: int) -> int:
    if config.num_train_steps > 0:
        return config.num_train_steps
    return max(1, math.ceil(config.num_epochs * per_epoch))


def warmup_steps(config: TrainConfig, total_steps: int) -> int:
    if config.optim.warmup_steps >= 0:
        return int(config.optim.warmup_steps)
    return round(config.optim.warmup_fraction * total_steps)


@dataclasses.dataclass
class RunData:
    """The run's windows and batch geometry (everything the data order depends on)."""

    train: data_lib.Windows
    validation: data_lib.Windows | None
    global_batch: int  # windows per optimizer step, all devices
    accum: int  # micro-batches per step
    micro: int  # windows per micro-batch, all devices
    per_epoch: int  # steps per epoch
    total_steps: int
    seed: int  # config.data_seed
    # data.length_buckets: batches of one bucket each, cut to its length; None: one length.
    buckets: BucketedOrder | None = None

    @property
    def units_per_batch(self) -> int:
        """Units (windows, or question groups of G windows) per optimizer step."""
        return self.global_batch // max(self.train.group_size, 1)

    def step_rows(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(window rows, valid) [accum, micro] of global step `step`: a pure function of
        (data seed, step), so a resumed run and every process see the same batch."""
        if self.buckets is not None:
            units = self.buckets.step_units(step)[0]
        else:
            units = data_lib.global_batch_rows(step, self.train.num_units,
                                               self.units_per_batch, self.seed)
        rows, valid = self.train.unit_rows(units)
        return rows.reshape(self.accum, self.micro), valid.reshape(self.accum, self.micro)

    def step_batch(self, step: int, rows_of_process: np.ndarray) -> dict[str, np.ndarray]:
        """This process's rows of step `step` as model inputs [accum, rows, ...], their passage
        arrays cut to the step's bucket length when the run is bucketed."""
        rows, valid = self.step_rows(step)
        batch = self.train.batch(rows[:, rows_of_process], valid[:, rows_of_process])
        if self.buckets is None:
            return batch
        return cut_passages(batch, self.buckets.step_units(step)[1])


def load_run_data(config: TrainConfig, student: Reader, num_devices: int,
                  train_features: data_lib.FeaturesLike | None,
                  val_features: data_lib.FeaturesLike | None) -> RunData:
    """Training and validation windows of `student` (given, else from config.data.featurizer;
    with characters where it reads them), and the batch geometry checked against them and the
    device count."""
    global_batch, accum, micro = batch_geometry(config, num_devices)
    if train_features is None:
        train_features = load_split(config, "train")
    if train_features is None:
        raise UsageError("no training data: pass train_features or set config.data.featurizer")
    train_windows = training_windows(config, student, train_features)
    units_per_batch = global_batch // max(train_windows.group_size, 1)
    if data_lib.steps_per_epoch(train_windows.num_units, units_per_batch) == 0:
        what = ("question groups" if train_windows.group_size else "windows")
        raise UsageError(f"config.batch_size = {global_batch} is larger than the "
                         f"{train_windows.num_units} training {what} "
                         f"({units_per_batch} per step): one step cannot be filled; "
                         "lower config.batch_size or add training data")
    if val_features is None and config.eval.use_validation_loss:
        val_features = load_split(config, "validation")
    # Validation keeps per-window windows (no distractors, no groups): its loss is the span CE.
    val_windows = (None if val_features is None
                   else windows_of(student, val_features, config.data.featurizer))
    buckets = length_buckets(config, train_windows, units_per_batch)
    per_epoch = (buckets.per_epoch if buckets is not None
                 else data_lib.steps_per_epoch(train_windows.num_units, units_per_batch))
    return RunData(train=train_windows, validation=val_windows, global_batch=global_batch,
                   accum=accum, micro=micro, per_epoch=per_epoch,
                   total_steps=total_train_steps(config, per_epoch),
                   seed=config.data_seed, buckets=buckets)


def length_buckets(config: TrainConfig, windows: data_lib.Windows,
                   units_per_batch: int) -> BucketedOrder | None:
    """The bucketed order of config.data.length_buckets over `windows`, or None (off)."""
    lengths = parse_buckets(config.data.length_buckets, int(windows.p_ids.shape[1]))
    if not lengths:
        return None
    order = BucketedOrder.build(unit_real_lengths(windows.p_mask, windows.groups,
                                                  windows.group_valid),
                                lengths, units_per_batch, config.data_seed)
    log.info("length buckets %s: %s batches an epoch", lengths, order.batches_per_bucket)
    return order


@dataclasses.dataclass
class RunModels:
    """The student (to train: its initial params as host arrays), its frozen teacher if a loss
    needs one, and the evaluator."""

    student: Reader
    teacher: Reader | None
    dropout_rng: jax.Array
    evaluate_fn: EvaluateFn | None


def build_student(config: TrainConfig, rng: jax.Array) -> Reader:
    """The reader to train, as config.model.kind says (the one place the trainer asks): a
    QANet / BiDAF of config.model.reader (`reader_kinds.char_student`), else a BERT-family
    reader of config.model.checkpoint or config.model.encoder. From here on the trainer asks
    the Reader (`check_lengths`, `optimized`, `outputs`), never the kind."""
    if config.model.kind in CHAR_READER_KINDS:
        return char_student(config.model, rng)
    return load_or_init_reader(config.model.checkpoint, config.model.encoder,
                               config.model.reader_overrides(), rng)


def load_run_models(config: TrainConfig, evaluate_fn: EvaluateFn | None) -> RunModels:
    """Student and teacher from config.model / config.teacher, seeded by config.seed."""
    root = jax.random.key(config.seed)
    init_rng, dropout_rng, teacher_rng = jax.random.split(root, 3)
    student = build_student(config, init_rng)
    # The length rule before any step: question + window (+ the passage offset) must fit the
    # position table (a reader without one has nothing to check), named by the keys to change.
    student.check_lengths(config.model.max_question_len, config.data.max_passage_len,
                          fix="lower config.model.max_question_len, config.data.max_passage_len "
                              "or config.model.passage_position_offset")
    # None for a QANet / BiDAF: the rules refuse the losses that read a teacher.
    teacher = build_teacher(config, student, teacher_rng)
    return RunModels(student, teacher, dropout_rng, _evaluator(config, student, evaluate_fn))


def _evaluator(config: TrainConfig, student: Reader,
               evaluate_fn: EvaluateFn | None) -> EvaluateFn | None:
    """The given evaluate_fn, else config.eval.evaluator's for the student (its factory reads
    the config as its file wrote it: `TrainConfig.source`), else None."""
    if evaluate_fn is None and config.eval.evaluator:
        return resolve_callable(config.eval.evaluator, "eval.evaluator")(config.source, student)
    return evaluate_fn


def make_run_optimizer(config: TrainConfig, total_steps: int, student: Reader):
    """(optax transformation, learning-rate schedule) per config.optim, over the student's
    variables as it says (`Reader.optimized`: a QANet / BiDAF leaves its frozen word table
    out); with optim.ema_decay > 0 the weights' moving average is kept last
    (`optim.ema_params`)."""
    tx, schedule = make_optimizer(
        config.optim.learning_rate, total_steps, warmup_steps(config, total_steps),
        weight_decay=config.optim.weight_decay, max_grad_norm=config.optim.max_grad_norm,
        b1=config.optim.b1, b2=config.optim.b2, eps=config.optim.eps,
        frozen=config.optim.frozen_prefixes)
    tx = student.optimized(tx)
    decay = float(config.optim.ema_decay)
    return (optax.chain(tx, ema_params(decay)) if decay else tx), schedule
