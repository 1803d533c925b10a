"""Span decoding: window logits -> answer text per example.

A span (s, e) of a window is a candidate when s has its max context in that window, e is a
passage token (not [SEP] or padding), and 0 <= e - s < max_answer_length; its score is
start_logit[s] + end_logit[e]. Each window's n best spans come from one vectorised pass over the
band of allowed (s, e) pairs; an example's answer is its best span over all its windows, and the
text is sliced from the ORIGINAL context with the tokens' character offsets.

SQuAD 2.0: the null score of an example is the minimum over its windows of
null_start + null_end (the [CLS] scores); the answer is "" when
null_score - best_span_score > null_threshold (`null_score_differences` gives that difference
per example, to choose the threshold: `dil_jax.metrics.squad_metric.best_null_threshold`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from dil_jax.data.features import Features
from dil_jax.data.squad import SquadExample
from dil_jax.errors import UsageError


@dataclasses.dataclass
class Prediction:
    """The decoded answer of one example.

    text: the answer ("" for a predicted no-answer or when no span is allowed).
    score: best span score (start + end logit), -inf when no span is allowed.
    null_score: the SQuAD 2.0 null score, None when null logits were not given.
    char_start, char_end: [start, end) of the best span in the context (-1 when none).
    window: the window row holding the best span (-1 when none).
    """

    text: str
    score: float
    null_score: float | None = None
    char_start: int = -1
    char_end: int = -1
    window: int = -1


def window_nbest(start_logits: np.ndarray, end_logits: np.ndarray, valid_start: np.ndarray,
                 valid_end: np.ndarray, *, n_best: int = 20, max_answer_length: int = 30,
                 chunk_size: int = 256) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The n best allowed spans of every window, best first.

    start_logits, end_logits: [n_windows, p_len] float; valid_start, valid_end: [n_windows,
    p_len] bool. Returns scores [n_windows, n] float32 (-inf past the allowed spans) and token
    indices starts, ends [n_windows, n] int32 (-1 there), with n = min(n_best, p_len *
    max_answer_length). Exact: every (s, e) with 0 <= e - s < max_answer_length is scored.
    """
    if max_answer_length < 1 or n_best < 1:
        raise UsageError(f"max_answer_length and n_best must be >= 1, got {max_answer_length}, "
                         f"{n_best}")
    n_windows, p_len = start_logits.shape
    band = min(max_answer_length, p_len)
    n = min(n_best, p_len * band)
    scores = np.full((n_windows, n), -np.inf, dtype=np.float32)
    starts = np.full((n_windows, n), -1, dtype=np.int32)
    ends = np.full((n_windows, n), -1, dtype=np.int32)
    for lo in range(0, n_windows, chunk_size):
        hi = min(lo + chunk_size, n_windows)
        start = np.where(valid_start[lo:hi], start_logits[lo:hi], -np.inf).astype(np.float32)
        end = np.where(valid_end[lo:hi], end_logits[lo:hi], -np.inf).astype(np.float32)
        end = np.pad(end, ((0, 0), (0, band - 1)), constant_values=-np.inf)
        # [c, p_len, band]: entry (s, d) scores the span (s, s + d).
        grid = start[:, :, None] + np.lib.stride_tricks.sliding_window_view(end, band, axis=1)
        flat = grid.reshape(hi - lo, -1)
        top = np.argpartition(-flat, n - 1, axis=1)[:, :n] if n < flat.shape[1] else \
            np.broadcast_to(np.arange(flat.shape[1]), flat.shape)
        top_scores = np.take_along_axis(flat, top, axis=1)
        order = np.argsort(-top_scores, axis=1, kind="stable")
        top = np.take_along_axis(top, order, axis=1)
        top_scores = np.take_along_axis(top_scores, order, axis=1)
        allowed = np.isfinite(top_scores)
        scores[lo:hi] = top_scores
        starts[lo:hi] = np.where(allowed, top // band, -1)
        ends[lo:hi] = np.where(allowed, top // band + top % band, -1)
    return scores, starts, ends


def decode_predictions(examples: Sequence[SquadExample], features: Features,
                       start_logits: np.ndarray, end_logits: np.ndarray,
                       null_start_logits: np.ndarray | None = None,
                       null_end_logits: np.ndarray | None = None, *, n_best: int = 20,
                       max_answer_length: int = 30, null_threshold: float = 0.0
                       ) -> dict[str, Prediction]:
    """qid -> Prediction for every example that has windows in `features`.

    start_logits, end_logits: [n_windows, p_len] over the passage tokens of each window;
    null_start_logits, null_end_logits: [n_windows] [CLS] scores, or None for SQuAD 1.1 (always
    answer). With them, "" is answered when null_score - best_span_score > null_threshold.
    """
    start_logits, end_logits = np.asarray(start_logits), np.asarray(end_logits)
    if start_logits.shape != features.p_ids.shape or end_logits.shape != features.p_ids.shape:
        raise ValueError(f"logits shapes {start_logits.shape}, {end_logits.shape} differ from "
                         f"the windows' {features.p_ids.shape}")
    if (null_start_logits is None) != (null_end_logits is None):
        raise ValueError("give both null_start_logits and null_end_logits, or neither")
    valid_end = features.offsets[..., 0] >= 0
    valid_start = valid_end & features.max_context
    scores, starts, ends = window_nbest(start_logits, end_logits, valid_start, valid_end,
                                        n_best=n_best, max_answer_length=max_answer_length)
    example_index = features.example_index
    # Best window of each example: sort by (example, -top score); the first row of each example.
    best_score = scores[:, 0]
    order = np.lexsort((np.arange(len(best_score)), -best_score, example_index))
    first = np.ones(len(order), dtype=bool)
    first[1:] = example_index[order][1:] != example_index[order][:-1]
    best_window = order[first]
    null_scores = None
    if null_start_logits is not None:
        null = np.asarray(null_start_logits, np.float64) + np.asarray(null_end_logits, np.float64)
        null_scores = np.full(len(examples), np.inf)
        np.minimum.at(null_scores, example_index, null)

    predictions: dict[str, Prediction] = {}
    for w in best_window.tolist():
        index = int(example_index[w])
        example = examples[index]
        score = float(scores[w, 0])
        null_score = None if null_scores is None else float(null_scores[index])
        if not np.isfinite(score):
            predictions[example.qid] = Prediction("", score, null_score)
            continue
        s, e = int(starts[w, 0]), int(ends[w, 0])
        char_start, char_end = int(features.offsets[w, s, 0]), int(features.offsets[w, e, 1])
        text = example.context[char_start:char_end]
        if null_score is not None and null_score - score > null_threshold:
            text = ""
        predictions[example.qid] = Prediction(text, score, null_score, char_start, char_end, w)
    return predictions


def answers(predictions: dict[str, Prediction]) -> dict[str, str]:
    """qid -> answer text: the official predictions-file format."""
    return {qid: prediction.text for qid, prediction in predictions.items()}


def null_score_differences(predictions: dict[str, Prediction]) -> dict[str, float]:
    """qid -> null_score - score (+inf when no span is allowed): the quantity the null threshold
    is compared with. Needs predictions decoded with null logits (SQuAD 2.0)."""
    missing = [qid for qid, prediction in predictions.items() if prediction.null_score is None]
    if missing:
        raise ValueError(f"{len(missing)} predictions have no null score (e.g. {missing[0]!r}): "
                         "decode them with null logits (a null_threshold)")
    return {qid: prediction.null_score - prediction.score
            for qid, prediction in predictions.items()}
