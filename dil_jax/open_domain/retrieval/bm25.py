"""What every BM25 engine shares (`retrieval.engines` and `retrieval.lucene`): the tokens, the
hit, the retriever interface and the engines' base class, the ranking rule, the index manifest
and its errors."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from dil_jax.atomic import staged_directory
from dil_jax.defaults import RETRIEVER_ENGINES
from dil_jax.errors import DilJaxError

_TOKEN = re.compile(r"\w+", re.UNICODE)
# A small English stop list: BM25 idf already discounts common words, this only keeps the
# query rows short (and matches what retrieval papers on SQuAD typically drop).
STOPWORDS = frozenset(
    "a an the of in on at to for from by with and or but is are was were be been being it its "
    "this that these those as do does did what which who whom whose when where why how".split())

INDEX_FORMAT = "dil_jax.bm25/1"
MANIFEST_FILE = "manifest.json"
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
    params: dict[str, float]  # k1, b, epsilon

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

    def attainable(self, query: str) -> float:
        """The score a passage holding every query term, each saturated, would get
        (`attainable_score`), on this engine's scale and from its own statistics."""
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


def okapi_idf(df: np.ndarray, num_passages: int, epsilon: float, mean_idf: float
              ) -> np.ndarray:
    """rank-bm25's BM25Okapi idf of terms held by `df` passages: ln((N - n + 0.5) / (n + 0.5)),
    a negative one replaced by epsilon x `mean_idf` (the mean raw idf over the vocabulary)."""
    raw = np.log(num_passages - df + 0.5) - np.log(df + 0.5)
    return np.where(raw < 0, epsilon * mean_idf, raw)


def robertson_idf(df: np.ndarray, num_passages: int) -> np.ndarray:
    """bm25s's Robertson idf: ln((N - n + 0.5) / (n + 0.5)) floored at 0."""
    return np.log(np.maximum((num_passages - df + 0.5) / (df + 0.5), 1.0))


def lucene_idf(df: np.ndarray, num_passages: int) -> np.ndarray:
    """Lucene's BM25 idf: ln(1 + (N - n + 0.5) / (n + 0.5))."""
    return np.log1p((num_passages - df + 0.5) / (df + 0.5))


def attainable_score(idf: np.ndarray, k1: float) -> float:
    """What a passage would score against a query whose terms (one idf each, a repeated term
    once per occurrence, as the engines score it) it all holds, each saturated: the
    term-frequency part tf (k1 + 1) / (tf + k1 (1 - b + b dl / avgdl)) tends to k1 + 1, so
    the sum of idf x (k1 + 1). Every passage's BM25 score against the query is below it.
    A term no passage holds has n = 0, the largest idf: a question whose rare words the
    corpus lacks can attain much more than any passage gets."""
    return float(np.sum(idf) * (k1 + 1))


@dataclasses.dataclass(frozen=True)
class Bm25Manifest:
    """A saved BM25 index's manifest.json: which engine wrote it, over how many passages and
    which (their fingerprint, "" when saved without one), with which BM25 parameters."""

    engine: str
    num_passages: int
    passages: str
    k1: float
    b: float
    epsilon: float

    @classmethod
    def of(cls, retriever: Retriever, fingerprint: str) -> Bm25Manifest:
        """The manifest of a built `retriever` over passages of this `fingerprint`."""
        return cls(retriever.engine, retriever.num_passages, fingerprint, **retriever.params)

    @property
    def params(self) -> dict[str, float]:
        """The BM25 parameters, as an engine's `params`."""
        return dict(k1=self.k1, b=self.b, epsilon=self.epsilon)

    def to_json(self) -> dict[str, Any]:
        return dict(format=INDEX_FORMAT, engine=self.engine, num_passages=self.num_passages,
                    passages=self.passages, **self.params)

    @classmethod
    def from_json(cls, value: Any, path: Path) -> Bm25Manifest:
        """The manifest of a parsed JSON value (RetrievalError naming `path` and the field). A
        manifest without an `engine` field was written by rank-bm25 (before bm25s was
        added)."""
        if not isinstance(value, dict):
            raise RetrievalError(f"{path}: expected a JSON object")
        if value.get("format") != INDEX_FORMAT:
            raise RetrievalError(f"{path}: format {value.get('format')!r}, expected "
                                 f"{INDEX_FORMAT!r}")
        engine = value.get("engine", "rank-bm25")
        if engine not in RETRIEVER_ENGINES:
            raise RetrievalError(f"{path}: field engine is {engine!r}, expected one of "
                                 f"{list(RETRIEVER_ENGINES)}")
        try:
            numbers = {key: float(value[key]) for key in ("k1", "b", "epsilon")}
            num_passages = int(value["num_passages"])
        except (KeyError, TypeError, ValueError) as error:
            raise RetrievalError(f"{path}: field {error} missing or not a number") from error
        return cls(engine=engine, num_passages=num_passages,
                   passages=str(value.get("passages", "")), **numbers)

    @classmethod
    def read(cls, directory: Path, fingerprint: str | None = None,
             engine: str | None = None) -> Bm25Manifest:
        """The manifest of the index saved in `directory`; with `fingerprint`, refuses an index
        built over other passages, with `engine` one built by another engine."""
        return cls.from_json(*_manifest_json(directory))._checked(
            directory / MANIFEST_FILE, fingerprint, engine)

    def _checked(self, path: Path, fingerprint: str | None, engine: str | None
                 ) -> Bm25Manifest:
        if engine is not None and self.engine != engine:
            raise RetrievalError(f"{path}: built by {self.engine}, not {engine}")
        if fingerprint is not None and self.passages != fingerprint:
            raise RetrievalError(f"{path}: built over other passages (fingerprint "
                                 f"{self.passages!r}, expected {fingerprint!r})")
        return self


