"""Hugging Face tensor names <-> Flax param paths, both ways, with every shape checked.

`name_map` is the one table of the mapping: Hugging Face tensor name (backbone prefix such as
`bert.` stripped) -> (our param path, layout transform). Import (`convert_state_dict`) checks
each tensor's name and shape against it and reports what was loaded, what was initialised (a QA
head absent from a plain `BertModel` checkpoint) and what was ignored (pooler, pre-training
heads); export (`export_state_dict`) walks it the other way.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from dil_jax.checkpoints.integrity import nonfinite_count
from dil_jax.errors import CheckpointError
from dil_jax.model.bert import num_param_blocks
from dil_jax.model.delayed import DelayedInteractionModel, Params
from dil_jax.model.encoder_config import EncoderConfig

# How one Hugging Face tensor becomes one of our params: (param path, layout transform). The
# transforms are their own inverses (identity, 2-D transpose), so export uses them as they are.
TensorRule = tuple[tuple[str, ...], Callable[[np.ndarray], np.ndarray]]

# The attribute a task model nests its backbone under, per architecture (BertForQuestionAnswering
# holds `bert.embeddings...`; XLM-RoBERTa's task models reuse RoBERTa's `roberta.`; XLNet's is
# `transformer.`). Only the architecture's own prefix is stripped on import: a bare
# DistilBertModel's own tensors start with `transformer.`.
BACKBONE_PREFIX = {"bert": "bert.", "albert": "albert.", "distilbert": "distilbert.",
                   "roberta": "roberta.", "xlm-roberta": "roberta.", "electra": "electra.",
                   "xlnet": "transformer."}
# Tensors of pre-training heads and poolers: not part of a reader, ignored by name (RoBERTa's
# `lm_head`, ELECTRA's `discriminator_predictions`, buffers older checkpoints saved).
_IGNORED = re.compile(
    r"^(pooler\.|cls\.|predictions\.|sop_classifier\.|vocab_|classifier\.|pre_classifier\.|"
    r"lm_head\.|discriminator_predictions\.|embeddings\.position_ids$|"
    r"embeddings\.token_type_ids$|"
    # XLNet: the query stream's mask embedding, the LM head, the sequence-summary head.
    r"mask_emb$|lm_loss\.|sequence_summary\.|logits_proj\.)")
# XLNetForQuestionAnswering's beam-search head: refused by name, never silently dropped.
_XLNET_BEAM_HEAD = re.compile(r"^(start_logits|end_logits|answer_class)\.")


@dataclasses.dataclass
class ImportReport:
    """What a conversion did, by Hugging Face tensor name."""

    source: str
    loaded: list[str] = dataclasses.field(default_factory=list)
    initialized: list[str] = dataclasses.field(default_factory=list)
    ignored: list[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        lines = [f"imported {len(self.loaded)} tensors from {self.source}"]
        if self.initialized:
            lines.append(f"initialised (absent from the checkpoint): {', '.join(self.initialized)}")
        if self.ignored:
            lines.append(f"ignored (not part of a reader): {', '.join(self.ignored)}")
        return "\n".join(lines)


def _dense_rules(hf: str, ours: tuple[str, ...]) -> dict[str, TensorRule]:
    """torch Linear [out, in] -> flax Dense kernel [in, out]."""
    return {f"{hf}.weight": (ours + ("kernel",), np.transpose),
            f"{hf}.bias": (ours + ("bias",), _identity)}


def _norm_rules(hf: str, ours: tuple[str, ...]) -> dict[str, TensorRule]:
    return {f"{hf}.weight": (ours + ("scale",), _identity),
            f"{hf}.bias": (ours + ("bias",), _identity)}


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _block_names(config: EncoderConfig, index: int) -> dict[str, str]:
    """Hugging Face module names of parameter block `index`, keyed by our submodule names."""
    if config.architecture in ("bert", "roberta", "xlm-roberta", "electra"):
        p = f"encoder.layer.{index}"
        return {"query": f"{p}.attention.self.query", "key": f"{p}.attention.self.key",
                "value": f"{p}.attention.self.value", "output": f"{p}.attention.output.dense",
                "attention_norm": f"{p}.attention.output.LayerNorm",
                "ffn_in": f"{p}.intermediate.dense", "ffn_out": f"{p}.output.dense",
                "output_norm": f"{p}.output.LayerNorm"}
    if config.architecture == "albert":
        p = f"encoder.albert_layer_groups.{index}.albert_layers.0"
        return {"query": f"{p}.attention.query", "key": f"{p}.attention.key",
                "value": f"{p}.attention.value", "output": f"{p}.attention.dense",
                "attention_norm": f"{p}.attention.LayerNorm", "ffn_in": f"{p}.ffn",
                "ffn_out": f"{p}.ffn_output", "output_norm": f"{p}.full_layer_layer_norm"}
    p = f"transformer.layer.{index}"
    return {"query": f"{p}.attention.q_lin", "key": f"{p}.attention.k_lin",
            "value": f"{p}.attention.v_lin", "output": f"{p}.attention.out_lin",
            "attention_norm": f"{p}.sa_layer_norm", "ffn_in": f"{p}.ffn.lin1",
            "ffn_out": f"{p}.ffn.lin2", "output_norm": f"{p}.output_layer_norm"}


def _xlnet_name_map(config: EncoderConfig) -> dict[str, TensorRule]:
    """XLNet's tensors (`transformer.` stripped). The attention tensors keep their [d_model,
    n_head, d_head] / [n_head, d_head] layouts (model/xlnet.py `RelativeAttention`)."""
    rules: dict[str, TensorRule] = {
        "word_embedding.weight": (("embeddings", "word_embeddings", "embedding"), _identity)}
    attention_names = {"q": "query", "k": "key", "v": "value", "o": "output", "r": "position",
                       "r_w_bias": "content_bias", "r_r_bias": "position_bias",
                       "r_s_bias": "segment_bias", "seg_embed": "segment_embedding"}
    for index in range(config.num_layers):
        p, block = f"layer.{index}", (f"block_{index}",)
        for hf, ours in attention_names.items():
            rules[f"{p}.rel_attn.{hf}"] = (block + ("attention", ours), _identity)
        rules.update(_norm_rules(f"{p}.rel_attn.layer_norm", block + ("attention", "norm")))
        rules.update(_norm_rules(f"{p}.ff.layer_norm", block + ("output_norm",)))
        rules.update(_dense_rules(f"{p}.ff.layer_1", block + ("ffn_in",)))
        rules.update(_dense_rules(f"{p}.ff.layer_2", block + ("ffn_out",)))
    rules.update(_dense_rules("qa_outputs", ("qa_outputs",)))
    return rules


def name_map(config: EncoderConfig) -> dict[str, TensorRule]:
    """Hugging Face tensor name (backbone prefix stripped) -> (our param path, transform)."""
    if config.architecture == "xlnet":
        return _xlnet_name_map(config)
    rules: dict[str, TensorRule] = {}
    emb = ("embeddings",)
    for table in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        if table == "token_type_embeddings" and not config.type_vocab_size:
            continue
        rules[f"embeddings.{table}.weight"] = (emb + (table, "embedding"), _identity)
    rules.update(_norm_rules("embeddings.LayerNorm", emb + ("norm",)))
    if config.projects_embeddings:
        hf_projection = {"albert": "encoder.embedding_hidden_mapping_in",
                         "electra": "embeddings_project"}[config.architecture]
        rules.update(_dense_rules(hf_projection, emb + ("projection",)))
    for index in range(num_param_blocks(config)):
        block = (f"block_{index}",)
        for ours, hf in _block_names(config, index).items():
            if ours in ("attention_norm", "output_norm"):
                rules.update(_norm_rules(hf, block + (ours,)))
            elif ours in ("query", "key", "value", "output"):
                rules.update(_dense_rules(hf, block + ("attention", ours)))
            else:
                rules.update(_dense_rules(hf, block + (ours,)))
    rules.update(_dense_rules("qa_outputs", ("qa_outputs",)))
    return rules


def strip_backbone_prefix(name: str, architecture: str) -> str:
    """`bert.embeddings.x` -> `embeddings.x`: task models nest the backbone under
    `BACKBONE_PREFIX[architecture]`; a bare backbone's names are returned as they are."""
    prefix = BACKBONE_PREFIX[architecture]
    return name[len(prefix):] if name.startswith(prefix) else name


