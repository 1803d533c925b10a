"""QANet and BiDAF as one kind of model: their configs by kind, and the model of a config.

QANet and BiDAF read characters beside the token ids (`QANetSegment`: ids, chars, mask), keep
their word table in a second variable collection (`{"params", "frozen"}`) and share one
interface (`init`, `encode_lower` per segment, `encode_upper` per pair, the whole reader on
aligned pairs): `CharModel` is either. The kind follows from the config's type
(`kind_of`), so a config alone names the model (`char_model`); `reader_config` reads a kind's
fields back and `switched_config` changes a trained one's run settings. What a reader of this
family does beyond the model (loading, its pair grid, its cache, its training outputs) is
`dil_jax.readers.char`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dil_jax.model.bidaf import BiDAFModel
from dil_jax.model.bidaf_config import BiDAFConfig
from dil_jax.model.encoder_config import ConfigError
from dil_jax.model.qanet import QANetModel
from dil_jax.model.qanet_config import QANetConfig

# config.model.kind: "encoder" (the BERT family, DelayedInteractionModel) or a character reader.
ENCODER_KIND = "encoder"
CHAR_READER_KINDS = ("qanet", "bidaf")
READER_KINDS = (ENCODER_KIND, *CHAR_READER_KINDS)
CharReaderConfig = QANetConfig | BiDAFConfig
CharModel = QANetModel | BiDAFModel
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


def char_model(config: CharReaderConfig) -> CharModel:
    """The QANet or BiDAF of `config` (the kind follows from the config's type). Stateless:
    variables in, arrays out (jit-able); compared by identity, as `DelayedInteractionModel` is,
    so compiled programs keyed by it are reused."""
    return _MODEL_TYPES[kind_of(config)](config)
