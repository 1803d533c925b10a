"""Hugging Face `config.json` <-> EncoderConfig, both ways, for BERT, ALBERT and DistilBERT.

Each architecture names its fields its own way (DistilBERT: `dim`, `n_layers`, `activation`);
the defaults filled in for absent fields are those of Hugging Face's config classes.
"""

from __future__ import annotations

from typing import Any

from dil_jax.config import ConfigError, EncoderConfig
from dil_jax.errors import CheckpointError


def encoder_config_from_hf(hf: dict[str, Any], source: str = "config.json",
                           **overrides: Any) -> EncoderConfig:
    """Maps a Hugging Face `config.json` dict to an EncoderConfig (plus overrides such as k)."""
    model_type = hf.get("model_type")

    def need(key: str) -> Any:
        if key not in hf:
            raise CheckpointError(f"{source}: field {key!r} missing (model_type {model_type!r})")
        return hf[key]

    if model_type == "bert":
        values = dict(
            architecture="bert", hidden_size=need("hidden_size"),
            num_layers=need("num_hidden_layers"), num_heads=need("num_attention_heads"),
            intermediate_size=need("intermediate_size"), embedding_size=need("hidden_size"),
            type_vocab_size=hf.get("type_vocab_size", 2), hidden_act=hf.get("hidden_act", "gelu"),
            layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
            hidden_dropout=hf.get("hidden_dropout_prob", 0.1),
            attention_dropout=hf.get("attention_probs_dropout_prob", 0.1))
        if hf.get("position_embedding_type", "absolute") != "absolute":
            raise CheckpointError(f"{source}: position_embedding_type "
                                  f"{hf['position_embedding_type']!r} is not supported (absolute)")
    elif model_type == "albert":
        if hf.get("inner_group_num", 1) != 1:
            raise CheckpointError(f"{source}: inner_group_num {hf['inner_group_num']} is not "
                                  "supported (1, as in every released ALBERT)")
        values = dict(
            architecture="albert", hidden_size=need("hidden_size"),
            num_layers=need("num_hidden_layers"), num_heads=need("num_attention_heads"),
            intermediate_size=need("intermediate_size"),
            embedding_size=hf.get("embedding_size", 128),
            num_hidden_groups=hf.get("num_hidden_groups", 1),
            type_vocab_size=hf.get("type_vocab_size", 2),
            hidden_act=hf.get("hidden_act", "gelu_new"),
            layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
            hidden_dropout=hf.get("hidden_dropout_prob", 0.0),
            attention_dropout=hf.get("attention_probs_dropout_prob", 0.0))
    elif model_type == "distilbert":
        values = dict(
            architecture="distilbert", hidden_size=need("dim"), num_layers=need("n_layers"),
            num_heads=need("n_heads"), intermediate_size=need("hidden_dim"),
            embedding_size=need("dim"), type_vocab_size=0,
            hidden_act=hf.get("activation", "gelu"),
            layer_norm_eps=1e-12,  # hard-coded in Hugging Face's DistilBERT
            hidden_dropout=hf.get("dropout", 0.1),
            attention_dropout=hf.get("attention_dropout", 0.1))
    else:
        raise CheckpointError(f"{source}: unknown architecture model_type={model_type!r}; "
                              "supported: bert, albert, distilbert")
    values.update(vocab_size=need("vocab_size"),
                  max_position_embeddings=hf.get("max_position_embeddings", 512),
                  initializer_range=hf.get("initializer_range", 0.02),
                  pad_token_id=hf.get("pad_token_id", 0) or 0)
    values.update(overrides)
    try:
        return EncoderConfig(**values)
    except ConfigError as error:
        raise CheckpointError(f"{source}: {error}") from error


def hf_config_from_encoder_config(config: EncoderConfig) -> dict[str, Any]:
    """The Hugging Face `config.json` of a *ForQuestionAnswering model with these weights."""
    common = dict(vocab_size=config.vocab_size,
                  max_position_embeddings=config.max_position_embeddings,
                  initializer_range=config.initializer_range, pad_token_id=config.pad_token_id)
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
