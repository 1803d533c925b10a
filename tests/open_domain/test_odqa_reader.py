"""The open-domain reader over a small index with the real MiniLM (seeded QA head)."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from dil_jax.data.squad import SquadExample
from dil_jax.open_domain.index.corpus import Document, split_documents
from dil_jax.open_domain.index.folder import build_index, build_reader_cache
from dil_jax.open_domain.reader import OpenDomainReader
from dil_jax.open_domain.retrieval.engines import bm25_tokenize
from dil_jax.open_domain.scoring import (
    Candidate,
    best_pair_of_each_hit,
    pair_span_scores,
    pick_answer,
    standardize,
)
from dil_jax.predict import predict_squad
from dil_jax.readers import load_reader
from dil_jax.reading.grid import PairGrid
from dil_jax.reading.pairs import SpanScores
from dil_jax.samples import SAMPLE_PASSAGES

from tests.helpers import random_prescreener

P_LEN, STRIDE = 32, 16


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return load_reader(minilm_dir, max_question_len=16, rng=jax.random.key(3))


@pytest.fixture(scope="module")
def index(minilm, tmp_path_factory):
    documents = [Document(f"d{i}", f"T{i}", text) for i, text in enumerate(SAMPLE_PASSAGES)]
    passages = split_documents(documents, "paragraphs")
    return build_index(tmp_path_factory.mktemp("odqa") / "index", passages, minilm.tokenizer,
                       max_passage_len=P_LEN, doc_stride=STRIDE, split={"strategy": "paragraphs"})


@pytest.mark.parametrize("k", [0, 4])
def test_reader_equals_squad_predict_path(minilm, index, k):
    loaded = minilm.with_config(num_lower_layers=k)
    cache = build_reader_cache(index, loaded, encode=loaded.passage_encoder(batch_size=4))
    assert np.asarray(index.windows.count).max() > 1, "some passage must span several windows"
    reader = OpenDomainReader(index, loaded, cache, top_p=len(index.passages), batch_size=4,
                              chunk_size=8)
    # Only passages sharing a word with the question are retrieved: the last question shares
    # one with every passage, so every passage (and window) is compared.
    every = " ".join(bm25_tokenize(passage.text)[0] for passage in index.passages)
    questions = ["Who wrote Pride and Prejudice?", "When did Apollo 11 land on the Moon?",
                 f"What links {every}?"]
    result = reader.read(questions)
    assert set(result.timings) == {"retrieval", "question_lower", "pair_upper", "decode"}
    assert len(result.candidates[-1]) == len(index.passages)
    for question, candidates, hits in zip(questions, result.candidates, result.hits):
        assert len(candidates) == len(hits) >= 1
        examples = [SquadExample(f"q{c.passage_index}", "", index.passages[c.passage_index].text,
                                 question) for c in candidates]
        expected = predict_squad(loaded, examples, max_passage_len=P_LEN, doc_stride=STRIDE,
                                 batch_size=4, progress=False)
        for candidate in candidates:
            passage = index.passages[candidate.passage_index]
            assert candidate.text == expected[f"q{candidate.passage_index}"]
            assert passage.text[candidate.char_start:candidate.char_end] == candidate.text


def test_retrieval_finds_the_right_passage(index):
    hits = index.retriever.search("Jane Austen novel Elizabeth Bennet", 2)
    assert index.passages[hits[0].passage_index].doc_id == "d1"


def test_score_fusion_rule():
    np.testing.assert_allclose(standardize(np.array([1.0, 2.0, 3.0])),
                               [-1.224744871, 0.0, 1.224744871])
    np.testing.assert_array_equal(standardize(np.array([5.0])), [0.0])
    candidates = [Candidate(0, 0, "a", 0, 1, reader_score=2.0, bm25_score=1.0),
                  Candidate(1, 1, "b", 0, 1, reader_score=1.9, bm25_score=30.0),
                  Candidate(2, 2, "c", 0, 1, reader_score=0.0, bm25_score=2.0)]
    assert pick_answer(candidates, None).text == "a"      # reader alone
    assert pick_answer(candidates, 1.0).text == "a"       # mu = 1 is the reader alone
    assert pick_answer(candidates, 0.5).text == "b"       # a much better BM25 score tips it
    assert pick_answer([], 0.5) is None


def test_span_score_rules_by_hand():
    """Two windows of one passage (hit (0, 0)) and one of another (hit (0, 1)): s_start + s_end
    of each window's best span, and its null logits."""
    best_span = np.array([6.0, 5.0, 4.0])
    scores = SpanScores(np.zeros((3, 2), np.float32), np.zeros((3, 2), np.float32),
                        null_start_logits=np.array([3.0, 0.5, -1.0], np.float32),
                        null_end_logits=np.array([2.0, 0.5, -1.0], np.float32))
    np.testing.assert_array_equal(pair_span_scores(best_span, scores, "logits"), [6.0, 5.0, 4.0])
    np.testing.assert_array_equal(pair_span_scores(best_span, scores, "margin"), [1.0, 4.0, 6.0])
    hits = [(0, 0), (0, 0), (0, 1)]
    assert best_pair_of_each_hit(pair_span_scores(best_span, scores, "logits"), hits) == {
        (0, 0): 0, (0, 1): 2}
    assert best_pair_of_each_hit(pair_span_scores(best_span, scores, "margin"), hits) == {
        (0, 0): 1, (0, 1): 2}
    with pytest.raises(ValueError, match="unknown span score rule 'prob'"):
        pair_span_scores(best_span, scores, "prob")


