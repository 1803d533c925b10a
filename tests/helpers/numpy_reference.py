"""An independent NumPy reader written straight from Hugging Face tensor names.

It shares no code with dil_jax: it reads the PyTorch state dict (numpy arrays) by Hugging Face
names and runs all l blocks over the concatenated `[CLS] q [SEP] p [SEP]` sequence, with an
explicit [seq, seq] attention mask per layer. Delayed interaction is then "block-diagonal mask
in layers 1..k, full mask above" — a different formulation from dil_jax's split code path,
which is what makes it a reference.

Position ids are the caller's: `bert_positions` (0, 1, ...) or `roberta_positions`, Hugging
Face's `create_position_ids_from_input_ids` rewritten here (non-pad tokens numbered
padding_idx + 1, padding_idx + 2, ...; pads get padding_idx).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import erf


def _strip(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for name, value in state.items():
        for prefix in ("bert.", "albert.", "distilbert.", "roberta.", "electra."):
            if name.startswith(prefix):
                name = name[len(prefix):]
        out[name] = np.asarray(value, dtype=np.float64)
    return out


def _linear(x, state, name):
    return x @ state[f"{name}.weight"].T + state[f"{name}.bias"]


def layer_norm(x, state, name, eps):
    """LayerNorm of the last axis with the `name`.weight / `name`.bias of `state`."""
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * state[f"{name}.weight"] + state[f"{name}.bias"]


def activation(x, name):
    """The feed-forward activation of a Hugging Face config's `hidden_act` / `ff_activation`."""
    if name == "gelu":
        return 0.5 * x * (1 + erf(x / math.sqrt(2)))
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    if name == "relu":
        return np.maximum(x, 0)
    raise ValueError(name)


def bert_positions(ids: np.ndarray) -> np.ndarray:
    """[seq] ids -> [seq] positions 0, 1, ... (BERT, ALBERT, DistilBERT, ELECTRA)."""
    return np.arange(len(ids))


def roberta_positions(ids: np.ndarray, padding_idx: int) -> np.ndarray:
    """[seq] ids -> [seq] positions as RoBERTa's embeddings compute them from the ids:
    cumsum(mask) * mask + padding_idx with mask = ids != padding_idx."""
    mask = (np.asarray(ids) != padding_idx).astype(np.int64)
    return np.cumsum(mask) * mask + padding_idx


def _names(arch: str, index: int) -> dict[str, str]:
    if arch in ("bert", "roberta", "xlm-roberta", "electra"):
        p = f"encoder.layer.{index}"
        return dict(q=f"{p}.attention.self.query", k=f"{p}.attention.self.key",
                    v=f"{p}.attention.self.value", o=f"{p}.attention.output.dense",
                    ln1=f"{p}.attention.output.LayerNorm", f1=f"{p}.intermediate.dense",
                    f2=f"{p}.output.dense", ln2=f"{p}.output.LayerNorm")
    if arch == "albert":
        p = f"encoder.albert_layer_groups.{index}.albert_layers.0"
        return dict(q=f"{p}.attention.query", k=f"{p}.attention.key", v=f"{p}.attention.value",
                    o=f"{p}.attention.dense", ln1=f"{p}.attention.LayerNorm", f1=f"{p}.ffn",
                    f2=f"{p}.ffn_output", ln2=f"{p}.full_layer_layer_norm")
    p = f"transformer.layer.{index}"
    return dict(q=f"{p}.attention.q_lin", k=f"{p}.attention.k_lin", v=f"{p}.attention.v_lin",
                o=f"{p}.attention.out_lin", ln1=f"{p}.sa_layer_norm", f1=f"{p}.ffn.lin1",
                f2=f"{p}.ffn.lin2", ln2=f"{p}.output_layer_norm")


def reference_reader(state: dict[str, np.ndarray], arch: str, num_layers: int, num_heads: int,
                     ids: np.ndarray, token_types: np.ndarray, positions: np.ndarray,
                     allowed: list[np.ndarray], act: str, eps: float = 1e-12,
                     num_groups: int = 1):
    """One sequence, float64.

    ids, token_types, positions: [seq]; allowed: per layer a [seq, seq] bool matrix (query row
    may attend key column). Returns (start [seq], end [seq], hidden states list).
    """
    s = _strip(state)
    x = s["embeddings.word_embeddings.weight"][ids] + \
        s["embeddings.position_embeddings.weight"][positions]
    if "embeddings.token_type_embeddings.weight" in s:
        x = x + s["embeddings.token_type_embeddings.weight"][token_types]
    x = layer_norm(x, s, "embeddings.LayerNorm", eps)
    if arch == "albert":
        x = _linear(x, s, "encoder.embedding_hidden_mapping_in")
    if arch == "electra" and "embeddings_project.weight" in s:  # ELECTRA with E != H
        x = _linear(x, s, "embeddings_project")
    states = [x]
    hidden = x.shape[-1]
    d = hidden // num_heads
    for layer in range(num_layers):
        block = layer * num_groups // num_layers if arch == "albert" else layer
        n = _names(arch, block)

        def heads(t):
            return t.reshape(-1, num_heads, d).transpose(1, 0, 2)

        q, k, v = (heads(_linear(x, s, n[key])) for key in ("q", "k", "v"))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        scores = np.where(allowed[layer][None], scores, -np.inf)
        scores = scores - scores.max(-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(1, 0, 2).reshape(-1, hidden)
        x = layer_norm(x + _linear(context, s, n["o"]), s, n["ln1"], eps)
        x = layer_norm(x + _linear(activation(_linear(x, s, n["f1"]), act), s, n["f2"]), s,
                        n["ln2"], eps)
        states.append(x)
    logits = _linear(x, s, "qa_outputs")
    return logits[:, 0], logits[:, 1], states


# The activation of each tiny test config's family, by Hugging Face name (as `reference_reader`
# takes it).
ACT = {"bert": "gelu", "albert": "gelu_new", "distilbert": "gelu", "roberta": "gelu",
       "xlm-roberta": "gelu", "electra": "gelu"}


def pair_reference(state, config, q, p, k, passage_offset: int = 0):
    """Reference logits of one pair split after block `k` (unpadded lists of ids) -> (start and
    end logits over the passage tokens, null start, null end); the passage's positions start at
    `passage_offset`. `config` is read for its architecture, sizes, pad id and LayerNorm eps."""
    nq, npass = len(q), len(p)
    seq = nq + npass
    segment = np.array([0] * nq + [1] * npass)
    same_segment = segment[:, None] == segment[None, :]
    allowed = [same_segment if layer < k else np.ones((seq, seq), bool)
               for layer in range(config.num_layers)]
    # Each segment is numbered by its backbone's own rule as if it were a sequence alone.
    if config.architecture in ("roberta", "xlm-roberta"):
        padding_idx = config.pad_token_id
        positions = np.concatenate([roberta_positions(np.array(q), padding_idx),
                                    passage_offset + roberta_positions(np.array(p), padding_idx)])
        token_types = np.zeros(seq, np.int64)  # RoBERTa's tokenizers: type 0 everywhere
    else:
        positions = np.concatenate([bert_positions(q), passage_offset + bert_positions(p)])
        token_types = segment
    start, end, _ = reference_reader(
        state, config.architecture, config.num_layers, config.num_heads, np.array(q + p),
        token_types, positions, allowed, ACT[config.architecture],
        eps=config.layer_norm_eps, num_groups=config.num_hidden_groups)
    return start[nq:], end[nq:], start[0], end[0]
