"""The Hugging Face PyTorch peer: the architecture's `*ForQuestionAnswering` with our weights,
on our grid.

It reads every pair as `[CLS] q [SEP] p [SEP]` with the same weights, lengths, chunking and
thread count as our reader, on the same kind of device (`peer_device`). torch and transformers
are optional extras ('dil_jax[bench]'): they are imported only when the peer runs.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from dil_jax.bench.grids import GridInputs
from dil_jax.model.delayed import Params
from dil_jax.model.encoder_config import EncoderConfig
from dil_jax.model.span_reader import PADDED_LOGIT
from dil_jax.reading.pairs import SpanScores


def hf_peer_config(config: EncoderConfig) -> Any:
    """The `transformers` config of an EncoderConfig: the config.json an export writes
    (`hf_config_from_encoder_config`), as the architecture's config class."""
    import transformers

    from dil_jax.checkpoints import hf_config_from_encoder_config

    values = hf_config_from_encoder_config(config)
    values.pop("architectures")
    return transformers.AutoConfig.for_model(values.pop("model_type"), **values)


def hf_model_from_params(config: EncoderConfig, params: Params) -> Any:
    """A torch `*ForQuestionAnswering` of the config's architecture (eval mode, e.g.
    `BertForQuestionAnswering`) holding exactly our params."""
    import torch
    import transformers

    from dil_jax.checkpoints import export_state_dict
    from dil_jax.checkpoints.hf_config import QA_CLASSES
    from dil_jax.checkpoints.hf_tensors import add_backbone_prefix

    model_class = getattr(transformers, QA_CLASSES[config.architecture])
    model = model_class(hf_peer_config(config)).eval()
    # torch.tensor copies: the exported arrays may be read-only views of device buffers.
    state = {add_backbone_prefix(name, config.architecture): torch.tensor(value)
             for name, value in export_state_dict(params, config).items()}
    # strict: every tensor of the torch model must come from our params, none left at its init.
    model.load_state_dict(state, strict=True)
    return model


def peer_device(backend: str, cuda_available: bool) -> tuple[str | None, str]:
    """Where the PyTorch peer runs: on the kind of device our reader runs on, or nowhere.

    backend: `jax.default_backend()`. Returns (torch device or None, why), so that a GPU run
    compares CUDA with CUDA and a TPU run (no torch peer there) says so instead of timing the
    host CPU against the accelerator.
    """
    if backend == "cpu":
        return "cpu", "JAX runs on the CPU"
    if backend in ("gpu", "cuda") and cuda_available:
        return "cuda", "JAX runs on a GPU and torch sees CUDA"
    if backend in ("gpu", "cuda"):
        return None, "JAX runs on a GPU but this torch has no CUDA: no peer on the same device"
    return None, f"no PyTorch peer for the {backend!r} backend (torch-xla is out of scope)"


def run_hf_grid(model: Any, inputs: GridInputs, chunk_size: int,
                max_pairs: int | None = None, token_types: bool = True
                ) -> tuple[dict[str, float], SpanScores | None]:
    """One timed pass of the peer: every pair as `[CLS] q [SEP] p [SEP]`, `chunk_size` at a time.

    token_types: pass token types 0 / 1 for question / passage (`config.segment_token_types`;
    RoBERTa and XLM-RoBERTa take their default, type 0 throughout).

    Builds each chunk from per-segment tensors (as PairGrid gathers inside its program) and
    returns the same span scores as `PairGrid.read_grid`. All time is the pair phase. Runs on
    the model's device; copying each chunk's scores to the host synchronises it.
    """
    import torch

    device = next(model.parameters()).device
    nq, npas = inputs.q_ids.shape[0], inputs.p_ids.shape[0]
    q_len, p_len = inputs.q_ids.shape[1], inputs.p_ids.shape[1]

    def tensor(array: np.ndarray) -> Any:
        return torch.from_numpy(array).long().to(device)

    q_ids, p_ids = tensor(inputs.q_ids), tensor(inputs.p_ids)
    q_mask, p_mask = tensor(inputs.q_mask), tensor(inputs.p_mask)
    types = tensor(np.repeat(np.arange(2), (q_len, p_len)))
    q_index, p_index = (tensor(a.ravel()) for a in np.meshgrid(
        np.arange(nq), np.arange(npas), indexing="ij"))
    num_pairs = nq * npas if max_pairs is None else max_pairs
    start_logits = np.empty((num_pairs, q_len + p_len), np.float32)
    end_logits = np.empty((num_pairs, q_len + p_len), np.float32)
    start = time.perf_counter()
    with torch.inference_mode():
        for lo in range(0, num_pairs, chunk_size):
            qi, pi = q_index[lo:lo + chunk_size], p_index[lo:lo + chunk_size]
            kwargs = {"token_type_ids": types.expand(len(qi), -1)} if token_types else {}
            out = model(input_ids=torch.cat([q_ids[qi], p_ids[pi]], dim=1),
                        attention_mask=torch.cat([q_mask[qi], p_mask[pi]], dim=1), **kwargs)
            start_logits[lo:lo + len(qi)] = out.start_logits.float().cpu().numpy()
            end_logits[lo:lo + len(qi)] = out.end_logits.float().cpu().numpy()
    times = {"ni_q": 0.0, "ni_p": 0.0, "pairs": time.perf_counter() - start}
    if max_pairs is not None:
        return times, None
    return times, _hf_grid_output(start_logits, end_logits, inputs.p_mask, nq, npas, q_len)


def _hf_grid_output(start: np.ndarray, end: np.ndarray, p_mask: np.ndarray, nq: int, npas: int,
                    q_len: int) -> SpanScores:
    """[pairs, q_len + p_len] peer logits -> SpanScores (passage scores, `[CLS]` null scores)."""
    pair_p_mask = np.repeat(p_mask[None], nq, axis=0).reshape(nq * npas, -1)

    def passage(logits: np.ndarray) -> np.ndarray:
        return np.where(pair_p_mask > 0, logits[:, q_len:], PADDED_LOGIT).reshape(nq, npas, -1)

    return SpanScores(passage(start), passage(end), start[:, 0].reshape(nq, npas),
                      end[:, 0].reshape(nq, npas))


def max_logit_difference(a: SpanScores, b: SpanScores) -> float:
    """Largest absolute difference of any span score (start, end, null) of two grids."""
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a.arrays, b.arrays, strict=True))