def test_margin_rule_ignores_a_constant_added_to_a_window(minilm, index, monkeypatch):
    """The reason "margin" exists: a per-window softmax does not see a constant added to all of
    one window's logits (null included). Such a shift, different for every pair, changes
    nothing under "margin" (within float32 rounding: shifted logits reach ~60, whose float32
    spacing is ~4e-6, and a margin sums four of them, so ~2e-5; checked at 1e-4), while it
    reorders the "logits" rule's passages."""
    loaded = minilm.with_config(num_lower_layers=4)
    cache = build_reader_cache(index, loaded, encode=loaded.passage_encoder(batch_size=4))
    reader = OpenDomainReader(index, loaded, cache, top_p=len(index.passages), batch_size=4,
                              chunk_size=8, span_score="margin")
    every = " ".join(bm25_tokenize(passage.text)[0] for passage in index.passages)
    questions = [f"What links {every}?", "Who wrote Pride and Prejudice?"]
    plain = reader.read(questions)
    assert plain.candidates == plain.by_score["margin"]
    read_pairs = reader.grid.read_pairs

    def shifted(*args, **kwargs):
        scores = read_pairs(*args, **kwargs)
        shift = np.random.default_rng(0).uniform(-50, 50, scores.null_start_logits.shape)
        shift = shift.astype(np.float32)
        return SpanScores(scores.start_logits + shift[:, None], scores.end_logits + shift[:, None],
                          scores.null_start_logits + shift, scores.null_end_logits + shift)

    monkeypatch.setattr(reader.grid, "read_pairs", shifted)
    moved = reader.read(questions)
    for before, after in zip(plain.by_score["margin"], moved.by_score["margin"], strict=True):
        assert [c.text for c in after] == [c.text for c in before]
        np.testing.assert_allclose([c.reader_score for c in after],
                                   [c.reader_score for c in before], atol=1e-4)
    assert any(pick_answer(b, None).passage_index != pick_answer(a, None).passage_index
               for b, a in zip(plain.by_score["logits"], moved.by_score["logits"], strict=True))
    with pytest.raises(ValueError, match="span_score 'raw'"):
        OpenDomainReader(index, loaded, cache, span_score="raw")


