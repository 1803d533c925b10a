"""The training config as a typed value: `TrainConfig`, made once from a validated ConfigDict.

    config = load_config("configs/tiny.py")        # ml_collections: files and --config.KEY=V
    settings = validate_config(config)            # -> TrainConfig (config_rules)
    settings.optim.learning_rate, settings.model.reader_overrides()

ml_collections is the config files' language (dotted overrides, locking, printing); past the
boundary the trainer reads fields of frozen dataclasses, so a key is named once here, typed, and
can be followed from the file to where it is used (as flax's wmt example turns its ConfigDict
into a `TransformerConfig`). One section per part of `default_config.base_config()`, with the
same names. What the trainer hands to code of the config's own choosing keeps the ConfigDict it
was written against (`TrainConfig.source`): a featurizer gets `source.data`, an evaluator factory
`source`, and the workdir records `source` as written.

Keys a smaller config leaves out (library callers may build one) take the defaults below, which
are the ones the trainer assumed before they existed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

import ml_collections

from dil_jax.checkpoints.windows import TrainedWindows
from dil_jax.mesh import DistributedSettings
from dil_jax.model.encoder_config import ReaderOverrides, lsh_layers_of


@dataclasses.dataclass(frozen=True)
class ModelSection:
    """config.model: which reader trains, from where, read how (`default_config`)."""

    checkpoint: str
    max_question_len: int
    kind: str = "encoder"
    encoder: Mapping[str, Any] | None = None
    reader: Mapping[str, Any] | None = None
    word_table: str = "default"
    num_lower_layers: int | None = None
    dtype: str | None = None
    passage_position_offset: int | None = None
    hidden_dropout: float | None = None
    attention_dropout: float | None = None
    lsh_attention_layers: str = ""
    lsh_num_hashes: int | None = None
    lsh_bucket_size: int | None = None

    def reader_overrides(self) -> ReaderOverrides:
        """The EncoderConfig fields this section sets (its keys are named as the fields; None
        keeps the checkpoint's own): what training applies to the loaded or initialised
        reader's config. lsh_attention_layers "lower" is resolved to blocks 0..k-1 (a
        UsageError at k = 0), and the lsh_* keys apply only with LSH layers named."""
        spec = self.lsh_attention_layers
        lsh = (lsh_layers_of(spec, self.num_lower_layers or 0,
                             "config.model.lsh_attention_layers") if spec else None)
        return ReaderOverrides(
            num_lower_layers=self.num_lower_layers, max_question_len=self.max_question_len,
            dtype=self.dtype,
            # A config without passage_position_offset (written before it existed) reads from 0.
            passage_position_offset=self.passage_position_offset or 0,
            hidden_dropout=self.hidden_dropout, attention_dropout=self.attention_dropout,
            lsh_attention_layers=lsh,
            lsh_num_hashes=self.lsh_num_hashes if lsh else None,
            lsh_bucket_size=self.lsh_bucket_size if lsh else None)


@dataclasses.dataclass(frozen=True)
class TeacherSection:
    """config.teacher: the frozen full reader KD and LRS read, or its stored span scores."""

    checkpoint: str = ""
    logits_file: str = ""


@dataclasses.dataclass(frozen=True)
class LossSection:
    """config.loss: the weights of the span CE, KD and LRS, and shared normalisation."""

    ce_weight: float
    kd_weight: float
    lrs_weight: float
    temperature: float
    shared_norm: bool = False


@dataclasses.dataclass(frozen=True)
class OptimSection:
    """config.optim: AdamW with warm-up and linear decay (`optim.make_optimizer`)."""

    learning_rate: float
    warmup_fraction: float
    warmup_steps: int
    weight_decay: float
    max_grad_norm: float | None
    b1: float
    b2: float
    eps: float
    frozen: str = ""
    ema_decay: float = 0.0

    @property
    def frozen_prefixes(self) -> tuple[str, ...]:
        """optim.frozen's comma-separated param path prefixes."""
        return tuple(name for name in self.frozen.split(",") if name)


