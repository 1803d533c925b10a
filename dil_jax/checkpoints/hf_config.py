"""Hugging Face `config.json` <-> EncoderConfig, both ways, for BERT, ALBERT, DistilBERT and
XLNet (`xlnet_config.py`).

Each architecture names its fields its own way (DistilBERT: `dim`, `n_layers`, `activation`);
the defaults filled in for absent fields are those of Hugging Face's config classes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dil_jax.checkpoints.xlnet_config import hf_xlnet_config, xlnet_fields
from dil_jax.config import ConfigError, EncoderConfig
from dil_jax.errors import CheckpointError


def _required(hf: dict[str, Any], key: str, source: str) -> Any:
    if key not in hf:
        raise CheckpointError(f"{source}: field {key!r} missing "
                              f"(model_type {hf.get('model_type')!r})")
    return hf[key]


def _bert_fields(hf: dict[str, Any], source: str) -> dict[str, Any]:
    values = dict(
        architecture="bert", hidden_size=_required(hf, "hidden_size", source),
        num_layers=_required(hf, "num_hidden_layers", source),
        num_heads=_required(hf, "num_attention_heads", source),
        intermediate_size=_required(hf, "intermediate_size", source),
        embedding_size=_required(hf, "hidden_size", source),
        type_vocab_size=hf.get("type_vocab_size", 2), hidden_act=hf.get("hidden_act", "gelu"),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        hidden_dropout=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout=hf.get("attention_probs_dropout_prob", 0.1))
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(f"{source}: position_embedding_type "
                              f"{hf['position_embedding_type']!r} is not supported (absolute)")
    return values


def _albert_fields(hf: dict[str, Any], source: str) -> dict[str, Any]:
    if hf.get("inner_group_num", 1) != 1:
        raise CheckpointError(f"{source}: inner_group_num {hf['inner_group_num']} is not "
                              "supported (1, as in every released ALBERT)")
    return dict(
        architecture="albert", hidden_size=_required(hf, "hidden_size", source),
        num_layers=_required(hf, "num_hidden_layers", source),
        num_heads=_required(hf, "num_attention_heads", source),
        intermediate_size=_required(hf, "intermediate_size", source),
        embedding_size=hf.get("embedding_size", 128),
        num_hidden_groups=hf.get("num_hidden_groups", 1),
        type_vocab_size=hf.get("type_vocab_size", 2),
        hidden_act=hf.get("hidden_act", "gelu_new"),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        hidden_dropout=hf.get("hidden_dropout_prob", 0.0),
        attention_dropout=hf.get("attention_probs_dropout_prob", 0.0))


def _distilbert_fields(hf: dict[str, Any], source: str) -> dict[str, Any]:
    return dict(
        architecture="distilbert", hidden_size=_required(hf, "dim", source),
        num_layers=_required(hf, "n_layers", source), num_heads=_required(hf, "n_heads", source),
        intermediate_size=_required(hf, "hidden_dim", source),
        embedding_size=_required(hf, "dim", source), type_vocab_size=0,
        hidden_act=hf.get("activation", "gelu"),
        layer_norm_eps=1e-12,  # hard-coded in Hugging Face's DistilBERT
        hidden_dropout=hf.get("dropout", 0.1),
        attention_dropout=hf.get("attention_dropout", 0.1))


# Hugging Face model_type -> the EncoderConfig fields its own config.json names hold.
_ARCHITECTURE_FIELDS: dict[str, Callable[[dict[str, Any], str], dict[str, Any]]] = {
    "bert": _bert_fields, "albert": _albert_fields, "distilbert": _distilbert_fields,
    "xlnet": xlnet_fields}


def encoder_config_from_hf(hf: dict[str, Any], source: str = "config.json",
                           **overrides: Any) -> EncoderConfig:
    """Maps a Hugging Face `config.json` dict to an EncoderConfig (plus overrides such as k).

    Raises CheckpointError naming `source` and the field for a missing or unsupported field or
    an unknown model_type.
    """
    model_type = hf.get("model_type")
    # isinstance first: a damaged config.json may hold a list here, which cannot be a dict key.
    architecture_fields = (_ARCHITECTURE_FIELDS.get(model_type) if isinstance(model_type, str)
                           else None)
    if architecture_fields is None:
        raise CheckpointError(f"{source}: unknown architecture model_type={model_type!r}; "
                              "supported: bert, albert, distilbert, xlnet")
    values = architecture_fields(hf, source)
    values.update(vocab_size=_required(hf, "vocab_size", source),
                  max_position_embeddings=hf.get("max_position_embeddings", 512),
                  initializer_range=hf.get("initializer_range", 0.02),
                  pad_token_id=hf.get("pad_token_id", 0) or 0)
    values.update(overrides)
    if values.get("reversible"):
        raise CheckpointError(
            f"{source}: reversible=True with a pretrained checkpoint: its post-LayerNorm blocks "
            f"compute a different function than reversible (RevNet) blocks, whose residual "
            f"stream is two halves; reversible is for readers trained from scratch (use "
            f"remat_policy to save memory with pretrained weights)")
    try:
        return EncoderConfig(**values)
    except ConfigError as error:
        raise CheckpointError(f"{source}: {error}") from error


def hf_config_from_encoder_config(config: EncoderConfig) -> dict[str, Any]:
    """The Hugging Face `config.json` of a *ForQuestionAnswering model with these weights."""
    if config.reversible:
        raise CheckpointError("reversible=True: reversible (RevNet) blocks have no Hugging Face "
                              "*ForQuestionAnswering equivalent to export to")
    common = dict(vocab_size=config.vocab_size,
                  max_position_embeddings=config.max_position_embeddings,
                  initializer_range=config.initializer_range, pad_token_id=config.pad_token_id)
    if config.architecture == "xlnet":
        return hf_xlnet_config(config)
    if config.architecture == "distilbert":
        return dict(common, model_type="distilbert",
                    architectures=["DistilBertForQuestionAnswering"], dim=config.hidden_size,
                    n_layers=config.num_layers, n_heads=config.num_heads,
                    hidden_dim=config.intermediate_size, activation=config.hidden_act,
                    dropout=config.hidden_dropout, attention_dropout=config.attention_dropout)
    values = dict(common, hidden_size=config.hidden_size, num_hidden_layers=config.num_layers,
                  num_attention_heads=config.num_heads,
                  intermediate_size=config.intermediate_size,
                  type_vocab_size=config.type_vocab_size, hidden_act=config.hidden_act,
                  layer_norm_eps=config.layer_norm_eps,
                  hidden_dropout_prob=config.hidden_dropout,
                  attention_probs_dropout_prob=config.attention_dropout)
    if config.architecture == "albert":
        return dict(values, model_type="albert", architectures=["AlbertForQuestionAnswering"],
                    embedding_size=config.embedding_size,
                    num_hidden_groups=config.num_hidden_groups, inner_group_num=1)
    return dict(values, model_type="bert", architectures=["BertForQuestionAnswering"])
