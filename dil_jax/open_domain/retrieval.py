"""BM25 retrieval behind a small retriever interface, with the index persisted to disk.

Scoring is rank-bm25's `BM25Okapi` (the design card's choice): its term statistics (idf with the
epsilon floor, document lengths, k1, b) are computed by rank-bm25 itself at build time. Its
`get_scores` loops over every document in Python per query term, too slow for thousands of
questions over tens of thousands of passages, so the per-(term, passage) BM25 weights are laid
out once in a sparse term x passage matrix: a query's scores are then the sum of its terms' rows,
numerically the same as `BM25Okapi.get_scores` (tested), and the matrix is what gets saved.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import scipy.sparse

from dil_jax.atomic import staged_directory
from dil_jax.errors import DilJaxError

_TOKEN = re.compile(r"\w+", re.UNICODE)
# A small English stop list: BM25 idf already discounts common words, this only keeps the
# query rows short (and matches what retrieval papers on SQuAD typically drop).
STOPWORDS = frozenset(
    "a an the of in on at to for from by with and or but is are was were be been being it its "
    "this that these those as do does did what which who whom whose when where why how".split())

INDEX_FORMAT = "dil_jax.bm25/1"


class RetrievalError(DilJaxError, ValueError):
    """An index cannot be read or does not match; the message names the file and the field."""


def bm25_tokenize(text: str) -> list[str]:
    """Lowercased word tokens without stop words (used for passages and queries alike)."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]


@dataclasses.dataclass
class Hit:
    passage_index: int
    score: float


class Retriever(Protocol):
    def search(self, query: str, top_p: int) -> list[Hit]:
        """The top_p passages for a query, best first."""
        ...


