"""What every BM25 engine shares (`dil_jax.open_domain.retrieval` and `.lucene`): the tokens,
the hit, the retriever interface, the ranking rule, the index manifest and its errors."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from dil_jax.defaults import RETRIEVER_ENGINES
from dil_jax.errors import DilJaxError

_TOKEN = re.compile(r"\w+", re.UNICODE)
# A small English stop list: BM25 idf already discounts common words, this only keeps the
# query rows short (and matches what retrieval papers on SQuAD typically drop).
STOPWORDS = frozenset(
    "a an the of in on at to for from by with and or but is are was were be been being it its "
    "this that these those as do does did what which who whom whose when where why how".split())

INDEX_FORMAT = "dil_jax.bm25/1"
# Stands in for a passage with no token left after stop words (every engine needs a token).
EMPTY_PASSAGE_TOKEN = "<empty>"


class RetrievalError(DilJaxError, ValueError):
    """An index cannot be read or does not match; the message names the file and the field."""


def bm25_tokenize(text: str) -> list[str]:
    """Lowercased word tokens without stop words (used for passages and queries alike)."""
    return [t for t in _TOKEN.findall(text.lower()) if t not in STOPWORDS]


def tokenized_passages(texts: Sequence[str]) -> list[list[str]]:
    """Every engine's input: each passage's tokens (`EMPTY_PASSAGE_TOKEN` for one left empty by
    the stop words); zero passages are refused."""
    if not texts:
        raise RetrievalError("cannot build a BM25 index over zero passages")
    return [bm25_tokenize(text) or [EMPTY_PASSAGE_TOKEN] for text in texts]


@dataclasses.dataclass
class Hit:
    passage_index: int
    score: float


class Retriever(Protocol):
    engine: str

    @property
    def num_passages(self) -> int:
        ...

    def search(self, query: str, top_p: int) -> list[Hit]:
        """The top_p passages for a query, best first."""
        ...

    def search_batch(self, queries: Sequence[str], top_p: int) -> list[list[Hit]]:
        """`search` of each query."""
        ...

    def save(self, directory: str | os.PathLike, fingerprint: str = "") -> Path:
        """Writes the index to `directory` atomically."""
        ...


def check_top_p(top_p: int) -> None:
    if top_p < 1:
        raise RetrievalError(f"top_p must be >= 1, got {top_p}")


def best_first(indices: np.ndarray, scores: np.ndarray, top_p: int) -> list[Hit]:
    """The `top_p` best of these candidates, score descending then passage index ascending
    (ties broken the same way by every engine)."""
    top_p = min(top_p, len(indices))
    if top_p == 0:
        return []
    best = np.argpartition(-scores, top_p - 1)[:top_p]
    best = best[np.lexsort((indices[best], -scores[best]))]
    return [Hit(int(indices[i]), float(scores[i])) for i in best]


def manifest_json(engine: str, num_passages: int, fingerprint: str,
              params: dict[str, float]) -> str:
    return json.dumps(dict(format=INDEX_FORMAT, engine=engine, num_passages=num_passages,
                           passages=fingerprint, **params), indent=2)


def read_manifest(directory: Path, fingerprint: str | None = None,
                  engine: str | None = None) -> tuple[dict, dict[str, float]]:
    """manifest.json of a saved index and its BM25 parameters, checked; with `fingerprint`,
    refuses an index built over other passages, with `engine` one built by another engine.
    An index without an `engine` field was written by rank-bm25 (before bm25s was added)."""
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
    manifest.setdefault("engine", "rank-bm25")
    if manifest["engine"] not in RETRIEVER_ENGINES:
        raise RetrievalError(f"{manifest_path}: field engine is {manifest['engine']!r}, "
                             f"expected one of {list(RETRIEVER_ENGINES)}")
    if engine is not None and manifest["engine"] != engine:
        raise RetrievalError(f"{manifest_path}: built by {manifest['engine']}, not {engine}")
    if fingerprint is not None and manifest.get("passages") != fingerprint:
        raise RetrievalError(f"{manifest_path}: built over other passages (fingerprint "
                             f"{manifest.get('passages')!r}, expected {fingerprint!r})")
    try:
        params = {key: float(manifest[key]) for key in ("k1", "b", "epsilon")}
    except (KeyError, TypeError, ValueError) as error:
        raise RetrievalError(f"{manifest_path}: field {error} missing or not a number"
                             ) from error
    return manifest, params
