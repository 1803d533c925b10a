"""The streaming BM25 build (issue 60): passages read from the corpus one at a time into a
passage store on disk read by offset (`index.store`), Lucene fed from it without a list of all
passages or their tokens, and the in-memory engines refused where they would not fit."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from dil_jax.open_domain.cache.check import texts_fingerprint
from dil_jax.open_domain.index import corpus as corpus_module
from dil_jax.open_domain.index.corpus import (
    CorpusError,
    Document,
    Passage,
    iter_jsonl,
    iter_passages,
    split_documents,
)
from dil_jax.open_domain.index.store import (
    OFFSETS_FILE,
    PASSAGES_FILE,
    PassageStore,
    line_offsets,
    passage_line,
    summarize_passages,
    write_passage_store,
)
from dil_jax.open_domain.retrieval.engines import (
    RetrievalError,
    build_retriever,
    check_engine_fits,
)

from tests.open_domain.test_retrievers import (
    LUCENE_SCORE_RTOL,
    lucene_reference_scores,
    rare_terms_corpus,
    reference_top,
)

# Texts with what JSON escapes or keeps raw: quotes, a newline, U+2028 (a line break for
# str.splitlines, not for a JSONL line), non-ASCII.
AWKWARD = ['He said "hi".\nThen left.', "Zürich \u2028 line separator", "plain", ""]


def _passages(texts: list[str]) -> list[Passage]:
    return [Passage(f"d{i}#0", f"d{i}", f"T{i}", text, 0, len(text))
            for i, text in enumerate(texts)]


def test_the_store_reads_back_every_passage_by_offset(tmp_path):
    passages = _passages(AWKWARD + [f"text {i}" for i in range(50)])
    summary = write_passage_store(iter(passages), tmp_path)  # a one-shot iterator
    assert summary.count == len(passages)
    assert summary.fingerprint == texts_fingerprint([p.text for p in passages])
    assert summary.text_bytes == sum(len(p.text.encode()) for p in passages)
    assert summary == summarize_passages(passages)
    # passages.jsonl holds exactly the lines every index version wrote.
    assert (tmp_path / PASSAGES_FILE).read_bytes() == b"".join(map(passage_line, passages))
    offsets = np.load(tmp_path / OFFSETS_FILE)
    assert offsets.dtype == np.int64 and len(offsets) == len(passages) + 1
    np.testing.assert_array_equal(offsets, line_offsets(tmp_path / PASSAGES_FILE))
    store = PassageStore.open(tmp_path)
    assert len(store) == len(passages) and list(store) == passages
    assert [store[i] for i in (3, 0, 1, -1)] == [passages[i] for i in (3, 0, 1, -1)]
    assert store[2:5] == passages[2:5] and list(store.texts()) == [p.text for p in passages]
    with pytest.raises(IndexError):
        store[len(passages)]


def test_line_offsets_of_a_file_without_a_last_newline(tmp_path):
    path = tmp_path / "lines"
    path.write_bytes(b"ab\n\ncde")
    np.testing.assert_array_equal(line_offsets(path), [0, 3, 4, 7])
    path.write_bytes(b"")
    np.testing.assert_array_equal(line_offsets(path), [0])


def test_a_jsonl_corpus_is_read_a_line_at_a_time(tmp_path):
    """The first document comes before a bad later line is read (read whole, the file
    failed first); the passages are those `split_documents` gives, in order."""
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"id": "a", "text": "alpha beta gamma delta epsilon zeta eta theta"}\n'
                    "not json\n")
    documents = iter_jsonl(path)
    assert next(documents).doc_id == "a"
    with pytest.raises(CorpusError, match=r"corpus.jsonl:2: not valid JSON"):
        next(documents)
    records = [{"id": f"d{i}", "title": f"T{i}",
                "text": f"Paragraph one of {i} is long enough.\n\nParagraph two of {i} is as long."}
               for i in range(5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    expected = split_documents([Document(r["id"], r["title"], r["text"]) for r in records])
    assert list(iter_passages([f"jsonl:{path}"])) == expected
    assert list(iter_passages([f"jsonl:{path}"], limit=2)) == expected[:4]


def test_repeated_id_hashes_are_found_by_a_sort_in_place():
    from dil_jax.open_domain.index.corpus import has_repeats

    values = np.random.default_rng(0).permutation(100_000).astype(np.int64)
    assert not has_repeats(values)
    assert (np.diff(values) > 0).all()  # sorted in place: no copy of the ids' hashes
    values[-1] = values[0]
    assert has_repeats(values)
    assert not has_repeats(np.zeros(0, np.int64)) and not has_repeats(np.ones(1, np.int64))


def test_duplicate_ids_are_found_by_hash_and_named_by_line(tmp_path, monkeypatch):
    """Every id hashes alike here: distinct ids still pass (the file is reread to compare the
    ids themselves), a repeated one is named with its line; past --corpus-limit it is not
    read."""
    monkeypatch.setattr(corpus_module, "_id_hash", lambda doc_id: 0)
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": "x"}) + "\n" for i in "abcb"))
    with pytest.raises(CorpusError, match=r"corpus.jsonl:4: duplicate id 'b'"):
        list(iter_jsonl(path))
    assert [d.doc_id for d in iter_jsonl(path, limit=3)] == ["a", "b", "c"]
    monkeypatch.undo()  # real hashes: the repeated id is found all the same
    with pytest.raises(CorpusError, match=r"corpus.jsonl:4: duplicate id 'b'"):
        list(iter_jsonl(path))


def _python_peak(texts) -> int:
    """Peak bytes Python allocated while Lucene indexed `texts` (the JVM's heap is not
    Python's: this is what a list of the corpus or its tokens would show up in)."""
    tracemalloc.start()
    try:
        build_retriever(texts, "pyserini")
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_lucene_is_fed_a_stream_not_a_list():
    """Python's peak while indexing 10x more passages stays put: nothing per passage is kept
    (before, a list of every passage's tokens was built first, and a generator was refused)."""
    def corpus(n: int):
        return (f"passage {i} about term{i % 97} and term{i % 13} with filler words"
                for i in range(n))

    build_retriever(corpus(100), "pyserini")  # the JVM started and its classes loaded, untraced
    small, large = _python_peak(corpus(400)), _python_peak(corpus(4_000))
    assert large < 1.5 * small + 200_000, (small, large)


@pytest.mark.parametrize("threads", [1, 2])
def test_lucene_streamed_scores_equal_the_formula_by_hand(threads, tmp_path):
    """From a one-shot stream, with one or two writing threads: the document number is still
    the passage index (checked on open) and the scores are Lucene's BM25 by hand."""
    from dil_jax.open_domain.retrieval.engines import bm25_tokenize
    from dil_jax.open_domain.retrieval.lucene import LuceneRetriever, write_lucene_index

    texts = rare_terms_corpus() * 20  # 1,200 passages: several batches per thread
    count = write_lucene_index((bm25_tokenize(t) for t in texts), tmp_path, 1.5, 0.75,
                               threads=threads)
    assert count == len(texts)
    retriever = LuceneRetriever(tmp_path, count, dict(k1=1.5, b=0.75, epsilon=0.25))
    for query in ("term1 term2 term2", "term299 term7", "term5"):
        expected = lucene_reference_scores(texts, query)
        hits = retriever.search(query, 30)
        assert [h.passage_index for h in hits] == reference_top(expected, 30), query
        np.testing.assert_allclose([h.score for h in hits],
                                   expected[[h.passage_index for h in hits]],
                                   rtol=LUCENE_SCORE_RTOL)
    reader = retriever._reader
    stored = [reader.document(d).getField("passage").numericValue().longValue()
              for d in range(0, count, 97)]
    assert stored == list(range(0, count, 97))


def test_lucene_scores_do_not_depend_on_the_ram_buffer(tmp_path, monkeypatch):
    """A RAM buffer small enough to flush many segments (merged into one at the end) gives the
    same hits and scores as the default one, which holds these passages in one segment."""
    from dil_jax.open_domain.retrieval.engines import bm25_tokenize
    from dil_jax.open_domain.retrieval.lucene import LuceneRetriever, write_lucene_index

    texts = rare_terms_corpus() * 20
    hits = {}
    for name, buffer in (("default", None), ("small", "0.05")):
        if buffer is not None:
            monkeypatch.setenv("DIL_JAX_LUCENE_RAM_BUFFER_MB", buffer)
        count = write_lucene_index((bm25_tokenize(t) for t in texts), tmp_path / name, 1.5,
                                   0.75)
        (segment,) = [f.stem for f in (tmp_path / name).iterdir() if f.suffix == ".si"]
        # One segment in the end, named by Lucene's counter (base 36) of segments written:
        # _0 flushed and _1 its final merge, or many flushed before.
        assert (int(segment[1:], 36) > 1) == (buffer is not None), segment
        retriever = LuceneRetriever(tmp_path / name, count, dict(k1=1.5, b=0.75, epsilon=0.25))
        hits[name] = [retriever.search(q, 30) for q in ("term1 term2 term2", "term299 term7")]
    assert hits["small"] == hits["default"]


def test_zero_passages_are_refused_by_lucene():
    with pytest.raises(RetrievalError, match="zero passages"):
        build_retriever(iter([]), "pyserini")


def test_in_memory_engines_are_refused_past_the_memory_they_need():
    mib = 2**20
    check_engine_fits("bm25s", 1000, 100 * mib, available=10_000 * mib)
    check_engine_fits("pyserini", 10**9, 10**12, available=1)  # Lucene streams: always fits
    with pytest.raises(RetrievalError) as refused:
        check_engine_fits("rank-bm25", 1_000_000, 700 * mib, available=4 * 2**30)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("--retriever rank-bm25: ")
    assert "1,000,000 passages" in message and "700 MiB of text" in message
    assert "4.0 GiB available" in message and "--retriever pyserini" in message


def test_an_index_keeps_its_passages_on_disk_and_opens_without_offsets(tmp_path, tokenizer):
    """`build_index` streams the passages into the store and `open_index` reads them by
    offset; an index written before the offsets file (the same passages.jsonl, no offsets,
    no record of them) opens with the same passages; a changed offsets file is refused."""
    from dil_jax.open_domain.index.files import IndexBrokenError
    from dil_jax.open_domain.index.folder import build_index, open_index

    passages = _passages(AWKWARD[:3] + [f"Passage {i} about topic {i % 3}." for i in range(20)])
    folder = tmp_path / "index"
    built = build_index(folder, iter(passages), tokenizer, max_passage_len=32, doc_stride=16,
                        split={"strategy": "paragraphs"}, retriever="pyserini")
    assert isinstance(built.passages, PassageStore) and list(built.passages) == passages
    settings = json.loads((folder / "index.json").read_text())
    assert OFFSETS_FILE in settings["files"]
    assert settings["passages"] == texts_fingerprint([p.text for p in passages])
    hits = built.retriever.search("topic 2", 5)
    assert hits and all(built.passages[h.passage_index].text.endswith("topic 2.")
                        for h in hits)

    (folder / OFFSETS_FILE).unlink()
    del settings["files"][OFFSETS_FILE]
    (folder / "index.json").write_text(json.dumps(settings))
    before = open_index(folder)
    assert [before.passages[i] for i in range(len(passages))] == passages
    assert before.retriever.search("topic 2", 5) == hits

    np.save(folder / OFFSETS_FILE, np.arange(len(passages) + 1))
    settings["files"][OFFSETS_FILE] = {"bytes": 1, "sha256": "0"}
    (folder / "index.json").write_text(json.dumps(settings))
    with pytest.raises(IndexBrokenError, match=OFFSETS_FILE.replace(".", r"\.")):
        open_index(folder)


def test_the_java_heap_cap_is_a_java_size(monkeypatch):
    from dil_jax.open_domain.retrieval.lucene import JAVA_HEAP, java_heap

    monkeypatch.delenv("DIL_JAX_JAVA_HEAP", raising=False)
    assert java_heap() == JAVA_HEAP
    monkeypatch.setenv("DIL_JAX_JAVA_HEAP", "1536m")
    assert java_heap() == "1536m"
    monkeypatch.setenv("DIL_JAX_JAVA_HEAP", "lots")
    with pytest.raises(RetrievalError, match=r"DIL_JAX_JAVA_HEAP='lots': expected a Java heap"):
        java_heap()


def test_java_options_fix_the_heap_the_collector_and_take_extra_options():
    from dil_jax.open_domain.retrieval.lucene import java_options, java_size_bytes

    assert java_options({}) == ["-Xms128m", "-Xmx128m", "-XX:+UseSerialGC"]
    assert java_options({"DIL_JAX_JAVA_HEAP": "1g", "DIL_JAX_LUCENE_RAM_BUFFER_MB": "256",
                         "DIL_JAX_JAVA_OPTIONS": "-XX:+AlwaysPreTouch '-Dname=a b'"}) == [
        "-Xms1g", "-Xmx1g", "-XX:+UseSerialGC", "-XX:+AlwaysPreTouch", "-Dname=a b"]
    assert [java_size_bytes(size) for size in ("65536", "4096k", "128m", "2G")] == [
        65536, 4 * 2**20, 128 * 2**20, 2 * 2**30]


@pytest.mark.parametrize("environ, message", [
    ({"DIL_JAX_JAVA_HEAP": "48m"},
     r"DIL_JAX_JAVA_HEAP=48m cannot hold 2 x DIL_JAX_LUCENE_RAM_BUFFER_MB=32: give a heap of "
     r"at least 64m"),
    ({"DIL_JAX_JAVA_HEAP": "1g", "DIL_JAX_LUCENE_RAM_BUFFER_MB": "600"},
     r"DIL_JAX_JAVA_HEAP=1g cannot hold 2 x DIL_JAX_LUCENE_RAM_BUFFER_MB=600"),
    ({"DIL_JAX_LUCENE_RAM_BUFFER_MB": "0"}, r"DIL_JAX_LUCENE_RAM_BUFFER_MB='0': expected"),
    ({"DIL_JAX_LUCENE_RAM_BUFFER_MB": "lots"}, r"DIL_JAX_LUCENE_RAM_BUFFER_MB='lots'"),
    ({"DIL_JAX_LUCENE_RAM_BUFFER_MB": "inf"}, r"DIL_JAX_LUCENE_RAM_BUFFER_MB='inf'"),
    ({"DIL_JAX_JAVA_OPTIONS": "-Dname='a b"}, r"DIL_JAX_JAVA_OPTIONS=.*quotation"),
])
def test_java_options_refuse_a_heap_or_buffer_that_cannot_work(environ, message):
    from dil_jax.open_domain.retrieval.lucene import java_options

    with pytest.raises(RetrievalError, match=message):
        java_options(environ)


def _run_python(code: str, **environ: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter (the JVM starts once per process, with the options of
    that process's first start)."""
    from tests.helpers import REPO, subprocess_env

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=subprocess_env(PYTHONPATH=str(REPO),
                                                                    **environ))


_STARTED_JVM = """
import json
from dil_jax.open_domain.retrieval.lucene import lucene, running_java_max_heap
lucene()  # before anything imports jnius, which starts the JVM
from jnius import autoclass
beans = autoclass("java.lang.management.ManagementFactory").getGarbageCollectorMXBeans()
print(json.dumps(dict(max_heap=running_java_max_heap(),
                      collectors=[bean.getName() for bean in beans.toArray()])))
"""


def test_the_started_jvm_has_the_heap_and_collector_asked_for():
    """Read back from the running JVM (its MaxHeapSize flag, its collectors' names), not from
    the options this code passed."""
    done = _run_python(_STARTED_JVM, DIL_JAX_JAVA_HEAP="96m")
    assert done.returncode == 0, done.stderr
    started = json.loads(done.stdout.splitlines()[-1])
    assert started == dict(max_heap=96 * 2**20, collectors=["Copy", "MarkSweepCompact"])


def test_a_jvm_started_before_the_engine_is_warned_about():
    """pyjnius cannot change a running JVM's options: a JVM started by an earlier `import
    jnius` gets a RuntimeWarning naming what does not apply (not a silent default heap)."""
    from dil_jax.open_domain.retrieval.lucene import missing_java_options

    assert missing_java_options(["-Xmx1g", "-XX:+UseSerialGC"], ["-XX:+UseSerialGC"]) == [
        "-Xmx1g"]
    done = _run_python("import jnius\n"
                       "from dil_jax.open_domain.retrieval.lucene import lucene\n"
                       "try:\n    lucene()\nexcept Exception:\n    pass\n")
    assert "RuntimeWarning: the JVM was started before dil_jax's Lucene engine" in done.stderr
    assert "without -Xms128m -Xmx128m -XX:+UseSerialGC: DIL_JAX_JAVA_HEAP" in done.stderr


def test_index_refuses_an_engine_that_would_not_fit_before_building(tmp_path, capsys,
                                                                     monkeypatch):
    """`dil-jax index --retriever bm25s` over a corpus whose estimate exceeds the memory
    available: one line naming the flag, the numbers and --retriever pyserini, exit status 1,
    no index written."""
    from dil_jax.open_domain.retrieval import engines

    from tests.helpers import run_cli

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "text": f"Passage {i} is long "
                                          "enough to be one."}) + "\n" for i in range(30)))
    monkeypatch.setattr(engines, "available_memory", lambda: 1000)
    out = tmp_path / "index"
    status, _, err = run_cli(["index", "--out", str(out), "--corpus", f"jsonl:{corpus}",
                              "--k", "0", "--retriever", "bm25s", "--max-passage-len", "32",
                              "--doc-stride", "16", "--max-question-len", "16"], capsys)
    assert status == 1 and "Traceback" not in err
    (line,) = [line for line in err.splitlines() if ": error: " in line]
    assert "--retriever bm25s: building it over 30 passages" in line
    assert "--retriever pyserini" in line
    assert not (out / "index.json").exists() and not (out / "passages.jsonl").exists()
