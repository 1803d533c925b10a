"""`config.model.kind`: which reader the trainer trains, and what QANet / BiDAF rule out.

    "encoder"  the BERT family (DelayedInteractionModel, config.model.checkpoint / encoder)
    "qanet"    QANet (Yu et al. 2018), config.model.reader = QANetConfig fields
    "bidaf"    BiDAF (Seo et al. 2017), config.model.reader = BiDAFConfig fields

`kind_problems` is part of the config's validation (config_rules.config_problems): every key a
character reader cannot honour is refused by name before anything loads, instead of being
silently ignored. `char_student` builds the reader and its variables; the reader keeps its frozen
word table out of the optimizer (`CharReader.optimized`).

The frozen word table (MiniLM's 30522 x 384 WordPiece embeddings) lives in the variables'
`"frozen"` collection and travels inside the train state's params tree, so checkpoints, resume,
replication and the export need no second tree (the BERT readers' checkpoints hold their own
frozen word embeddings the same way). The optimizer is `optax.multi_transform`: AdamW and
clipping over "params", `set_to_zero` over "frozen", so the table gets no update, no weight
decay and no Adam moments (2 x 47 MB less per checkpoint than masking inside AdamW).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import ml_collections

from dil_jax.errors import UsageError

if TYPE_CHECKING:
    from dil_jax.train.train_config import ModelSection

log = logging.getLogger(__name__)

ENCODER_KIND = "encoder"
CHAR_READER_KINDS = ("qanet", "bidaf")  # as dil_jax.model.char_reader (kept light: no jax here)
# config.model.word_table: the embedded MiniLM's table, a folder holding a model.safetensors with
# one, or random N(0, 1) rows (tests and runs from scratch).
DEFAULT_TABLE, RANDOM_TABLE = "default", "random"
CHAR_FEATURIZERS = ("dil_jax.train.char_data:featurize", "dil_jax.train.char_data:synthetic")
CHAR_EVALUATOR = "dil_jax.train.char_eval:evaluator"
# The BERT family's featurizers and evaluator: no characters, and predict's PairGrid.
ENCODER_FEATURIZERS = ("dil_jax.train.squad_data:featurize", "dil_jax.train.data:synthetic")
ENCODER_EVALUATOR = "dil_jax.train.squad_data:evaluator"


def _get(config: ml_collections.ConfigDict, key: str, default: Any = None) -> Any:
    node: Any = config
    for name in key.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or name not in node:
            return default
        node = node[name]
    return node


def model_kind(config: ml_collections.ConfigDict) -> str:
    return str(_get(config, "model.kind", ENCODER_KIND))


def is_char_kind(config: ml_collections.ConfigDict) -> bool:
    return model_kind(config) in CHAR_READER_KINDS


def kind_problems(config: ml_collections.ConfigDict) -> list[str]:
    """Each key whose value the configured model kind cannot honour, as one line naming it."""
    kind = model_kind(config)
    if kind not in (ENCODER_KIND, *CHAR_READER_KINDS):
        return [f"config.model.kind = {kind!r}: must be one of "
                f"{[ENCODER_KIND, *CHAR_READER_KINDS]}"]
    if kind == ENCODER_KIND:
        return ([] if _get(config, "model.reader") is None else [
            "config.model.reader (QANet / BiDAF fields) is only read with config.model.kind = "
            "'qanet' or 'bidaf'; set it to None or choose the kind"])
    where = f"with config.model.kind = {kind!r}"
    problems = []
    for key in ("loss.kd_weight", "loss.lrs_weight"):
        if _get(config, key, 0) > 0:
            problems.append(f"config.{key} = {_get(config, key)} {where}: KD and LRS need a "
                            f"teacher of the same architecture with per-layer states (a {kind} "
                            "has no k-split teacher); set it to 0")
    # Each: (key, the value that is honoured, why another is not).
    fixed = (("teacher.checkpoint", "", "no loss here reads a teacher"),
             ("teacher.logits_file", "", "no loss here reads a teacher"),
             ("data.length_buckets", "", "buckets cut the passages' ids, not their characters"),
             ("model.num_lower_layers", 0, "the split is fixed (embedding encoder | the rest)"),
             ("model.lsh_attention_layers", "", "use config.model.reader.lsh_encoders"),
             ("model.hidden_dropout", None, "use config.model.reader's dropout fields"),
             ("model.attention_dropout", None, "use config.model.reader's dropout fields"),
             ("model.passage_position_offset", 0, "positions are sinusoids per segment"),
             ("model.encoder", None, "use config.model.reader"),
             ("model.dtype", "float32", "QANet / BiDAF compute in float32"),
             ("loss.shared_norm", False, "the reader has no no-answer score to share"),
             ("data.null_window_fraction", 1.0, "answer-less windows are left out anyway"),
             ("data.distractors_per_question", 0, "distractors are answer-less windows"),
             ("data.distill_file", "", "only a teacher learns from unlabelled questions"),
             ("data.cloze_per_paragraph", 0, "only a teacher learns from unlabelled questions"))
    for key, honoured, why in fixed:
        value = _get(config, key, honoured)
        if value != honoured:
            problems.append(f"config.{key} = {value!r} {where}: must be {honoured!r} ({why})")
    checkpoint = _get(config, "model.checkpoint", "")
    if checkpoint == "default":
        problems.append(f"config.model.checkpoint = 'default' {where} names the embedded MiniLM "
                        f"reader: set '' (a fresh {kind}; its word table from "
                        f"config.model.word_table) or the params/ folder of a {kind} export")
    featurizer = _get(config, "data.featurizer", "")
    if featurizer in ENCODER_FEATURIZERS:
        problems.append(f"config.data.featurizer = {featurizer!r} {where}: the reader needs "
                        f"each token's characters; use one of {list(CHAR_FEATURIZERS)}")
    evaluator = _get(config, "eval.evaluator", "")
    if evaluator == ENCODER_EVALUATOR:
        problems.append(f"config.eval.evaluator = {evaluator!r} {where}: use "
                        f"{CHAR_EVALUATOR!r} (or '' for none)")
    return problems + _reader_field_problems(config, kind)


def _reader_field_problems(config: ml_collections.ConfigDict, kind: str) -> list[str]:
    from dil_jax.model.char_reader import QUESTION_LEN_FIELD, reader_config
    from dil_jax.model.encoder_config import ConfigError

    fields = reader_fields(config)
    if QUESTION_LEN_FIELD in fields:
        return [f"config.model.reader.{QUESTION_LEN_FIELD}: the question length is "
                f"config.model.{QUESTION_LEN_FIELD} for every reader kind; remove it here"]
    try:
        reader_config(kind, fields)
    except (ConfigError, TypeError) as error:
        return [f"config.model.reader: {error}"]
    return []


def reader_fields(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """config.model.reader as a plain dict ({} when None: the paper's defaults)."""
    fields = _get(config, "model.reader")
    if fields is None:
        return {}
    return fields.to_dict() if isinstance(fields, ml_collections.ConfigDict) else dict(fields)


def reader_section(kind: str, changes: dict[str, Any]) -> ml_collections.ConfigDict:
    """config.model.reader for a config file: every field of `kind`'s config with `changes`
    applied (so each is a --config.model.reader.NAME override), the LSH encoders as one
    comma-separated string ("" = none); but the question length, which is
    config.model.max_question_len for every reader kind."""
    from dil_jax.model.char_reader import QUESTION_LEN_FIELD, config_fields, reader_config

    fields = config_fields(reader_config(kind, changes))
    del fields[QUESTION_LEN_FIELD]
    if "lsh_encoders" in fields:
        fields["lsh_encoders"] = ",".join(fields["lsh_encoders"])
    return ml_collections.ConfigDict(fields)


def word_table(spec: str, vocab_size: int, word_dim: int):
    """The frozen word table of config.model.word_table: None for random rows (the model draws
    them), else the table read from the embedded MiniLM ("default") or a folder, checked
    against the reader's vocab_size x word_dim."""
    if spec == RANDOM_TABLE:
        return None
    from dil_jax.model.qanet_inputs import minilm_word_table

    try:
        table = minilm_word_table(None if spec == DEFAULT_TABLE else spec)
    except (OSError, KeyError) as error:
        raise UsageError(f"config.model.word_table = {spec!r}: {error}") from None
    if table.shape != (vocab_size, word_dim):
        raise UsageError(f"config.model.word_table = {spec!r} is {table.shape[0]} x "
                         f"{table.shape[1]}, the reader wants vocab_size x word_dim = "
                         f"{vocab_size} x {word_dim}: set config.model.reader's or "
                         f"config.model.word_table = {RANDOM_TABLE!r}")
    return table


def char_student(model: ModelSection, rng):
    """The QANet / BiDAF student of config.model (`model`) as a `CharReader` (params: its
    variables as host arrays): a fresh one of config.model.kind from config.model.reader and
    config.model.word_table, or the export folder config.model.checkpoint names, warm-started:
    its own config, but for the run settings config.model.reader changes
    (`char_reader.switched_config`: e.g. LSH attention or dropout on a trained QANet's params;
    any other field must be unset or as trained)."""
    import jax
    import numpy as np

    from dil_jax.errors import CheckpointError
    from dil_jax.model.char_reader import (
        QUESTION_LEN_FIELD,
        changed_fields,
        char_model,
        reader_config,
    )
    from dil_jax.model.encoder_config import ConfigError
    from dil_jax.readers import CharReader, load_reader

    kind = model.kind
    fields = dict(model.reader or {})
    question_len = int(model.max_question_len)
    if model.checkpoint:
        source = f"config.model.checkpoint = {model.checkpoint!r}"
        try:
            loaded = load_reader(model.checkpoint, None, question_len, kind=kind,
                                 with_tokenizer=False)
        except CheckpointError as error:
            raise UsageError(f"{source}: {error}") from None
        changes = {} if not fields else changed_fields(
            loaded.config, reader_config(kind, {**fields, QUESTION_LEN_FIELD: question_len}))
        try:
            student = loaded.with_config(**changes)
        except ConfigError as error:
            raise UsageError(f"config.model.reader against {source}: {error}; set those "
                             "fields as trained or unset config.model.reader") from None
        if changes:
            log.info("warm start from %s with %s", model.checkpoint,
                     ", ".join(f"{name} = {value!r}" for name, value in changes.items()))
        _check_same_variables(student.model, student.params, source)
        return student.with_params(jax.tree.map(np.asarray, student.params))
    fresh = char_model(reader_config(kind, {**fields, QUESTION_LEN_FIELD: question_len}))
    table = word_table(str(model.word_table), fresh.config.vocab_size, fresh.config.word_dim)
    return CharReader(fresh, jax.tree.map(np.asarray, fresh.init(rng, word_table=table)))


def _check_same_variables(model, variables, source: str) -> None:
    """UsageError unless `model`'s params have the shapes of the checkpoint's (the run
    settings never change them: this guards that rule)."""
    import jax

    from dil_jax.train.checkpointing import leaf_shapes, shape_mismatch

    mismatch = shape_mismatch(leaf_shapes(variables),
                              leaf_shapes(jax.eval_shape(model.init, jax.random.key(0))))
    if mismatch:
        raise UsageError(f"{source}: its params do not fit the reader config.model.reader "
                         f"makes of it: {mismatch}")