class BM25Retriever:
    """BM25 (Okapi) over a fixed list of passage texts.

    Attributes:
      weights: [num_terms, num_passages] CSR matrix of BM25 term weights.
      vocabulary: term -> row of `weights`.
    """

    def __init__(self, weights: scipy.sparse.csr_matrix, vocabulary: dict[str, int],
                 params: dict[str, float]):
        self.weights = weights.tocsr()
        self.vocabulary = vocabulary
        self.params = params

    @property
    def num_passages(self) -> int:
        return self.weights.shape[1]

    @classmethod
    def build(cls, texts: Sequence[str], k1: float = 1.5, b: float = 0.75,
              epsilon: float = 0.25) -> BM25Retriever:
        from rank_bm25 import BM25Okapi

        if not texts:
            raise RetrievalError("cannot build a BM25 index over zero passages")
        tokenized = [bm25_tokenize(text) or ["<empty>"] for text in texts]
        bm25 = BM25Okapi(tokenized, k1=k1, b=b, epsilon=epsilon)
        vocabulary = {term: row for row, term in enumerate(sorted(bm25.idf))}
        rows, cols, values = [], [], []
        length_norm = k1 * (1 - b + b * np.asarray(bm25.doc_len) / bm25.avgdl)
        for col, frequencies in enumerate(bm25.doc_freqs):
            for term, count in frequencies.items():
                rows.append(vocabulary[term])
                cols.append(col)
                values.append(bm25.idf[term] * count * (k1 + 1) / (count + length_norm[col]))
        weights = scipy.sparse.csr_matrix(
            (np.asarray(values, np.float64), (rows, cols)), shape=(len(vocabulary), len(texts)))
        return cls(weights, vocabulary, dict(k1=k1, b=b, epsilon=epsilon))

    def _query_rows(self, query: str) -> list[int]:
        """Rows of `weights` of the query's terms that the index knows (repeats kept)."""
        return [self.vocabulary[t] for t in bm25_tokenize(query) if t in self.vocabulary]

    def scores(self, query: str) -> np.ndarray:
        """[num_passages] BM25 scores (duplicate query terms count twice, as in rank-bm25)."""
        rows = self._query_rows(query)
        if not rows:
            return np.zeros(self.num_passages)
        counts = np.bincount(rows, minlength=self.weights.shape[0])
        return np.asarray(self.weights.T @ counts).ravel()

    def matching(self, query: str) -> np.ndarray:
        """[n] sorted indices of the passages that share at least one term with the query."""
        rows = np.unique(self._query_rows(query))
        if not len(rows):
            return np.zeros(0, np.int64)
        # The stored entries of a term's row are exactly the passages holding that term.
        return np.unique(self.weights[rows].indices).astype(np.int64)

    def search(self, query: str, top_p: int) -> list[Hit]:
        """The best `top_p` passages among those sharing a term with the query, best first:
        fewer when fewer match, none when no query term is in the index (a passage that shares
        no word with the question scores 0 and is not an answer source)."""
        if top_p < 1:
            raise RetrievalError(f"top_p must be >= 1, got {top_p}")
        matched = self.matching(query)
        if not len(matched):
            return []
        scores = self.scores(query)[matched]
        top_p = min(top_p, len(matched))
        best = np.argpartition(-scores, top_p - 1)[:top_p]
        # Stable order: score descending, then passage index (ties broken deterministically).
        best = best[np.lexsort((matched[best], -scores[best]))]
        return [Hit(int(matched[i]), float(scores[i])) for i in best]

    def save(self, directory: str | os.PathLike, fingerprint: str = "") -> Path:
        """Writes the index to `directory` atomically (staging folder, then rename)."""
        directory = Path(directory).absolute()
        with staged_directory(directory) as staging:
            scipy.sparse.save_npz(staging / "weights.npz", self.weights)
            (staging / "vocabulary.json").write_text(json.dumps(self.vocabulary))
            (staging / "manifest.json").write_text(json.dumps(dict(
                format=INDEX_FORMAT, num_passages=self.num_passages, passages=fingerprint,
                **self.params), indent=2))
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike, fingerprint: str | None = None) -> BM25Retriever:
        """Reads a saved index; with `fingerprint`, refuses one built over other passages."""
        directory = Path(directory)
        manifest_path = directory / "manifest.json"
        if not manifest_path.is_file():
            raise RetrievalError(f"{directory}: not a BM25 index (no manifest.json)")
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise RetrievalError(f"{manifest_path}: not readable JSON ({error})") from error
        if not isinstance(manifest, dict):
            raise RetrievalError(f"{manifest_path}: expected a JSON object")
        if manifest.get("format") != INDEX_FORMAT:
            raise RetrievalError(f"{manifest_path}: format {manifest.get('format')!r}, expected "
                                 f"{INDEX_FORMAT!r}")
        if fingerprint is not None and manifest.get("passages") != fingerprint:
            raise RetrievalError(f"{manifest_path}: built over other passages (fingerprint "
                                 f"{manifest.get('passages')!r}, expected {fingerprint!r})")
        try:
            weights = scipy.sparse.load_npz(directory / "weights.npz")
        except (OSError, ValueError, KeyError, EOFError) as error:
            raise RetrievalError(f"{directory / 'weights.npz'}: unreadable ({error})") from error
        try:
            vocabulary = json.loads((directory / "vocabulary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise RetrievalError(f"{directory / 'vocabulary.json'}: unreadable ({error})"
                                 ) from error
        try:
            params = {key: float(manifest[key]) for key in ("k1", "b", "epsilon")}
        except (KeyError, TypeError, ValueError) as error:
            raise RetrievalError(f"{manifest_path}: field {error} missing or not a number"
                                 ) from error
        if not isinstance(vocabulary, dict) or weights.shape[0] != len(vocabulary) or \
                weights.shape[1] != manifest.get("num_passages"):
            raise RetrievalError(f"{directory}: weights.npz {weights.shape}, vocabulary.json and "
                                 f"manifest.json (num_passages {manifest.get('num_passages')}) "
                                 "disagree")
        return cls(weights, vocabulary, params)
