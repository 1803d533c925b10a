"""The BM25 engines behind `Retriever`: each against rank-bm25's own `get_scores` (Lucene's,
whose BM25 differs, against its own formula by hand, and where it must agree with rank-bm25),
by hand, and through an index on disk (`dil-jax index --retriever`)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dil_jax.defaults import AUTO_BM25S_FROM, RETRIEVER_ENGINES
from dil_jax.open_domain.retrieval.engines import (
    BM25sRetriever,
    RankBM25Retriever,
    RetrievalError,
    bm25_tokenize,
    build_retriever,
    load_retriever,
    resolve_engine,
)

# bm25s stores float32 weights: each is idf x tf / (tf + k1 (1 - b + b dl / avgdl)), about six
# float32 operations of relative error <= 2^-24 each, and a test query sums at most three terms
# (all positive): 2e-6 relative bounds the difference to rank-bm25's float64 scores.
FLOAT32_SCORE_RTOL = 2e-6
K1, EPSILON = 1.5, 0.25


def rare_terms_corpus(seed: int = 0) -> list[str]:
    """60 passages over 300 terms, each held by fewer than half the passages (so the two
    engines' idf agree: no idf floor applies)."""
    rng = np.random.default_rng(seed)
    vocab = [f"term{i}" for i in range(300)]
    return [" ".join(rng.choice(vocab, rng.integers(3, 12))) for _ in range(60)]


def reference_top(scores: np.ndarray, top_p: int) -> list[int]:
    """Indices of the top_p positive scores, score descending then index ascending."""
    positive = np.flatnonzero(scores > 0)
    order = positive[np.lexsort((positive, -scores[positive]))]
    return [int(i) for i in order[:top_p]]


@pytest.mark.parametrize("engine", ["rank-bm25", "bm25s"])
def test_top_p_and_scores_equal_rank_bm25_get_scores(engine):
    from rank_bm25 import BM25Okapi

    texts = rare_terms_corpus()
    reference = BM25Okapi([bm25_tokenize(t) for t in texts], k1=K1, b=0.75, epsilon=EPSILON)
    assert min(reference.idf.values()) > 0  # the premise: no term in half the passages
    retriever = build_retriever(texts, engine)
    rtol = FLOAT32_SCORE_RTOL if engine == "bm25s" else 1e-12
    for query in ("term1 term2 term2", "term299 term7", "term5", "nothing here"):
        expected = reference.get_scores(bm25_tokenize(query))
        hits = retriever.search(query, 10)
        assert [h.passage_index for h in hits] == reference_top(expected, 10), query
        np.testing.assert_allclose([h.score for h in hits],
                                   expected[[h.passage_index for h in hits]], rtol=rtol)
    batch = retriever.search_batch(["term1 term2", "term3"], 4)
    assert batch == [retriever.search("term1 term2", 4), retriever.search("term3", 4)]


@pytest.mark.parametrize("engine", RETRIEVER_ENGINES)
def test_score_by_hand(engine):
    texts = ["the cat sat on the mat", "dogs chase cats in the park",
             "a cat and a dog became friends", "stock markets fell sharply on monday"]
    retriever = build_retriever(texts, engine)
    # "mat" is only in passage 0: idf = log((4 - 1 + 0.5) / (1 + 0.5)) (Lucene: log(1 + that));
    # after stop words the lengths are 3, 4, 4, 5 (avgdl 4); tf = 1, k1 = 1.5, b = 0.75.
    idf = math.log(1 + 3.5 / 1.5) if engine == "pyserini" else math.log(3.5 / 1.5)
    expected = idf * 2.5 / (1 + 1.5 * (1 - 0.75 + 0.75 * 3 / 4))
    (hit,) = retriever.search("mat", 3)
    assert hit.passage_index == 0 and hit.score == pytest.approx(expected, rel=1e-6)
    assert retriever.search("markets monday", 1)[0].passage_index == 3
    assert retriever.search("unseen words", 5) == []
    with pytest.raises(RetrievalError, match="top_p must be >= 1"):
        retriever.search("mat", 0)


def test_common_terms_differ_within_the_stated_bound():
    """A term held by more than half the passages: rank-bm25 gives it epsilon x mean idf,
    bm25s idf 0. The difference per passage is at most (occurrences in the query) x epsilon x
    mean idf x (k1 + 1), and bm25s drops passages that share only such terms."""
    from rank_bm25 import BM25Okapi

    texts = [f"common word{i} word{i + 1}" for i in range(8)] + ["rare alone"] * 2
    reference = BM25Okapi([bm25_tokenize(t) for t in texts], k1=K1, b=0.75, epsilon=EPSILON)
    assert reference.idf["common"] == pytest.approx(EPSILON * reference.average_idf)
    bound = 2 * EPSILON * reference.average_idf * (K1 + 1)  # "common" twice in the query
    query = "common common word3"
    expected = reference.get_scores(bm25_tokenize(query))
    rank_hits = {h.passage_index: h.score for h in build_retriever(texts, "rank-bm25")
                 .search(query, 10)}
    bm25s_hits = {h.passage_index: h.score for h in build_retriever(texts, "bm25s")
                  .search(query, 10)}
    assert set(rank_hits) == set(range(8))  # every passage holding "common"
    assert set(bm25s_hits) == {2, 3}  # only those holding "word3"
    for index, score in rank_hits.items():
        assert score == pytest.approx(expected[index], rel=1e-12)
        difference = score - bm25s_hits.get(index, 0.0)
        assert 0 < difference <= bound * (1 + FLOAT32_SCORE_RTOL)


@pytest.mark.parametrize("engine", RETRIEVER_ENGINES)
def test_round_trip_and_refusals(engine, tmp_path):
    texts = rare_terms_corpus(1)
    retriever = build_retriever(texts, engine)
    retriever.save(tmp_path / "bm25", fingerprint="abc")
    manifest = json.loads((tmp_path / "bm25" / "manifest.json").read_text())
    assert manifest["engine"] == engine and manifest["num_passages"] == 60
    loaded = load_retriever(tmp_path / "bm25", fingerprint="abc")
    assert type(loaded) is type(retriever)
    assert loaded.search("term3 term4 term9", 10) == retriever.search("term3 term4 term9", 10)
    with pytest.raises(RetrievalError, match="built over other passages"):
        load_retriever(tmp_path / "bm25", fingerprint="xyz")
    other = RankBM25Retriever if engine == "bm25s" else BM25sRetriever
    with pytest.raises(RetrievalError, match=f"built by {engine}, not {other.engine}"):
        other.load(tmp_path / "bm25")


def test_manifest_without_engine_is_rank_bm25(tmp_path):
    """Indexes written before bm25s existed have no `engine` field."""
    RankBM25Retriever.build(["a cat", "a dog"]).save(tmp_path / "bm25")
    manifest_path = tmp_path / "bm25" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["engine"]
    manifest_path.write_text(json.dumps(manifest))
    assert isinstance(load_retriever(tmp_path / "bm25"), RankBM25Retriever)
    manifest["engine"] = "lucene"
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(RetrievalError, match="field engine is 'lucene'"):
        load_retriever(tmp_path / "bm25")


def test_resolve_engine():
    assert resolve_engine("auto", AUTO_BM25S_FROM - 1) == "rank-bm25"
    assert resolve_engine("auto", AUTO_BM25S_FROM) == "bm25s"
    assert resolve_engine("rank-bm25", 10**9) == "rank-bm25"
    with pytest.raises(RetrievalError, match="unknown retriever 'lucene'"):
        resolve_engine("lucene", 10)


# ------------------------------------------------------------- Lucene (engine "pyserini")
# Lucene 9 scores a term as w - w / (1 + tf / norm) in float32 (w = idf x boost, norm =
# k1 (1 - b + b dl / avgdl)): about eight float32 operations of relative error <= 2^-24 each,
# the subtraction amplifying them by (1 + x) / x, x = tf / norm >= 0.45 for these lengths
# (<= 3.3), and a test query sums at most three positive terms: 2^-24 x 8 x 3.3 < 2e-6, doubled
# for the ln and the float32 idf: 4e-6 relative.
LUCENE_SCORE_RTOL = 4e-6


def lucene_reference_scores(texts: list[str], query: str, lengths: dict[int, int] | None = None,
                            k1: float = K1, b: float = 0.75) -> np.ndarray:
    """Lucene's BM25 by hand, in float64, on rank-bm25's scale (x (k1 + 1)): idf = ln(1 + (N - n
    + 0.5) / (n + 0.5)); document lengths as given (default: exact token counts)."""
    docs = [bm25_tokenize(t) for t in texts]
    dl = np.array([len(d) for d in docs], float)
    avgdl = dl.mean()  # Lucene: sum of exact lengths / documents
    for index, length in (lengths or {}).items():
        dl[index] = length
    scores = np.zeros(len(docs))
    for term in bm25_tokenize(query):
        n = sum(term in d for d in docs)
        if not n:
            continue
        idf = math.log(1 + (len(docs) - n + 0.5) / (n + 0.5))
        tf = np.array([d.count(term) for d in docs], float)
        scores += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
    return scores


def test_lucene_scores_equal_its_formula_by_hand():
    texts = rare_terms_corpus()
    retriever = build_retriever(texts, "pyserini")
    for query in ("term1 term2 term2", "term299 term7", "term5", "nothing here"):
        expected = lucene_reference_scores(texts, query)
        hits = retriever.search(query, 10)
        assert [h.passage_index for h in hits] == reference_top(expected, 10), query
        np.testing.assert_allclose([h.score for h in hits],
                                   expected[[h.passage_index for h in hits]],
                                   rtol=LUCENE_SCORE_RTOL)
    batch = retriever.search_batch(["term1 term2", "term3"], 4)
    assert batch == [retriever.search("term1 term2", 4), retriever.search("term3", 4)]


def test_lucene_one_term_queries_rank_as_rank_bm25():
    """idf is a common factor of a one-term query's scores, so Lucene's other idf cannot change
    its ranking: the top-p equals rank-bm25's `get_scores` top-p (passages under 40 tokens,
    whose lengths Lucene stores exactly)."""
    from rank_bm25 import BM25Okapi

    texts = rare_terms_corpus(2)
    reference = BM25Okapi([bm25_tokenize(t) for t in texts], k1=K1, b=0.75, epsilon=EPSILON)
    retriever = build_retriever(texts, "pyserini")
    for term in ("term0", "term17", "term123", "term250"):
        expected = reference.get_scores([term])
        assert [h.passage_index for h in retriever.search(term, 10)] == \
            reference_top(expected, 10), term


def test_lucene_stores_long_passage_lengths_in_four_bits():
    """The stated difference: a 100-token passage is scored as 96 tokens long (100 = 0b1100100,
    its 4 leading bits kept), while the mean length uses the exact counts."""
    texts = [" ".join(["alpha"] + [f"filler{i}" for i in range(99)]),
             "alpha beta", "gamma delta epsilon"]
    hits = {h.passage_index: h.score for h in build_retriever(texts, "pyserini").search("alpha", 5)}
    assert set(hits) == {0, 1}
    quantised = lucene_reference_scores(texts, "alpha", lengths={0: 96})
    exact = lucene_reference_scores(texts, "alpha")
    assert hits[0] == pytest.approx(quantised[0], rel=LUCENE_SCORE_RTOL)
    assert abs(hits[0] - exact[0]) > 100 * LUCENE_SCORE_RTOL * exact[0]  # not the exact length
    assert hits[1] == pytest.approx(exact[1], rel=LUCENE_SCORE_RTOL)


def test_lucene_index_files_are_checked(tmp_path):
    """The manifest lists Lucene's files (their names are Lucene's choice); a missing one, a
    damaged one or a manifest without the list is refused, named."""
    from dil_jax.open_domain.retrieval.engines import index_files

    build_retriever(rare_terms_corpus(3), "pyserini").save(tmp_path / "bm25", fingerprint="f")
    files = index_files(tmp_path / "bm25")
    assert files[0] == "manifest.json" and any(name.startswith("segments_") for name in files)
    assert sorted(p.name for p in (tmp_path / "bm25").iterdir()) == sorted(files)
    victim = next(name for name in files if name.endswith(".si"))
    (tmp_path / "bm25" / victim).rename(tmp_path / "moved")
    with pytest.raises(RetrievalError, match=victim):
        load_retriever(tmp_path / "bm25", fingerprint="f")
    (tmp_path / "moved").rename(tmp_path / "bm25" / victim)
    segments = next(name for name in files if name.startswith("segments_"))
    (tmp_path / "bm25" / segments).write_bytes(b"not a lucene file")
    with pytest.raises(RetrievalError, match="Lucene index unreadable"):
        load_retriever(tmp_path / "bm25", fingerprint="f")
    manifest_path = tmp_path / "bm25" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["lucene_files"] = ["../escape"]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(RetrievalError, match="field lucene_files"):
        load_retriever(tmp_path / "bm25", fingerprint="f")


@pytest.mark.parametrize("engine", RETRIEVER_ENGINES)
def test_zero_passages_are_refused(engine):
    with pytest.raises(RetrievalError, match="zero passages"):
        build_retriever([], engine)


@pytest.mark.parametrize("engine", RETRIEVER_ENGINES)
def test_attainable_score_by_hand(engine, tmp_path):
    # Passages (after stop words) "cat mat", "cat dog", "bird": N = 3; "cat" is in 2 passages,
    # "mat" in 1, "zebra" in none. Each engine's idf times (k1 + 1) = 2.5, summed:
    #   rank-bm25: "cat" raw ln(1.5 / 2.5) = -ln(5/3) < 0, floored at 0.25 x the mean raw idf
    #     over cat, mat, dog, bird: (-ln(5/3) + 3 ln(5/3)) / 4 = ln(5/3) / 2 -> ln(5/3) / 8;
    #     "zebra" ln(3.5 / 0.5) = ln 7.
    #   bm25s (Robertson, floored at 0): "cat" 0, "zebra" ln 7.
    #   Lucene: ln(1 + 1.5 / 2.5) = ln 1.6 and ln(1 + 7) = ln 8.
    retriever = build_retriever(["the cat and the mat", "a cat, a dog", "bird"], engine)
    cat = {"rank-bm25": math.log(5 / 3) / 8, "bm25s": 0.0, "pyserini": math.log(1.6)}[engine]
    zebra = math.log(8) if engine == "pyserini" else math.log(7)
    assert retriever.attainable("The cat and the zebra?") == pytest.approx(2.5 * (cat + zebra))
    # A repeated term counts twice, as the engines score it; no term at all attains 0.
    assert retriever.attainable("zebra zebra") == pytest.approx(2.5 * 2 * zebra)
    assert retriever.attainable("the of a") == 0.0
    # A passage holding every term once scores 1 / (1 + k1 (1 - b + b dl / avgdl)) of it:
    # "cat mat" has dl 2, avgdl 5 / 3.
    if engine != "bm25s":  # "cat" has idf 0 there
        top = retriever.search("cat mat", 1)[0]
        ratio = top.score / retriever.attainable("cat mat")
        assert ratio == pytest.approx(1 / (1 + 1.5 * (0.25 + 0.75 * 2 / (5 / 3))), rel=1e-6)
    retriever.save(tmp_path / "bm25")
    assert load_retriever(tmp_path / "bm25").attainable("cat zebra") == pytest.approx(
        retriever.attainable("cat zebra"))