def test_prescreened_reader_equals_prescreened_squad_predict(minilm, index, minilm_dir, tmp_path):
    """The open-domain reader over stored sentence embeddings keeps the same sentences and finds
    the same spans as `predict_squad` prescreening each (question, passage) on the fly; a
    prescreener checkpoint round-trips, and refuses another sentence encoder."""
    from dil_jax.open_domain.index.sentences import build_sentence_store
    from dil_jax.open_domain.reader import ReaderPrescreen
    from dil_jax.prescreening.prescreener import PrescreenerError, SentencePrescreener
    from dil_jax.prescreening.screen import SentenceRule
    from dil_jax.prescreening.sentences import split_sentences

    saved = random_prescreener(minilm_dir).save(tmp_path / "prescreener", note="test")
    prescreener = SentencePrescreener.load(saved)
    other_encoder = prescreener.encoder.with_params(
        jax.tree.map(lambda x: x * 1.01, prescreener.encoder.params))
    with pytest.raises(PrescreenerError, match="weights"):
        SentencePrescreener.load(saved, encoder=other_encoder)

    store = build_sentence_store(index, prescreener)
    passage = 3
    spans = split_sentences(index.passages[passage].text)
    assert store.spans_of([passage])[0] == spans and len(spans) > 1
    np.testing.assert_allclose(store.matrix([passage], 8)[0][0, :len(spans)],
                               prescreener.embed([index.passages[passage].text[a:b]
                                                  for a, b in spans]), atol=1e-5)

    loaded = minilm.with_config(num_lower_layers=4)
    grid = PairGrid(loaded.model, batch_size=4)
    cache = build_reader_cache(index, loaded, encode=lambda windows: np.asarray(
        grid.encode_passages(loaded.params, windows.ids, windows.mask)))
    rule = SentenceRule(top_m=1)
    reader = OpenDomainReader(index, loaded, cache, top_p=len(index.passages),
                              batch_size=4, chunk_size=8,
                              prescreen=ReaderPrescreen(prescreener, rule, store))
    questions = ["Who wrote Pride and Prejudice?", "When did Apollo 11 land on the Moon?"]
    result = reader.read(questions)
    assert result.timings["prescreen"] > 0
    plain = reader.with_prescreen(None).read(questions)
    differ = 0
    for question, candidates, unscreened in zip(questions, result.candidates, plain.candidates):
        examples = [SquadExample(f"q{c.passage_index}", "", index.passages[c.passage_index].text,
                                 question) for c in candidates]
        expected = predict_squad(loaded, examples, max_passage_len=P_LEN, doc_stride=STRIDE,
                                 batch_size=4, progress=False, prescreen=(prescreener, rule))
        for candidate, before in zip(candidates, unscreened, strict=True):
            assert candidate.text == expected[f"q{candidate.passage_index}"]
            text = index.passages[candidate.passage_index].text
            # Top-1: the span lies inside one sentence of the passage.
            assert any(a <= candidate.char_start < candidate.char_end <= b
                       for a, b in split_sentences(text))
            differ += candidate.text != before.text
    assert differ > 0  # prescreening changed what was read
    # The kept text of each retrieved passage is its one kept sentence (top-1), in BM25 order,
    # and holds the span read from that passage.
    assert plain.kept_texts == [] and len(result.kept_texts) == len(questions)
    for candidates, hits, kept in zip(result.candidates, result.hits, result.kept_texts,
                                      strict=True):
        assert len(kept) == len(hits)
        for hit, text in zip(hits, kept, strict=True):
            passage_text = index.passages[hit.passage_index].text
            assert text in [passage_text[a:b] for a, b in split_sentences(passage_text)]
        for candidate in candidates:
            assert candidate.text in kept[candidate.rank]


def test_evaluation_resumes_from_its_progress_file(minilm, index, tmp_path):
    """A resumed evaluation reads only the questions its progress file lacks, drops a last line
    cut short by a kill, and scores what one uninterrupted evaluation scores; a progress file of
    other settings, or damaged before its last line, is refused naming it."""
    from dil_jax.metrics.squad_metric import exact_score
    from dil_jax.open_domain.evaluate import EvaluationProgress, ProgressFileError, evaluate_reader

    loaded = minilm.with_config(num_lower_layers=4)
    cache = build_reader_cache(index, loaded, encode=loaded.passage_encoder(batch_size=4))
    reader = OpenDomainReader(index, loaded, cache, batch_size=4, chunk_size=8)
    asked = ["Who wrote Pride and Prejudice?", "When did Apollo 11 land on the Moon?",
             "What is the Moon?", "Who was Elizabeth Bennet?", "What did Austen write?"]
    examples = [SquadExample(f"q{i}", "", "", question, ("Jane Austen", "1969"))
                for i, question in enumerate(asked)]
    counted = []  # odqa-eval's progress bar: questions read after each block
    whole = evaluate_reader(reader, examples, [1, 3], 0.5, block_size=2,
                            on_block=counted.append)
    assert counted == [2, 4, 5]
    # The means, by hand from one read of every question.
    reader.top_p = 3
    answers = [pick_answer([c for c in candidates if c.rank < 1], None)
               for candidates in reader.read(asked).by_score["logits"]]
    expected_em = 100 * np.mean([max(exact_score(a.text if a else "", gold)
                                     for gold in ("Jane Austen", "1969")) for a in answers])
    assert whole["by_score"]["logits"][1]["EM"] == pytest.approx(expected_em)

    path, settings = tmp_path / "progress" / "reader.jsonl", {"reader": "test", "p": [1, 3]}
    evaluate_reader(reader, examples[:3], [1, 3], 0.5, block_size=2,
                    progress=EvaluationProgress(path, settings))
    assert len(path.read_text().splitlines()) == 3  # the header, blocks of 2 and 1
    with path.open("a") as out:
        out.write('{"questions": [{"id": "q3", "unm')  # a kill in the middle of a line
    read_again = []
    read = reader.read

    def counting(questions):
        read_again.extend(questions)
        return read(questions)

    reader.read = counting
    counted.clear()
    resumed = evaluate_reader(reader, examples, [1, 3], 0.5, block_size=2,
                              progress=EvaluationProgress(path, settings),
                              on_block=counted.append)
    assert read_again == asked[3:]
    assert counted == [5]  # the 3 questions held before count too
    for rule, rows in whole["by_score"].items():
        for p, row in rows.items():
            for name, value in row.items():
                assert resumed["by_score"][rule][p][name] == pytest.approx(value), (rule, p, name)
    assert len(path.read_text().splitlines()) == 4

    with pytest.raises(ProgressFileError, match=r"reader = 'test' there, 'other' now"):
        EvaluationProgress(path, {**settings, "reader": "other"})
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], "{not json", *lines[2:]]) + "\n")
    with pytest.raises(ProgressFileError, match=r"reader.jsonl: line 2 is not JSON"):
        EvaluationProgress(path, settings)