@dataclasses.dataclass(frozen=True)
class DataSection:
    """The keys of config.data the trainer itself reads; the featurizer reads the section
    whole (`TrainConfig.source`)."""

    featurizer: str
    max_passage_len: int
    doc_stride: int
    tokenizer: str = "default"
    distractors_per_question: int = 0
    windows_per_question: int = 0
    null_window_fraction: float = 1.0
    length_buckets: str = ""

    def trained_windows(self) -> TrainedWindows:
        """The passage windows this section featurizes, as an export records them."""
        return TrainedWindows(max_passage_len=int(self.max_passage_len),
                              doc_stride=int(self.doc_stride))


@dataclasses.dataclass(frozen=True)
class EvalSection:
    """config.eval: the validation loss, the evaluator and early stopping."""

    evaluator: str
    batch_size: int
    use_validation_loss: bool = True
    every_steps: int = 0
    patience: int = -1


@dataclasses.dataclass(frozen=True)
class CheckpointSection:
    """config.checkpoint: the cadence, what is kept, and the export."""

    every_steps: int
    keep: int
    best_metric: str
    best_mode: str
    async_save: bool = True
    evaluate_on_signal: bool = False
    export_params: bool = True


@dataclasses.dataclass(frozen=True)
class LogSection:
    """config.log: metrics.jsonl, TensorBoard and the progress bar."""

    every_steps: int
    tensorboard: bool = True
    progress: bool = True
    local_dir: str = ""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A validated training config (`config_rules.validate_config`), frozen: the run's global
    settings and one section per part of the config file. source: the ConfigDict it was made
    from, for what reads the config file's own language (featurizers, evaluators, the
    workdir's record)."""

    workdir: str
    seed: int
    data_seed: int
    batch_size: int
    grad_accum_steps: int
    num_epochs: float
    num_train_steps: int
    model: ModelSection
    teacher: TeacherSection
    loss: LossSection
    optim: OptimSection
    data: DataSection
    eval: EvalSection
    checkpoint: CheckpointSection
    log: LogSection
    distributed: DistributedSettings
    source: ml_collections.ConfigDict = dataclasses.field(compare=False, repr=False)

    @classmethod
    def of(cls, config: ml_collections.ConfigDict) -> TrainConfig:
        """The typed config of a ConfigDict whose values the rules accept (`config_problems`)."""
        model = _section(ModelSection, config.model)
        model = dataclasses.replace(model, encoder=_plain(model.encoder),
                                    reader=_plain(model.reader))
        return cls(
            workdir=str(config.workdir), seed=int(config.seed), data_seed=int(config.data_seed),
            batch_size=int(config.batch_size), grad_accum_steps=int(config.grad_accum_steps),
            num_epochs=float(config.num_epochs), num_train_steps=int(config.num_train_steps),
            model=model, teacher=_section(TeacherSection, config.get("teacher", {})),
            loss=_section(LossSection, config.loss), optim=_section(OptimSection, config.optim),
            data=_section(DataSection, config.data), eval=_section(EvalSection, config.eval),
            checkpoint=_section(CheckpointSection, config.checkpoint),
            log=_section(LogSection, config.log),
            distributed=DistributedSettings.from_mapping(config.distributed), source=config)


Section = TypeVar("Section")


def _section(kind: type[Section], values: Mapping[str, Any]) -> Section:
    """The `kind` of a config section: each field from the key of its name (keys the section
    lacks take the field's default; keys the trainer does not read are left to `source`)."""
    return kind(**{field.name: values[field.name] for field in dataclasses.fields(kind)
                   if field.name in values})


def _plain(value: Any) -> dict[str, Any] | None:
    """A nested ConfigDict as a plain dict (None stays None)."""
    if value is None:
        return None
    return value.to_dict() if isinstance(value, ml_collections.ConfigDict) else dict(value)