def add_backbone_prefix(name: str, architecture: str) -> str:
    """The inverse for an exported tensor (`export_state_dict` names): the name it has in the
    architecture's *ForQuestionAnswering, `qa_outputs.` at the top, the rest under the
    backbone's prefix."""
    return name if name.startswith("qa_outputs.") else BACKBONE_PREFIX[architecture] + name


def _set_path(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _get_path(tree: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _has_path(tree: dict, path: tuple[str, ...]) -> bool:
    try:
        _get_path(tree, path)
        return True
    except KeyError:
        return False


def convert_state_dict(state: dict[str, np.ndarray], config: EncoderConfig,
                       rng: jax.Array | None = None,
                       source: str = "state dict") -> tuple[Params, ImportReport]:
    """Hugging Face tensors (numpy) -> Flax params, checking every name and shape.

    Raises CheckpointError naming a missing backbone tensor, an unexpected one, the first
    tensor whose shape differs from what `config` implies, or one holding a NaN or inf. A
    missing QA head is initialised from `rng` (default key 0) and listed in the report.
    """
    rules = name_map(config)
    model = DelayedInteractionModel(config)
    rng = jax.random.key(0) if rng is None else rng
    # Shapes only: initialising every weight costs more than the rest of a load (it runs and
    # compiles the whole init); the random values are needed only for a missing QA head.
    expected_shapes = jax.eval_shape(model.init, rng)
    report = ImportReport(source=source)
    params: dict = {}
    unexpected = []
    for hf_name, tensor in state.items():
        name = strip_backbone_prefix(hf_name, config.architecture)
        if config.architecture == "xlnet" and _XLNET_BEAM_HEAD.match(name):
            raise CheckpointError(
                f"{source}: tensor {hf_name!r} belongs to XLNetForQuestionAnswering's beam-search "
                "head, which is not supported; use XLNetForQuestionAnsweringSimple (qa_outputs)")
        if name not in rules:
            if _IGNORED.match(name):
                report.ignored.append(hf_name)
            else:
                unexpected.append(hf_name)
            continue
        path, transform = rules[name]
        value = transform(np.asarray(tensor, dtype=np.float32))
        expected = _get_path(expected_shapes, path).shape
        if tuple(value.shape) != tuple(expected):
            raise CheckpointError(
                f"{source}: tensor {hf_name!r} has shape {tuple(tensor.shape)}, but the config "
                f"implies {tuple(expected) if transform is _identity else tuple(expected)[::-1]} "
                f"(for {'/'.join(path)}); does config.json describe this checkpoint?")
        bad = nonfinite_count(value)
        if bad:  # what a folder without a digest can still be checked for (~1% of a load)
            raise CheckpointError(
                f"{source}: tensor {hf_name!r} has {bad} NaN or infinite value(s) of "
                f"{value.size}: the weights file is damaged, or training diverged; re-download "
                "the checkpoint, or re-export it from the run that trained it")
        _set_path(params, path, value)
        report.loaded.append(hf_name)
    if unexpected:
        raise CheckpointError(f"{source}: unexpected tensor(s) not in a {config.architecture} "
                              f"reader of {config.num_layers} layers: {sorted(unexpected)}")
    missing = [name for name, (path, _) in rules.items()
               if not _has_path(params, path)]
    missing_backbone = [name for name in missing if not name.startswith("qa_outputs.")]
    if missing_backbone:
        raise CheckpointError(f"{source}: missing tensor(s): {missing_backbone}")
    fresh = model.init(rng) if missing else None
    for name in missing:
        path, _ = rules[name]
        _set_path(params, path, np.asarray(_get_path(fresh, path)))
        report.initialized.append(name)
    return jax.tree.map(np.asarray, params), report


def export_state_dict(params: Params, config: EncoderConfig) -> dict[str, np.ndarray]:
    """Flax params -> Hugging Face tensor names (no backbone prefix) and layouts."""
    out = {}
    for name, (path, transform) in name_map(config).items():
        value = np.asarray(_get_path(params, path), dtype=np.float32)
        out[name] = np.ascontiguousarray(transform(value))  # transpose is its own inverse
    return out
