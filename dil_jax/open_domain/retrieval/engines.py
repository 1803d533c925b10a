"""BM25 retrieval behind one retriever interface, with the index persisted to disk.

Three engines, chosen by name (`RETRIEVER_ENGINES`) and recorded in the index's manifest:

- `rank-bm25`: rank-bm25's `BM25Okapi` (the design card's choice): its term statistics (idf
  with the epsilon floor, document lengths, k1, b) are computed by rank-bm25 itself at build
  time. Its `get_scores` loops over every document in Python per query term, too slow for
  thousands of questions, so the per-(term, passage) BM25 weights are laid out once in a sparse
  term x passage matrix: a query's scores are the sum of its terms' rows, numerically the same
  as `BM25Okapi.get_scores` (tested). Its build holds per-document Python dicts: for small
  corpora.
- `bm25s`: the `bm25s` package (sparse matrices built without per-document Python objects,
  saved as .npy files and memory-mapped on load), for large corpora.
- `pyserini`: Lucene, the DilBert paper's retriever (`retrieval/lucene.py`, which states how
  its BM25 differs), an optional extra that needs Java.

Both see the same tokens (`bm25_tokenize`) and the same k1 and b. bm25s runs the Robertson
variant, which is BM25Okapi's formula but for two things (docs/open_domain.md, "Retrievers"):
its term-frequency part lacks the constant factor (k1 + 1), which this module multiplies back so
the two engines' scores are on one scale; and a term held by more than half of the passages
(raw idf below 0) gets idf 0 where rank-bm25 gives it epsilon x the mean idf. Scores of queries
without such terms agree to float32 rounding (bm25s stores float32); otherwise each occurrence
of such a term in the query moves a passage's score by at most epsilon x mean idf x (k1 + 1),
and bm25s does not return passages that share only such terms with the query.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import scipy.sparse

from dil_jax.defaults import AUTO_BM25S_FROM, RETRIEVER_ENGINES
from dil_jax.open_domain.retrieval.bm25 import (  # noqa: F401  (re-exported: the engines' shared names)
    EMPTY_PASSAGE_TOKEN,
    INDEX_FORMAT,
    STOPWORDS,
    Bm25Engine,
    Bm25Manifest,
    Hit,
    RetrievalError,
    Retriever,
    best_first,
    bm25_tokenize,
    check_files_present,
    check_top_p,
    okapi_idf,
    robertson_idf,
    tokenized_passages,
    write_manifest,
)

# Index files of each engine beside manifest.json (what index.json checks on open).
ENGINE_FILES = {
    "rank-bm25": ("weights.npz", "vocabulary.json"),
    "bm25s": ("data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy",
              "vocab.index.json", "params.index.json"),
}


class RankBM25Retriever(Bm25Engine):
    """BM25 (Okapi, rank-bm25's statistics) over a fixed list of passage texts.

    Attributes:
      weights: [num_terms, num_passages] CSR matrix of BM25 term weights.
      vocabulary: term -> row of `weights`.
    """

    engine = "rank-bm25"

    def __init__(self, weights: scipy.sparse.csr_matrix, vocabulary: dict[str, int],
                 params: dict[str, float]):
        self.weights = weights.tocsr()
        self.vocabulary = vocabulary
        self.params = params
        self._num_passages = self.weights.shape[1]

    @classmethod
    def build(cls, texts: Sequence[str], k1: float = 1.5, b: float = 0.75,
              epsilon: float = 0.25) -> RankBM25Retriever:
        from rank_bm25 import BM25Okapi

        tokenized = tokenized_passages(texts)
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

    def document_frequencies(self, terms: Sequence[str]) -> list[int]:
        # A term's row stores an entry for each passage holding it (a zero weight included).
        counts = np.diff(self.weights.indptr)
        return [int(counts[self.vocabulary[t]]) if t in self.vocabulary else 0 for t in terms]

    @functools.cached_property
    def _mean_idf(self) -> float:
        """rank-bm25's `average_idf`: the mean raw idf over the vocabulary."""
        df = np.diff(self.weights.indptr).astype(np.float64)
        return float(np.mean(np.log(self.num_passages - df + 0.5) - np.log(df + 0.5)))

    def _idf(self, df: np.ndarray) -> np.ndarray:
        return okapi_idf(df, self.num_passages, self.params["epsilon"], self._mean_idf)

    def search(self, query: str, top_p: int) -> list[Hit]:
        """The best `top_p` passages among those sharing a term with the query, best first:
        fewer when fewer match, none when no query term is in the index (a passage that shares
        no word with the question scores 0 and is not an answer source)."""
        check_top_p(top_p)
        matched = self.matching(query)
        if not len(matched):
            return []
        return best_first(matched, self.scores(query)[matched], top_p)

    def _write_files(self, staging: Path, fingerprint: str) -> Bm25Manifest:
        scipy.sparse.save_npz(staging / "weights.npz", self.weights)
        (staging / "vocabulary.json").write_text(json.dumps(self.vocabulary))
        return Bm25Manifest.of(self, fingerprint)

    @classmethod
    def _open(cls, directory: Path, manifest: Bm25Manifest) -> RankBM25Retriever:
        try:
            weights = scipy.sparse.load_npz(directory / "weights.npz")
        except (OSError, ValueError, KeyError, EOFError) as error:
            raise RetrievalError(f"{directory / 'weights.npz'}: unreadable ({error})") from error
        try:
            vocabulary = json.loads((directory / "vocabulary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise RetrievalError(f"{directory / 'vocabulary.json'}: unreadable ({error})"
                                 ) from error
        if not isinstance(vocabulary, dict) or weights.shape[0] != len(vocabulary) or \
                weights.shape[1] != manifest.num_passages:
            raise RetrievalError(f"{directory}: weights.npz {weights.shape}, vocabulary.json and "
                                 f"manifest.json (num_passages {manifest.num_passages}) "
                                 "disagree")
        return cls(weights, vocabulary, manifest.params)


class BM25sRetriever(Bm25Engine):
    """BM25 through the `bm25s` package (Robertson variant, scores rescaled by k1 + 1 to
    rank-bm25's scale; the module docstring states where the two differ)."""

    engine = "bm25s"

    def __init__(self, model, num_passages: int, params: dict[str, float]):
        self.model = model  # a bm25s.BM25, its matrices memory-mapped when loaded
        self._num_passages = num_passages
        self.params = params

    @classmethod
    def build(cls, texts: Sequence[str], k1: float = 1.5, b: float = 0.75,
              epsilon: float = 0.25) -> BM25sRetriever:
        """epsilon: kept in the manifest for the record; bm25s floors idf at 0 instead."""
        import bm25s

        model = bm25s.BM25(k1=k1, b=b, method="robertson")
        model.index(tokenized_passages(texts),
                    show_progress=False)
        return cls(model, len(texts), dict(k1=k1, b=b, epsilon=epsilon))

    def search(self, query: str, top_p: int) -> list[Hit]:
        """As `RankBM25Retriever.search`: the best `top_p` passages scoring above 0 (ties by
        passage index, as there)."""
        check_top_p(top_p)
        tokens = [t for t in bm25_tokenize(query) if t in self.model.vocab_dict]
        if not tokens:
            return []
        # bm25s's `retrieve` orders equal scores its own way; its dense scores let ties be
        # broken as the other engine breaks them.
        scores = np.asarray(self.model.get_scores(tokens), np.float64) * (self.params["k1"] + 1)
        positive = np.flatnonzero(scores > 0)
        return best_first(positive, scores[positive], top_p)

    def document_frequencies(self, terms: Sequence[str]) -> list[int]:
        # The score matrix's column of a token stores an entry for each passage holding it
        # (a zero score, idf 0, included).
        indptr = self.model.scores["indptr"]
        ids = self.model.vocab_dict
        return [int(indptr[ids[t] + 1] - indptr[ids[t]]) if t in ids else 0 for t in terms]

    def _idf(self, df: np.ndarray) -> np.ndarray:
        return robertson_idf(df, self.num_passages)

    def _write_files(self, staging: Path, fingerprint: str) -> Bm25Manifest:
        self.model.save(str(staging))
        return Bm25Manifest.of(self, fingerprint)

    @classmethod
    def _open(cls, directory: Path, manifest: Bm25Manifest) -> BM25sRetriever:
        """Its score matrix memory-mapped (not read into memory)."""
        import bm25s

        check_files_present(directory, ENGINE_FILES[cls.engine])
        try:
            model = bm25s.BM25.load(str(directory), mmap=True)
        except (OSError, ValueError, KeyError, EOFError) as error:
            raise RetrievalError(f"{directory}: bm25s index unreadable ({error})") from error
        if model.scores.get("num_docs") != manifest.num_passages:
            raise RetrievalError(f"{directory}: the bm25s index holds "
                                 f"{model.scores.get('num_docs')} passages, manifest.json says "
                                 f"{manifest.num_passages}")
        return cls(model, manifest.num_passages, manifest.params)


def retriever_class(engine: str) -> type:
    """The class of an engine (one of RETRIEVER_ENGINES); Lucene's module is imported only
    when asked for (it starts a JVM)."""
    if engine == "rank-bm25":
        return RankBM25Retriever
    if engine == "bm25s":
        return BM25sRetriever
    if engine == "pyserini":
        from dil_jax.open_domain.retrieval.lucene import LuceneRetriever

        return LuceneRetriever
    raise RetrievalError(f"unknown retriever {engine!r}; expected one of "
                         f"{list(RETRIEVER_ENGINES)}")


# The Python package each engine imports, and how to install it.
ENGINE_PACKAGES = {"rank-bm25": ("rank_bm25", "pip install rank-bm25"),
                   "bm25s": ("bm25s", "pip install bm25s")}


def check_engine_available(engine: str) -> None:
    """Refuses (RetrievalError naming the install) an engine this environment cannot run:
    its package not importable, or for pyserini, no working Java >= 11
    (`retrieval.lucene.check_java`). Cheap; run before a build touches the index, so a missing
    engine costs nothing built."""
    if engine == "pyserini":
        from dil_jax.open_domain.retrieval.lucene import check_java

        check_java()
        return
    if engine not in ENGINE_PACKAGES:
        raise RetrievalError(f"unknown retriever {engine!r}; expected one of "
                             f"{list(RETRIEVER_ENGINES)}")
    module, install = ENGINE_PACKAGES[engine]
    try:
        importlib.import_module(module)
    except ImportError as error:
        raise RetrievalError(f"the {engine} retriever needs the {module} package, which does "
                             f"not import ({error}): {install}") from error


def build_retriever(texts: Iterable[str], engine: str) -> Retriever:
    """A BM25 index over `texts` with this engine (one of RETRIEVER_ENGINES). Lucene reads
    them as a stream (one text in memory at a time: give it `PassageStore.texts()`); the
    other two engines are built from a list of them all (`check_engine_fits` bounds it)."""
    if engine == "pyserini":
        return retriever_class(engine).build(texts)
    return retriever_class(engine).build(texts if isinstance(texts, Sequence) else list(texts))


# Peak memory of building rank-bm25 and bm25s, per byte of passage text (UTF-8), the texts
# included: measured by benchmarks/bm25_build_memory.py over tools/make_scale_corpus.py's
# 100-word passages (docs/open_domain.md, "Retrievers": the record and its machine). Both build
# from every passage's tokens in Python lists, so their memory grows with the corpus.
BUILD_BYTES_PER_TEXT_BYTE = {"rank-bm25": 20.0, "bm25s": 12.5}


def available_memory() -> int:
    """Bytes of memory available to a new allocation now (/proc/meminfo's MemAvailable; the
    machine's physical memory where there is no /proc)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_engine_fits(engine: str, num_passages: int, text_bytes: int,
                      available: int | None = None) -> None:
    """Refuses (RetrievalError, one line naming --retriever and the numbers) building the
    in-memory engine `engine` over passages of `text_bytes` bytes of text when its estimated
    peak (BUILD_BYTES_PER_TEXT_BYTE) exceeds the `available` memory (`available_memory()`):
    better refused before anything is built than killed by the kernel part-way. Lucene
    (pyserini) streams, so it always fits."""
    if engine not in BUILD_BYTES_PER_TEXT_BYTE:
        return
    needed = BUILD_BYTES_PER_TEXT_BYTE[engine] * text_bytes
    available = available_memory() if available is None else available
    if needed > available:
        raise RetrievalError(
            f"--retriever {engine}: building it over {num_passages:,} passages "
            f"({text_bytes / 2**20:,.0f} MiB of text) needs about {needed / 2**30:,.1f} GiB "
            f"of memory ({BUILD_BYTES_PER_TEXT_BYTE[engine]:g} bytes per byte of text), more "
            f"than the {available / 2**30:,.1f} GiB available; use --retriever pyserini, which "
            "streams the corpus (docs/open_domain.md, \"Retrievers\")")


def resolve_engine(engine: str, num_passages: int) -> str:
    """The engine to build with: `engine` itself, or for "auto" bm25s from AUTO_BM25S_FROM
    passages on and rank-bm25 below."""
    if engine == "auto":
        return "bm25s" if num_passages >= AUTO_BM25S_FROM else "rank-bm25"
    if engine not in RETRIEVER_ENGINES:
        raise RetrievalError(f"unknown retriever {engine!r}; expected auto or one of "
                             f"{list(RETRIEVER_ENGINES)}")
    return engine


def load_retriever(directory: str | os.PathLike, fingerprint: str | None = None) -> Retriever:
    """Opens a saved index with the engine its manifest names, after checking that engine can
    run here (its package; for Lucene, a Java >= 11), so a missing one is named with its
    install hint instead of failing inside the engine."""
    engine = Bm25Manifest.read(Path(directory), fingerprint).engine
    check_engine_available(engine)
    return retriever_class(engine).load(directory, fingerprint)


def index_files(directory: str | os.PathLike) -> tuple[str, ...]:
    """The files of the saved index in `directory` (manifest.json first): fixed per engine,
    or for Lucene, whose file names vary, those its manifest lists."""
    directory = Path(directory)
    engine = Bm25Manifest.read(directory).engine
    if engine in ENGINE_FILES:
        return ("manifest.json",) + ENGINE_FILES[engine]
    from dil_jax.open_domain.retrieval.lucene import LuceneManifest

    return ("manifest.json",) + LuceneManifest.read(directory).lucene_files
