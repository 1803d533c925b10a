"""The BM25 engines behind `Retriever`: each against rank-bm25's own `get_scores`, by hand, and
through an index on disk (`dil-jax index --retriever`)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dil_jax.defaults import AUTO_BM25S_FROM, RETRIEVER_ENGINES
from dil_jax.open_domain.retrieval import (
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


@pytest.mark.parametrize("engine", RETRIEVER_ENGINES)
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
    # "mat" is only in passage 0: idf = log((4 - 1 + 0.5) / (1 + 0.5)); after stop words the
    # lengths are 3, 4, 4, 5 (avgdl 4); tf = 1, k1 = 1.5, b = 0.75.
    expected = math.log(3.5 / 1.5) * 2.5 / (1 + 1.5 * (1 - 0.75 + 0.75 * 3 / 4))
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
    with pytest.raises(RetrievalError, match="unknown retriever 'pyserini'"):
        resolve_engine("pyserini", 10)
