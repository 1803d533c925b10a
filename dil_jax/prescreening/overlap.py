"""How much of a question's vocabulary a sentence shares, weighted by how rare each word is.

SQuAD's questions were written by reading one sentence, and most reuse its rarer words. A
sentence encoder squeezes a sentence into one vector and loses exactly which words it holds, so
the prescreener reads this score beside the embeddings (`PrescreenConfig.overlap`; what it adds
on the dev articles: docs/prescreening.md, "Sentence accuracy").

The words are the sentence encoder's own word pieces (its tokenizer, without special tokens),
so no second vocabulary is kept: the IDF table is one float per vocabulary entry, fitted on the
training passages (`fit_idf`) and saved in the prescreener's folder (`IDF_FILE`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

IDF_FILE = "idf.npy"


def piece_sets(tokenizer, texts: Sequence[str]) -> list[np.ndarray]:
    """Each text's distinct word-piece ids (no special tokens), sorted."""
    if not texts:
        return []
    # verbose=False: a passage longer than the encoder's 512 positions is fine here (no model
    # reads these ids), so the tokenizer's warning would only be noise.
    ids = tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
    return [np.unique(np.asarray(row, np.int64)) for row in ids]


def fit_idf(tokenizer, documents: Sequence[str]) -> np.ndarray:
    """[vocab] float32 log((N + 1) / (df + 1)) over `documents` (N of them; df: how many hold
    the piece): a piece in every document weighs ~0, one in none log(N + 1)."""
    df = np.zeros(len(tokenizer), np.int64)
    for pieces in piece_sets(tokenizer, documents):
        df[pieces] += 1
    return np.log((len(documents) + 1) / (df + 1)).astype(np.float32)


def overlap_scores(idf: np.ndarray, questions: Sequence[np.ndarray],
                   sentences: Sequence[Sequence[np.ndarray]], max_sentences: int) -> np.ndarray:
    """[n, max_sentences] float32: for question i and its j-th sentence, the sum of idf over
    the distinct pieces both hold (0 past a question's sentences).

    questions: n piece sets (`piece_sets`); sentences: per question, its sentences' piece sets
    (at most max_sentences)."""
    scores = np.zeros((len(questions), max_sentences), np.float32)
    for row, (question, own) in enumerate(zip(questions, sentences, strict=True)):
        for column, sentence in enumerate(own[:max_sentences]):
            shared = np.intersect1d(question, sentence, assume_unique=True)
            scores[row, column] = idf[shared].sum()
    return scores


@dataclasses.dataclass(frozen=True)
class WordOverlap:
    """`overlap_scores` from texts: the sentence encoder's tokenizer and an IDF table of its
    vocabulary (`fit_idf`)."""

    tokenizer: Any
    idf: np.ndarray

    def __call__(self, questions: Sequence[str], sentences: Sequence[Sequence[str]],
                 max_sentences: int) -> np.ndarray:
        """[n, max_sentences] each question's overlap with each of its sentences (sentences:
        per question, its sentences' texts; those past max_sentences are left out)."""
        flat = [text for own in sentences for text in own[:max_sentences]]
        pieces = iter(piece_sets(self.tokenizer, flat))
        per_question = [[next(pieces) for _ in own[:max_sentences]] for own in sentences]
        return overlap_scores(self.idf, piece_sets(self.tokenizer, questions), per_question,
                              max_sentences)
