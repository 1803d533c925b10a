"""Which tokens of a passage window the reader keeps, given the prescreener's sentence scores.

A `SentenceRule` picks sentences from one passage's scores: the top m, or the fewest best ones
whose softmax probability mass reaches a threshold (optionally at most m). `window_keep` turns the
kept sentences of each window's passage into a token mask over the window: a token is kept when
its first character lies in a kept sentence; the window's [SEP] is kept whenever anything is.
The reader then runs the upper blocks over the kept tokens only
(`dil_jax.reading.pairs.kept_positions`): the passage's lower states were computed over the whole
passage (and cached), so prescreening shortens exactly the part that pays for every (question,
passage) pair.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from dil_jax.errors import UsageError


@dataclasses.dataclass(frozen=True)
class SentenceRule:
    """Keep the top_m best sentences, or the fewest best whose probability reaches `mass`
    (with both: the mass rule, at most top_m sentences)."""

    top_m: int | None = 2
    mass: float | None = None

    def __post_init__(self):
        if self.top_m is None and self.mass is None:
            raise UsageError("a sentence rule needs top_m (--top-m), mass (--mass) or both")
        if self.top_m is not None and self.top_m < 1:
            raise UsageError(f"top_m (--top-m) must be >= 1, got {self.top_m}")
        if self.mass is not None and not 0.0 < self.mass <= 1.0:
            raise UsageError(f"mass (--mass) must be in (0, 1], got {self.mass}")

    def __str__(self) -> str:
        if self.mass is None:
            return f"top-{self.top_m}"
        return f"mass {self.mass:g}" + ("" if self.top_m is None else f" (<= {self.top_m})")

    def select(self, logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """[n, S] sentence logits and mask -> [n, S] bool, the kept sentences (>= 1 per row
        that has a sentence)."""
        logits = np.where(mask > 0, np.asarray(logits, np.float64), -np.inf)
        order = np.argsort(-logits, axis=1, kind="stable")
        count = np.asarray(mask > 0).sum(axis=1)
        if self.mass is None:
            take = np.minimum(count, self.top_m)
        else:
            shifted = np.exp(logits - np.max(logits, axis=1, keepdims=True, initial=-1e30))
            probs = shifted / np.maximum(shifted.sum(axis=1, keepdims=True), 1e-300)
            ranked = np.take_along_axis(probs, order, axis=1)
            # Sentences before the one whose cumulative mass reaches the threshold, plus it.
            before = np.cumsum(ranked, axis=1) - ranked
            take = np.minimum((before < self.mass - 1e-12).sum(axis=1), count)
            if self.top_m is not None:
                take = np.minimum(take, self.top_m)
        rank_kept = np.arange(logits.shape[1])[None] < take[:, None]
        kept = np.zeros(logits.shape, bool)
        np.put_along_axis(kept, order, rank_kept, axis=1)
        return kept


def token_sentences(offsets: np.ndarray, owner: np.ndarray,
                    spans: Sequence[Sequence[tuple[int, int]]]) -> np.ndarray:
    """[n, p_len] int32: the sentence (index into its passage's `spans`) of each window token.

    offsets: [n, p_len, 2] character offsets in the passage (-1 for [SEP] and padding);
    owner: [n] passage of each window (an index into `spans`). -1 where a token has no offset
    ([SEP], padding), -2 where it starts outside every given sentence (e.g. past the last of a
    passage's spans cut to the prescreener's max_sentences).
    """
    offsets, owner = np.asarray(offsets), np.asarray(owner)
    counts = np.asarray([len(s) for s in spans], np.int64)
    first = np.concatenate([[0], np.cumsum(counts)])
    flat = np.asarray([span for passage in spans for span in passage], np.int64).reshape(-1, 2)
    stride = int(max(flat.max(initial=0), offsets.max(initial=0))) + 2
    # One sorted key per sentence start, passage-major, so one searchsorted serves all passages.
    sentence_passage = np.repeat(np.arange(len(spans)), counts)
    sentence_keys = sentence_passage * stride + flat[:, 0]
    char = offsets[..., 0].astype(np.int64)
    token_keys = owner[:, None].astype(np.int64) * stride + char
    found = np.searchsorted(sentence_keys, token_keys, side="right") - 1
    safe = np.clip(found, 0, max(len(flat) - 1, 0))
    inside = ((char >= 0) & (found >= first[owner][:, None]) & (len(flat) > 0)
              & (char < (flat[safe, 1] if len(flat) else 0)))
    local = np.where(inside, found - first[owner][:, None], -2)
    return np.where(char >= 0, local, -1).astype(np.int32)


def window_keep(token_sentence: np.ndarray, kept_sentences: np.ndarray,
                p_mask: np.ndarray) -> np.ndarray:
    """[n, p_len] bool: tokens of kept sentences, and the window's [SEP] when any is kept.

    token_sentence: [n, p_len] (token_sentences); kept_sentences: [n, S] bool, the kept sentences
    of each window's passage (sentences at index >= S are not kept); p_mask: [n, p_len].
    """
    n, num_sentences = kept_sentences.shape
    scored = (token_sentence >= 0) & (token_sentence < num_sentences)
    keep = scored & kept_sentences[np.arange(n)[:, None],
                                   np.clip(token_sentence, 0, num_sentences - 1)]
    separator = (np.asarray(p_mask) > 0) & (token_sentence == -1)
    return keep | (separator & keep.any(axis=1, keepdims=True))
