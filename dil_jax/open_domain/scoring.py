"""The open-domain reader's scores: answer candidates, span score rules, score fusion.

    Candidate              the best span of one retrieved passage for one question
    pair_span_scores       a pair's best-span score under a rule of SPAN_SCORES ("logits",
                           "margin")
    best_pair_of_each_hit  the best window of each retrieved passage under that score
    standardize, fusion_scores, answer_scores, pick_answer
                           the answer among a question's candidates: the reader score alone,
                           or fused with BM25's (mu * z(s_r) + (1 - mu) * z(s_bm25))

Separate from reader.py (`OpenDomainReader`: retrieval, the cache, the pair grid) because these
are plain functions of score arrays and candidates, with no model, index or cache: the
evaluation (evaluate.py) and benchmarks pick answers with them alone. Why the two span score
rules and why fusion standardises: the "Scores" paragraph of `dil_jax.open_domain.reader`'s
module docstring. Dependencies run one way: reader.py imports this module, never the reverse.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from dil_jax.defaults import SPAN_SCORES
from dil_jax.reading.pairs import SpanScores


@dataclasses.dataclass
class Candidate:
    """The best span of one retrieved passage for one question."""

    passage_index: int
    rank: int             # BM25 rank of the passage for this question (0 = best)
    text: str
    char_start: int       # in the passage text
    char_end: int
    reader_score: float   # by the reader's span score rule (SPAN_SCORES), halved
    bm25_score: float


def standardize(scores: np.ndarray) -> np.ndarray:
    """(scores - mean) / std over the last axis; std 0 (one candidate, or all equal) -> 0."""
    scores = np.asarray(scores, np.float64)
    std = scores.std(axis=-1, keepdims=True)
    centered = scores - scores.mean(axis=-1, keepdims=True)
    return np.divide(centered, std, out=np.zeros_like(centered), where=std > 0)


def fusion_scores(reader: np.ndarray, bm25: np.ndarray, mu: float | None) -> np.ndarray:
    """[n] the score an answer is picked by, from the candidates' reader and BM25 scores [n]:
    the reader score alone (mu None), or mu * z(reader) + (1 - mu) * z(bm25), z standardised
    over these candidates."""
    reader = np.asarray(reader, np.float64)
    if mu is None:
        return reader
    return mu * standardize(reader) + (1 - mu) * standardize(np.asarray(bm25, np.float64))


def answer_scores(candidates: Sequence[Candidate], mu: float | None) -> np.ndarray:
    """[n_candidates] `fusion_scores` of these candidates."""
    return fusion_scores([c.reader_score for c in candidates],
                         [c.bm25_score for c in candidates], mu)


def pick_answer(candidates: Sequence[Candidate], mu: float | None) -> Candidate | None:
    """The answer among a question's candidates: reader score alone (mu None) or fused."""
    if not candidates:
        return None
    return candidates[int(np.argmax(answer_scores(candidates, mu)))]


def pair_span_scores(best_span_scores: np.ndarray, scores: SpanScores, rule: str) -> np.ndarray:
    """[n_pairs] score of each pair's best span (best_span_scores: [n_pairs], s_start + s_end)
    under `rule` (SPAN_SCORES; `dil_jax.open_domain.reader`'s module docstring says why
    "margin" exists)."""
    if rule == "logits":
        return best_span_scores
    if rule == "margin":
        return best_span_scores - (np.asarray(scores.null_start_logits, np.float64)
                                   + np.asarray(scores.null_end_logits, np.float64))
    raise ValueError(f"unknown span score rule {rule!r}; rules are {list(SPAN_SCORES)}")


def best_pair_of_each_hit(best_span_scores: np.ndarray, pair_hit: Sequence[tuple[int, int]]
                          ) -> dict[tuple[int, int], int]:
    """hit -> the pair (window) with the highest best-span score among that hit's pairs
    (the first on ties). best_span_scores: [n_pairs]."""
    best: dict[tuple[int, int], int] = {}
    for pair, key in enumerate(pair_hit):
        if key not in best or best_span_scores[pair] > best_span_scores[best[key]]:
            best[key] = pair
    return best
