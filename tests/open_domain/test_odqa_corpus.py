"""Corpus splitting and BM25 retrieval, checked by hand and against rank-bm25 itself."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dil_jax.open_domain.index.corpus import (
    CorpusError,
    Document,
    expand_presets,
    iter_sources,
    read_jsonl,
    read_squad_paragraphs,
    read_wikipedia_leads,
    split_documents,
    split_paragraphs,
    split_windows,
)
from dil_jax.open_domain.retrieval.engines import RankBM25Retriever, RetrievalError, bm25_tokenize


def test_split_paragraphs_drops_short_pieces():
    text = ("First paragraph is long enough to keep it.\n\nshort one\n  \n"
            "  Second kept paragraph, also long enough.  \n\n\nTail.")
    spans = split_paragraphs(text, min_chars=30)
    assert [text[s:e] for s, e in spans] == ["First paragraph is long enough to keep it.",
                                              "Second kept paragraph, also long enough."]
    # A single newline is not a paragraph break.
    assert len(split_paragraphs("line one is quite long here\nline two is long too", 10)) == 1


def test_split_windows_by_hand():
    words = [f"w{i}" for i in range(250)]
    text = " ".join(words)
    spans = split_windows(text, size=100, stride=50)
    pieces = [text[s:e].split() for s, e in spans]
    # Windows start at words 0, 50, 100, 150 and the one starting at 150 reaches the end (249).
    assert [p[0] for p in pieces] == ["w0", "w50", "w100", "w150"]
    assert [len(p) for p in pieces] == [100, 100, 100, 100]
    assert pieces[-1][-1] == "w249"
    assert split_windows("one two three", 100, 50) == [(0, 13)]
    assert split_windows("   ", 100, 50) == []


def test_passages_keep_source_and_offsets():
    doc = Document("d1", "Title", "Alpha beta gamma delta.\n\nEpsilon zeta eta theta iota.")
    passages = split_documents([doc], "paragraphs", min_chars=10)
    assert [p.passage_id for p in passages] == ["d1#0", "d1#1"]
    for p in passages:
        assert doc.text[p.char_start:p.char_end] == p.text and p.doc_id == "d1"
    windows = split_documents([doc], "windows", window_size=3, window_stride=2)
    assert windows[1].text == "gamma delta.\n\nEpsilon"
    with pytest.raises(ValueError, match="unknown split strategy 'sentences'"):
        split_documents([doc], "sentences")


def test_jsonl_errors_name_line_and_field(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"id": "a", "title": "A", "text": "hello"}\n{"id": "b", "title": "B"}\n')
    with pytest.raises(CorpusError, match=r"corpus.jsonl:2: field 'text' missing"):
        read_jsonl(path)
    path.write_text('{"id": "a", "text": "x"}\nnot json\n')
    with pytest.raises(CorpusError, match=r"corpus.jsonl:2: not valid JSON"):
        read_jsonl(path)
    path.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n')
    with pytest.raises(CorpusError, match=r"corpus.jsonl:2: duplicate id 'a'"):
        read_jsonl(path)
    path.write_text('{"id": "a", "text": "x"}\n\n{"id": "b", "text": "y"}\n')
    assert [d.doc_id for d in read_jsonl(path)] == ["a", "b"]


def test_real_sources(shared_data):
    squad = read_squad_paragraphs(shared_data / "squad" / "dev-v1.1.35-articles.json")
    assert len(squad) == 1211  # the README's paragraph count
    wiki = read_wikipedia_leads()
    assert len(wiki) == 10033 and all(d.doc_id.startswith("wiki:") for d in wiki[:5])


def _squad_file(path, titles_and_contexts) -> None:
    path.write_text(json.dumps({"data": [
        {"title": title, "paragraphs": [{"context": context, "qas": []}]}
        for title, context in titles_and_contexts]}))


def test_the_squad_open_preset_names_its_sources_in_order(tmp_path):
    _squad_file(tmp_path / "train-v1.1.json", [("T", "a training paragraph")])
    _squad_file(tmp_path / "dev-v1.1.json", [("D", "a dev paragraph")])
    assert expand_presets(["jsonl:x.jsonl", f"squad-open:{tmp_path}"]) == [
        "jsonl:x.jsonl", f"squad:{tmp_path / 'train-v1.1.json'}",
        f"squad:{tmp_path / 'dev-v1.1.json'}", "wikipedia"]
    # The shared 35-article dev file is taken before the official one.
    _squad_file(tmp_path / "dev-v1.1.35-articles.json", [("D35", "the shared dev paragraph")])
    assert expand_presets([f"squad-open:{tmp_path}"])[1] == \
        f"squad:{tmp_path / 'dev-v1.1.35-articles.json'}"
    documents = iter_sources([f"squad-open:{tmp_path}"])
    assert [next(documents).doc_id for _ in range(3)] == [
        "T#p0", "D35#p0", read_wikipedia_leads()[0].doc_id]
    (tmp_path / "train-v1.1.json").unlink()
    with pytest.raises(CorpusError, match=rf"squad-open:{tmp_path}: {tmp_path / 'train-v1.1.json'}"
                                          r" not found \(the preset reads train-v1.1.json"):
        expand_presets([f"squad-open:{tmp_path}"])


def test_the_squad_open_corpus_holds_no_dev_paragraph_twice(shared_data):
    """The preset over the shared data (docs/results/open_domain_log.md, "A corpus 2.5 times
    larger"): 18,896 training + 1,211 dev paragraphs + the 10,033 leads. The training paragraphs are
    distractors for the dev questions, never their own paragraph: SQuAD's train and dev articles are
    disjoint, and no dev paragraph's text (whitespace and case aside) is a training one."""
    sources = expand_presets([f"squad-open:{shared_data / 'squad'}"])
    train, dev = (read_squad_paragraphs(spec.split(":", 1)[1]) for spec in sources[:2])
    assert (len(train), len(dev)) == (18896, 1211)

    def key(text: str) -> str:
        return " ".join(text.split()).casefold()

    assert not {d.title for d in train} & {d.title for d in dev}
    assert not {key(d.text) for d in train} & {key(d.text) for d in dev}


def test_bm25_top1_by_hand():
    texts = ["the cat sat on the mat", "dogs chase cats in the park",
             "a cat and a dog became friends", "stock markets fell sharply on monday"]
    retriever = RankBM25Retriever.build(texts)
    assert next(h.passage_index for h in retriever.search("cat mat", 2)) == 0
    assert retriever.search("markets monday", 1)[0].passage_index == 3
    # Hand computation for the query "mat": only passage 0 has it. rank-bm25's idf is
    # log((N - n + 0.5) / (n + 0.5)) = log(3.5 / 1.5); tokens after stop words: "cat sat mat",
    # "dogs chase cats park", "cat dog became friends", "stock markets fell sharply monday",
    # so dl = 3 and avgdl = (3 + 4 + 4 + 5) / 4 = 4; tf = 1, k1 = 1.5, b = 0.75.
    idf = math.log(3.5 / 1.5)
    expected = idf * (1 * 2.5) / (1 + 1.5 * (1 - 0.75 + 0.75 * 3 / 4))
    assert bm25_tokenize(texts[0]) == ["cat", "sat", "mat"]
    hit = retriever.search("mat", 1)[0]
    assert hit.passage_index == 0 and hit.score == pytest.approx(expected, rel=1e-12)


def test_bm25_matches_rank_bm25_and_round_trips(tmp_path):
    from rank_bm25 import BM25Okapi

    rng = np.random.default_rng(0)
    vocab = [f"term{i}" for i in range(40)]
    texts = [" ".join(rng.choice(vocab, rng.integers(3, 30))) for _ in range(60)]
    retriever = RankBM25Retriever.build(texts)
    reference = BM25Okapi([bm25_tokenize(t) for t in texts])
    for query in ("term1 term2 term2", "term39 term7", "nothing here"):
        np.testing.assert_allclose(retriever.scores(query),
                                   reference.get_scores(bm25_tokenize(query)), rtol=1e-12)
    retriever.save(tmp_path / "bm25", fingerprint="abc")
    loaded = RankBM25Retriever.load(tmp_path / "bm25", fingerprint="abc")
    assert [h.passage_index for h in loaded.search("term3 term4", 10)] == \
        [h.passage_index for h in retriever.search("term3 term4", 10)]
    with pytest.raises(RetrievalError, match="built over other passages"):
        RankBM25Retriever.load(tmp_path / "bm25", fingerprint="xyz")
    manifest = json.loads((tmp_path / "bm25" / "manifest.json").read_text())
    assert manifest["num_passages"] == 60


def test_no_dev_paragraph_is_a_training_paragraph():
    """`squad-open` puts SQuAD train's paragraphs beside the dev articles' as distractors: a dev
    question's answer must come from its own paragraph, never from a copy of it in train. The
    shared files share no paragraph (whitespace-normalised) and no article title."""
    import re

    from tests.helpers import V11, squad_file

    def paragraphs(path):
        data = json.loads(path.read_text())["data"]
        return ({re.sub(r"\s+", " ", p["context"]).strip()
                 for article in data for p in article["paragraphs"]},
                {article["title"] for article in data})

    train, train_titles = paragraphs(squad_file("train-v1.1.json"))
    dev, dev_titles = paragraphs(squad_file(V11))
    assert len(train) > 18_000 and len(dev) > 1_200
    assert not dev & train and not dev_titles & train_titles
