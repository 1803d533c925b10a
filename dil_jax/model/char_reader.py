"""QANet and BiDAF behind the trainer's reader interface: one value, `CharReaderModel`.

The trainer (`dil_jax.train`) runs a `DelayedInteractionModel` as
`model(params, q_ids, q_mask, p_ids, p_mask, ...)`. QANet and BiDAF read characters too
(`QANetSegment`: ids, chars, mask) and keep their word table in a second variable collection
(`{"params", "frozen"}`). `CharReaderModel` is the one object the trainer holds for either: its
`config` is the `QANetConfig` / `BiDAFConfig` (the kind follows from the config's type, so a
config alone names the model), `init` gives the variables, and `__call__` reads a batch's arrays.

The name says what sets these readers apart for training: they read each token's characters.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from dil_jax.config import ConfigError
from dil_jax.model.bidaf import BiDAFConfig, BiDAFModel
from dil_jax.model.qanet import QANetModel, Variables
from dil_jax.model.qanet_config import QANetConfig
from dil_jax.model.qanet_inputs import QANetSegment
from dil_jax.model.span_reader import ReaderOutput

# config.model.kind: "encoder" (the BERT family, DelayedInteractionModel) or a character reader.
ENCODER_KIND = "encoder"
CHAR_READER_KINDS = ("qanet", "bidaf")
READER_KINDS = (ENCODER_KIND, *CHAR_READER_KINDS)
CharReaderConfig = QANetConfig | BiDAFConfig
_CONFIG_TYPES: dict[str, type] = {"qanet": QANetConfig, "bidaf": BiDAFConfig}
_MODEL_TYPES: dict[str, type] = {"qanet": QANetModel, "bidaf": BiDAFModel}
# The config field that is a reading setting (the trainer's config.model.max_question_len), not
# the reader's shape.
QUESTION_LEN_FIELD = "max_question_len"


def kind_of(config: CharReaderConfig) -> str:
    """"qanet" or "bidaf" for a config of that reader."""
    for kind, config_type in _CONFIG_TYPES.items():
        if isinstance(config, config_type):
            return kind
    raise TypeError(f"not a QANet or BiDAF config: {type(config).__name__}")


def reader_config(kind: str, fields: dict[str, Any] | None) -> CharReaderConfig:
    """The config of `kind` from its fields (None or {}: the paper's defaults); ConfigError
    naming an unknown field or a bad value."""
    if kind not in _CONFIG_TYPES:
        raise ConfigError(f"unknown reader kind {kind!r}; known: {list(_CONFIG_TYPES)}")
    config_type = _CONFIG_TYPES[kind]
    known = {field.name for field in dataclasses.fields(config_type)}
    unknown = sorted(set(fields or {}) - known)
    if unknown:
        raise ConfigError(f"unknown {config_type.__name__} field(s) {unknown}; known: "
                          f"{sorted(known)}")
    values = dict(fields or {})
    if isinstance(values.get("lsh_encoders"), list | str):  # JSON / ConfigDict forms
        spec = values["lsh_encoders"]
        values["lsh_encoders"] = tuple(spec.split(",") if isinstance(spec, str) else spec)
        values["lsh_encoders"] = tuple(name for name in values["lsh_encoders"] if name)
    return config_type(**values)


def changed_fields(trained: CharReaderConfig, wanted: CharReaderConfig) -> dict[str, Any]:
    """{field: wanted value} for each field where `wanted` differs from `trained` (same kind)."""
    return {field.name: getattr(wanted, field.name) for field in dataclasses.fields(trained)
            if getattr(wanted, field.name) != getattr(trained, field.name)}


def switched_config(trained: CharReaderConfig, changes: dict[str, Any]) -> CharReaderConfig:
    """A trained reader's config with other run settings (`RUN_SETTINGS` of its config type:
    LSH / reversible / chunked / scanned computation, dropout, question length): the same
    params read or trained further another way. ConfigError naming each other field changed
    (its value and the trained one): those give the params their meaning."""
    known = {field.name for field in dataclasses.fields(trained)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise ConfigError(f"unknown {type(trained).__name__} field(s) {unknown}; known: "
                          f"{sorted(known)}")
    fixed = sorted(set(changes) - trained.RUN_SETTINGS)
    if fixed:
        named = ", ".join(f"{name} = {changes[name]!r} (trained with "
                          f"{getattr(trained, name)!r})" for name in fixed)
        raise ConfigError(f"{named}: a trained {kind_of(trained)} keeps these as trained; only "
                          f"{sorted(trained.RUN_SETTINGS)} can change")
    values = config_fields(trained)
    values.update(changes)
    return reader_config(kind_of(trained), values)


def config_fields(config: CharReaderConfig) -> dict[str, Any]:
    """The config as JSON-able fields (`reader_config` reads them back)."""
    values = dataclasses.asdict(config)
    if "lsh_encoders" in values:
        values["lsh_encoders"] = list(values["lsh_encoders"])
    return values


class CharReaderModel:
    """QANet or BiDAF as the trainer runs it. Stateless: params in, arrays out (jit-able).

    Compared by identity, as `DelayedInteractionModel` is: compiled programs are keyed by it.
    """

    def __init__(self, config: CharReaderConfig):
        self.config = config
        self.kind = kind_of(config)
        self.model = _MODEL_TYPES[self.kind](config)

    def init(self, rng: jax.Array, word_table: Any = None) -> Variables:
        """{"params": trainable, "frozen": {"word_table"}}: the given table
        ([vocab_size, word_dim]) or a random one."""
        return self.model.init(rng, word_table=word_table)

    def __call__(self, variables: Variables, q_ids: jax.Array, q_chars: jax.Array,
                 q_mask: jax.Array, p_ids: jax.Array, p_chars: jax.Array, p_mask: jax.Array,
                 *, deterministic: bool = True, rngs: dict[str, jax.Array] | None = None
                 ) -> ReaderOutput:
        """Aligned (question, passage) pairs -> ReaderOutput, start/end logits [batch, p_len].

        q_ids, q_mask: [batch, q_len]; q_chars: [batch, q_len, max_chars] (any integer dtype:
        the host keeps them as uint16, half the bytes to move); p_*: the same over p_len.
        Training (`deterministic` False) with a "dropout" rng also draws fresh LSH rotations
        (an "lsh" rng folded from it), as the Reformer trains; inference keeps `lsh_seed`'s.
        """
        if rngs is not None and "dropout" in rngs and "lsh" not in rngs:
            rngs = {**rngs, "lsh": jax.random.fold_in(rngs["dropout"], 1)}
        question = QANetSegment(q_ids.astype(jnp.int32), self.fit_chars(q_chars),
                                q_mask.astype(jnp.int32))
        passage = QANetSegment(p_ids.astype(jnp.int32), self.fit_chars(p_chars),
                               p_mask.astype(jnp.int32))
        return self.model(variables, question, passage, deterministic=deterministic,
                          rngs=rngs)

    def fit_chars(self, chars: jax.Array) -> jax.Array:
        """[..., slots] character ids -> [..., max_chars] int32: the first max_chars of each
        token's (the paper's truncation), or CHAR_PAD (0) slots added after them."""
        slots, wanted = chars.shape[-1], self.config.max_chars
        chars = chars[..., :wanted].astype(jnp.int32)
        if slots < wanted:
            chars = jnp.pad(chars, [(0, 0)] * (chars.ndim - 1) + [(0, wanted - slots)])
        return chars

    def __repr__(self) -> str:
        return f"CharReaderModel({self.config!r})"
