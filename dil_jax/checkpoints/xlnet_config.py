"""XLNet's `config.json` <-> EncoderConfig, and what of XLNet a reader refuses by name.

A reader runs XLNet's single-stream fine-tuning path (`dil_jax/model/xlnet.py`): bidirectional
attention, one pass, no memory. Accepted because they change nothing in such a pass (Hugging
Face's own code reads them only elsewhere): `mem_len` and `reuse_len` (what to cache for a NEXT
call, `XLNetModel.cache_mem`), `same_length` (only in the causal mask of attn_type "uni"),
`use_mems_eval` / `use_mems_train`, `untie_r` (every block has its own biases either way), the
summary_* fields (the sequence-classification head) and start_n_top / end_n_top (the beam head of
`XLNetForQuestionAnswering`, whose tensors are refused by `hf_tensors`). Refused: attn_type other
than "bi", bi_data (pre-training's forward/backward position halves of the batch), clamp_len > 0
(distance clamping, not implemented) and the `XLNetForQuestionAnswering` class.
"""

from __future__ import annotations

from typing import Any

from dil_jax.errors import CheckpointError
from dil_jax.model.encoder_config import EncoderConfig

# Task classes whose heads a reader cannot run (the beam-search SQuAD head).
UNSUPPORTED_XLNET_CLASSES = ("XLNetForQuestionAnswering",)


def _required(hf: dict[str, Any], key: str, source: str) -> Any:
    if key not in hf:
        raise CheckpointError(f"{source}: field {key!r} missing (model_type 'xlnet')")
    return hf[key]


def _refuse_unsupported(hf: dict[str, Any], source: str) -> None:
    if hf.get("attn_type", "bi") != "bi":
        raise CheckpointError(f"{source}: XLNet attn_type {hf['attn_type']!r} is not supported "
                              "('bi', the bidirectional fine-tuning attention)")
    if hf.get("bi_data", False):
        raise CheckpointError(f"{source}: XLNet bi_data true is not supported (pre-training's "
                              "bidirectional data pipeline)")
    clamp_len = hf.get("clamp_len", -1)
    if clamp_len is not None and clamp_len > 0:
        raise CheckpointError(f"{source}: XLNet clamp_len {clamp_len} is not supported "
                              "(relative distances are not clamped; -1 or 0)")
    for name in hf.get("architectures") or ():
        if name in UNSUPPORTED_XLNET_CLASSES:
            raise CheckpointError(
                f"{source}: architectures {name!r}: the beam-search head of "
                "XLNetForQuestionAnswering (start_logits / end_logits / answer_class) is not "
                "supported; use XLNetForQuestionAnsweringSimple (the qa_outputs span head) or "
                "an XLNetModel backbone")


def xlnet_fields(hf: dict[str, Any], source: str) -> dict[str, Any]:
    """EncoderConfig fields of an XLNet `config.json` (model_type "xlnet")."""
    _refuse_unsupported(hf, source)
    hidden = _required(hf, "d_model", source)
    heads = _required(hf, "n_head", source)
    if "d_head" in hf and hf["d_head"] * heads != hidden:
        raise CheckpointError(f"{source}: XLNet d_head {hf['d_head']} x n_head {heads} != "
                              f"d_model {hidden}")
    return dict(
        architecture="xlnet", hidden_size=hidden, num_layers=_required(hf, "n_layer", source),
        num_heads=heads, intermediate_size=_required(hf, "d_inner", source),
        embedding_size=hidden, type_vocab_size=0,
        hidden_act=hf.get("ff_activation", "gelu"),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
        # One dropout rate in XLNet, for embeddings, attention probabilities and outputs.
        hidden_dropout=hf.get("dropout", 0.1), attention_dropout=hf.get("dropout", 0.1))


def hf_xlnet_config(config: EncoderConfig) -> dict[str, Any]:
    """The `config.json` fields of an XLNetForQuestionAnsweringSimple with these weights
    (`hf_config_from_encoder_config` adds `architectures`, from `QA_CLASSES`).

    Without max_position_embeddings: XLNetConfig refuses that field (XLNet has no length
    limit), so a re-import takes the default length limit (`encoder_config_from_hf`, 512)."""
    return dict(
        model_type="xlnet", vocab_size=config.vocab_size, d_model=config.hidden_size,
        n_layer=config.num_layers, n_head=config.num_heads, d_head=config.head_dim,
        d_inner=config.intermediate_size,
        ff_activation=config.hidden_act, layer_norm_eps=config.layer_norm_eps,
        dropout=config.hidden_dropout, initializer_range=config.initializer_range,
        pad_token_id=config.pad_token_id, attn_type="bi", bi_data=False, clamp_len=-1,
        same_length=False, mem_len=None, reuse_len=None, untie_r=True)