def test_a_progress_file_of_an_earlier_name_is_taken_over(tmp_path):
    """A progress file the code wrote under a setting's earlier value (a reader's earlier name)
    moves to the new file with its header renamed and its blocks byte for byte; one whose header
    does not hold the old value, or a new file already there, is left alone."""
    from dil_jax.open_domain.evaluate import EvaluationProgress, adopt_renamed_progress

    block = json.dumps({"questions": [], "wall_seconds": 1.0, "timings": {}})
    earlier, path = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    earlier.write_text(json.dumps({"settings": {"reader": "r + SEP top-2", "p": [3]}}) + "\n"
                       + block + "\n")
    renamed = {"reader": ("r + SEP top-2", "r + prescreen top-2")}
    assert not adopt_renamed_progress(path, earlier, {"reader": ("another", "r")})
    assert adopt_renamed_progress(path, earlier, renamed)
    assert not earlier.exists() and path.read_text().split("\n")[1:] == [block, ""]
    progress = EvaluationProgress(path, {"reader": "r + prescreen top-2", "p": [3]})
    assert progress.blocks == [json.loads(block)]
    earlier.write_text("kept\n")
    assert not adopt_renamed_progress(path, earlier, renamed)  # the new one is there already
    assert earlier.read_text() == "kept\n"


@pytest.mark.parametrize("line, problem", [
    ('{"questions": [{"id": "q0"}], "wall_seconds": 1.0, "timings": {}}', "lacks 'unmatched'"),
    ('{"questions": [], "timings": {}}', "lacks 'wall_seconds'"),
    ('[1, 2]', "a block is list"),
])
def test_progress_line_without_a_block_is_refused_by_line(tmp_path, line, problem):
    """A progress line that is JSON but not a block as evaluate_reader writes it (fields missing
    or of another type) is refused naming the file, the line and the field; not a KeyError later."""
    from dil_jax.open_domain.evaluate import EvaluationProgress, ProgressFileError

    path, settings = tmp_path / "reader.jsonl", {"reader": "test"}
    path.write_text(json.dumps({"settings": settings}) + "\n" + line + "\n")
    with pytest.raises(ProgressFileError, match=rf"reader.jsonl: line 2 is not a block.*{problem}"):
        EvaluationProgress(path, settings)


def test_answer_kept_by_prescreening_is_recall_over_the_kept_sentences():
    """R_kept (the seed's P(SEP) in the open domain) counts a question when a gold answer is in
    the kept text of one of its first p passages; R when it is anywhere in them (by hand)."""
    from dil_jax.open_domain.evaluate import aggregate, markdown_table, question_record

    example = SquadExample("q", "", "", "Who wrote Hamlet?", answer_texts=["Shakespeare"])
    passages = ["Hamlet is a play. It was written by Shakespeare.", "Shakespeare was English."]
    answer = Candidate(0, 0, "Shakespeare", 36, 47, 1.0, 2.0)
    by_score = {"logits": [answer]}
    hits = [object(), object()]
    # Passage 0 kept its first sentence only (no answer); passage 1 kept its answer.
    kept = ["Hamlet is a play.", "Shakespeare was English."]
    record = question_record(example, by_score, hits, passages, [1, 2], 0.5, kept)
    assert record["R"] == {"1": 1.0, "2": 1.0}
    assert record["R_kept"] == {"1": 0.0, "2": 1.0}
    assert "R_kept" not in question_record(example, by_score, hits, passages, [1, 2], 0.5)
    other = question_record(example, by_score, hits, passages, [1, 2], 0.5, ["", ""])
    rows = aggregate([record, other], [1, 2])["logits"]
    assert rows[1]["R_kept"] == 0.0 and rows[2]["R_kept"] == 50.0 and rows[2]["R"] == 100.0
    assert "R_kept" not in aggregate([record, question_record(
        example, by_score, hits, passages, [1, 2], 0.5)], [1, 2])["logits"][2]
    result = dict(k=0, l=6, by_p=rows, by_score={"logits": rows}, wall_seconds=1.0,
                  timings={"pair_upper": 0.5})
    assert "| 100.0 (kept 50.0) |" in markdown_table({"full + prescreen": result})
