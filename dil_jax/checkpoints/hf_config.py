"""Hugging Face `config.json` <-> EncoderConfig, both ways, for BERT, ALBERT, DistilBERT,
RoBERTa, XLM-RoBERTa, ELECTRA and XLNet (`xlnet_config.py`).

Each architecture names its fields its own way (DistilBERT: `dim`, `n_layers`, `activation`);
the defaults filled in for absent fields are those of Hugging Face's config classes. What a
reader cannot be built from is refused by name: decoder configs, relative position embeddings,
ELECTRA generators, and the architectures of UNSUPPORTED_MODEL_TYPES.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dil_jax.checkpoints.xlnet_config import hf_xlnet_config, xlnet_fields
from dil_jax.errors import CheckpointError
from dil_jax.model.encoder_config import NO_OVERRIDES, ConfigError, EncoderConfig, ReaderOverrides


def _required(hf: dict[str, Any], key: str, source: str) -> Any:
    if key not in hf:
        raise CheckpointError(f"{source}: field {key!r} missing "
                              f"(model_type {hf.get('model_type')!r})")
    return hf[key]


# Hugging Face model types a reader is not built from, with what to do instead.
UNSUPPORTED_MODEL_TYPES = {
    "deberta": "DeBERTa (disentangled relative attention) is not supported",
    "deberta-v2": "DeBERTa-v2 (disentangled relative attention) is not supported",
    "camembert": "CamemBERT is not supported by name; its weights are RoBERTa's: set "
                 "model_type 'roberta' if its config.json matches RobertaConfig",
    "longformer": "Longformer (sliding-window attention) is not supported",
}


def _bert_shaped_fields(hf: dict[str, Any], source: str, architecture: str,
                        embedding_size: Any, **defaults: Any) -> dict[str, Any]:
    """The fields BERT, RoBERTa, XLM-RoBERTa and ELECTRA name alike; `defaults` are their config
    classes' for absent fields (type_vocab_size, hidden_act, layer_norm_eps)."""
    position_type = hf.get("position_embedding_type") or "absolute"
    if position_type != "absolute":
        raise CheckpointError(f"{source}: position_embedding_type {position_type!r} is not "
                              "supported (absolute)")
    for flag in ("is_decoder", "add_cross_attention"):
        if hf.get(flag):
            raise CheckpointError(f"{source}: {flag} is true: a reader is a bidirectional "
                                  f"encoder without cross-attention ({architecture})")
    return dict(
        architecture=architecture, hidden_size=_required(hf, "hidden_size", source),
        num_layers=_required(hf, "num_hidden_layers", source),
        num_heads=_required(hf, "num_attention_heads", source),
        intermediate_size=_required(hf, "intermediate_size", source),
        embedding_size=embedding_size,
        type_vocab_size=hf.get("type_vocab_size", defaults["type_vocab_size"]),
        hidden_act=hf.get("hidden_act", defaults["hidden_act"]),
        layer_norm_eps=hf.get("layer_norm_eps", defaults["layer_norm_eps"]),
        hidden_dropout=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout=hf.get("attention_probs_dropout_prob", 0.1))


def _bert_fields(hf: dict[str, Any], source: str) -> dict[str, Any]:
    return _bert_shaped_fields(hf, source, "bert", _required(hf, "hidden_size", source),
                               type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12)


def _roberta_fields(hf: dict[str, Any], source: str) -> dict[str, Any]:
    """RoBERTa and XLM-RoBERTa (same fields; RobertaConfig's defaults). Positions start at
    pad_token_id + 1 (EncoderConfig.first_position), read from `pad_token_id` (default 1)."""
    return _bert_shaped_fields(hf, source, hf["model_type"], _required(hf, "hidden_size", source),
                               type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12)