class Bm25Engine:
    """What the engine classes share: `num_passages`, `search_batch` (`search` of each query),
    `save` (the engine's own files, `_write_files`, then manifest.json, in a staging folder
    renamed into place) and `load` (the manifest read and checked, then the engine's files,
    `_open`)."""

    engine: str
    manifest_type: type[Bm25Manifest] = Bm25Manifest  # its manifest.json, as `load` reads it
    _num_passages: int

    @property
    def num_passages(self) -> int:
        return self._num_passages

    def search_batch(self, queries: Sequence[str], top_p: int) -> list[list[Hit]]:
        return [self.search(query, top_p) for query in queries]

    def attainable(self, query: str) -> float:
        """`attainable_score` of the query's terms (`bm25_tokenize`, repeats kept), from this
        index's document frequencies and the engine's own idf (`_idf`)."""
        terms = bm25_tokenize(query)
        if not terms:
            return 0.0
        df = np.asarray(self.document_frequencies(terms), np.float64)
        return attainable_score(self._idf(df), self.params["k1"])

    def document_frequencies(self, terms: Sequence[str]) -> list[int]:
        """How many passages hold each term (0 for a term the index does not know)."""
        raise NotImplementedError

    def _idf(self, df: np.ndarray) -> np.ndarray:
        """The engine's idf of terms held by `df` passages."""
        raise NotImplementedError

    def save(self, directory: str | os.PathLike, fingerprint: str = "") -> Path:
        """Writes the index to `directory` atomically (staging folder, then rename)."""
        directory = Path(directory).absolute()
        with staged_directory(directory) as staging:
            write_manifest(staging, self._write_files(staging, fingerprint))
        return directory

    def _write_files(self, staging: Path, fingerprint: str) -> Bm25Manifest:
        """Writes the engine's index files into `staging`; returns the manifest to write
        beside them (over passages of this `fingerprint`)."""
        raise NotImplementedError

    @classmethod
    def load(cls, directory: str | os.PathLike, fingerprint: str | None = None) -> Bm25Engine:
        """Opens the index saved in `directory`: refused (RetrievalError) unless its manifest
        names this engine and, with `fingerprint`, these passages."""
        directory = Path(directory)
        return cls._open(directory, cls.manifest_type.read(directory, fingerprint, cls.engine))

    @classmethod
    def _open(cls, directory: Path, manifest: Bm25Manifest) -> Bm25Engine:
        """The engine over the index files in `directory`, checked against its `manifest`."""
        raise NotImplementedError


def check_files_present(directory: Path, names: Sequence[str]) -> None:
    """RetrievalError naming the first of the index files `names` missing from `directory`."""
    for name in names:
        if not (directory / name).is_file():
            raise RetrievalError(f"{directory / name}: missing")


def _manifest_json(directory: Path) -> tuple[Any, Path]:
    """(the parsed manifest.json of the index in `directory`, its path); RetrievalError when
    it is missing or not JSON."""
    path = directory / MANIFEST_FILE
    if not path.is_file():
        raise RetrievalError(f"{directory}: not a BM25 index (no {MANIFEST_FILE})")
    try:
        return json.loads(path.read_text(encoding="utf-8")), path
    except (OSError, ValueError) as error:
        raise RetrievalError(f"{path}: not readable JSON ({error})") from error


def write_manifest(directory: Path, manifest: Bm25Manifest) -> None:
    """Writes the manifest.json of an index being saved (into its staging folder)."""
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest.to_json(), indent=2))