def _electra_fields(hf: dict[str, Any], source: str) -> dict[str, Any]:
    """ELECTRA discriminators: BERT-shaped blocks, embeddings of `embedding_size` (default 128)
    projected to hidden_size when they differ. Generators (ElectraForMaskedLM) are refused."""
    generators = [name for name in hf.get("architectures") or []
                  if name in ("ElectraForMaskedLM", "ElectraForCausalLM")]
    if generators:
        raise CheckpointError(f"{source}: architectures {generators}: an ELECTRA generator; a "
                              "reader is built from the discriminator (ElectraForPreTraining, "
                              "ElectraModel or ElectraForQuestionAnswering)")
    return _bert_shaped_fields(hf, source, "electra", hf.get("embedding_size", 128),
                               type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12)


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
    "roberta": _roberta_fields, "xlm-roberta": _roberta_fields, "electra": _electra_fields,
    "xlnet": xlnet_fields}
# The Hugging Face *ForQuestionAnswering class an export's config.json names, per architecture.
QA_CLASSES = {"bert": "BertForQuestionAnswering", "albert": "AlbertForQuestionAnswering",
              "distilbert": "DistilBertForQuestionAnswering",
              "roberta": "RobertaForQuestionAnswering",
              "xlm-roberta": "XLMRobertaForQuestionAnswering",
              "electra": "ElectraForQuestionAnswering",
              # The qa_outputs span head; XLNetForQuestionAnswering's beam head is refused.
              "xlnet": "XLNetForQuestionAnsweringSimple"}
# Hugging Face's default pad_token_id per config class, for a config.json that leaves it out.
_DEFAULT_PAD_TOKEN_ID = {"roberta": 1, "xlm-roberta": 1, "xlnet": 5}


def encoder_config_from_hf(hf: dict[str, Any], source: str = "config.json",
                           overrides: ReaderOverrides = NO_OVERRIDES) -> EncoderConfig:
    """Maps a Hugging Face `config.json` dict to an EncoderConfig, `overrides` (k, say) set over
    what the file says.

    Raises CheckpointError naming `source` and the field for a missing or unsupported field or
    an unknown model_type.
    """
    model_type = hf.get("model_type")
    # isinstance first: a damaged config.json may hold a list here, which cannot be a dict key.
    architecture_fields = (_ARCHITECTURE_FIELDS.get(model_type) if isinstance(model_type, str)
                           else None)
    if isinstance(model_type, str) and model_type in UNSUPPORTED_MODEL_TYPES:
        raise CheckpointError(f"{source}: model_type={model_type!r}: "
                              f"{UNSUPPORTED_MODEL_TYPES[model_type]}; supported: "
                              f"{', '.join(_ARCHITECTURE_FIELDS)}")
    if architecture_fields is None:
        raise CheckpointError(f"{source}: unknown architecture model_type={model_type!r}; "
                              f"supported: {', '.join(_ARCHITECTURE_FIELDS)}")
    values = architecture_fields(hf, source)
    pad_token_id = hf.get("pad_token_id", _DEFAULT_PAD_TOKEN_ID.get(model_type, 0))
    values.update(vocab_size=_required(hf, "vocab_size", source),
                  max_position_embeddings=hf.get("max_position_embeddings", 512),
                  initializer_range=hf.get("initializer_range", 0.02),
                  pad_token_id=pad_token_id or 0)
    if overrides.reversible:  # a reader's setting: no Hugging Face config has the field
        raise CheckpointError(
            f"{source}: reversible=True with a pretrained checkpoint: its post-LayerNorm blocks "
            f"compute a different function than reversible (RevNet) blocks, whose residual "
            f"stream is two halves; reversible is for readers trained from scratch (use "
            f"remat_policy to save memory with pretrained weights)")
    try:
        return overrides.config_of(values)
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
        return dict(hf_xlnet_config(config), architectures=[QA_CLASSES["xlnet"]])
    if config.architecture == "distilbert":
        return dict(common, model_type="distilbert",
                    architectures=[QA_CLASSES["distilbert"]], dim=config.hidden_size,
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
    values.update(model_type=config.architecture,
                  architectures=[QA_CLASSES[config.architecture]])
    if config.architecture == "albert":
        return dict(values, embedding_size=config.embedding_size,
                    num_hidden_groups=config.num_hidden_groups, inner_group_num=1)
    if config.architecture == "electra":
        return dict(values, embedding_size=config.embedding_size)
    return values
