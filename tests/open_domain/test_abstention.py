"""Abstention ("no answer found in the corpus"): the threshold choice against a hand count, the
manifest record, how an answer below it is shown, and that calibration refuses validation
articles (thresholds are chosen on training questions only)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from dil_jax.errors import CheckpointError
from dil_jax.open_domain.abstention import (
    Abstention,
    LogisticRule,
    choose_combined,
    choose_threshold,
    exclude_titles,
    fit_logistic,
    normalized_title,
    retrieval_match,
    sigmoid,
)
from dil_jax.open_domain.reader import format_answer
from dil_jax.open_domain.retrieval.bm25 import Hit
from dil_jax.open_domain.retrieval.engines import build_retriever
from dil_jax.open_domain.scoring import Candidate

from tests.helpers import REPO


def test_choose_threshold_against_a_hand_count():
    # in corpus: scores 3, 1, 2 and one question without candidates; exact: 1, 0, 1, 0.
    # out of corpus: 0.5, 2.5. Right decisions (answered and exact, or refused out of corpus):
    #   -inf: 2 + 0 = 2;  0.5: 2 + 0;  1: 2 + 1 = 3;  2: 2 + 1 = 3;  2.5: 1 + 1;  3: 1 + 2 = 3;
    #   inf: 0 + 2. The best is 3 of 6, first at 1 (ties go to the lower threshold).
    choice = choose_threshold([3.0, 1.0, 2.0, None], [1.0, 0.0, 1.0, 0.0], [0.5, 2.5])
    assert choice.threshold == 1.0
    assert choice.accuracy == pytest.approx(3 / 6)
    assert choice.coverage == pytest.approx(3 / 4)
    assert choice.answered_exact == pytest.approx(2 / 3)
    assert choice.refused_out == pytest.approx(1 / 2)


def test_choose_threshold_answers_everything_when_nothing_is_out_of_reach():
    # Every out-of-corpus score is below every in-corpus one and all answers are exact: any
    # threshold in (0.2, 1] is perfect; the lowest such candidate is the out score above 0.2.
    choice = choose_threshold([1.0, 2.0], [1.0, 1.0], [0.1, 0.2])
    assert choice.accuracy == 1.0 and 0.2 < choice.threshold <= 1.0
    with pytest.raises(ValueError, match="in-corpus and out-of-corpus"):
        choose_threshold([], [], [1.0])
    assert math.isinf(choose_threshold([1.0], [0.0], [2.0]).threshold)  # refuse all


def test_abstention_record_round_trip():
    manifest = {"abstention": {"chosen_on": "training", "by_rule": {
        "logits": {"threshold": 4.0, "threshold_ir": 3.5},
        "margin": {"threshold": 1.0, "threshold_ir": 0.5}}}}
    abstention = Abstention.from_manifest(manifest)
    assert abstention.threshold("margin", fused=True) == 0.5
    assert abstention.refuses(0.9, "margin", fused=False)
    assert not abstention.refuses(1.0, "margin", fused=False)
    assert Abstention.from_manifest({}) is None and Abstention.from_manifest(None) is None


def _reader(rule: str):
    passage = SimpleNamespace(text="Jupiter is the fifth planet from the Sun.", title="Jupiter",
                              passage_id="p0")
    return SimpleNamespace(index=SimpleNamespace(passages=[passage]), span_score=rule)


def test_an_answer_below_the_threshold_is_shown_as_no_answer():
    candidate = Candidate(passage_index=0, rank=0, text="Jupiter", char_start=0, char_end=7,
                          reader_score=0.7, bm25_score=3.0)
    abstention = Abstention({"margin": (1.0, 0.5)})
    hits = [Hit(0, 3.0)]
    refused = format_answer(_reader("margin"), "Q?", [candidate], hits, {}, None, abstention)
    assert "A: (no answer found in the corpus: the best answer's reader score 0.70 is below " \
           "this reader's threshold 1.00" in refused
    assert "best guess: Jupiter" in refused
    fused = format_answer(_reader("margin"), "Q?", [candidate], hits, {}, 0.5, abstention)
    assert "A: Jupiter\n" in fused  # 0.7 >= the with-IR threshold 0.5
    plain = format_answer(_reader("margin"), "Q?", [candidate], hits, {}, None, None)
    assert "A: Jupiter\n" in plain


def test_out_of_corpus_reads_drop_the_article_and_its_lead():
    titles = ["Super_Bowl_50", "Super Bowl 50", "Denver Broncos", "Super_Bowl_50"]
    hits = [Hit(i, 10.0 - i) for i in range(4)]
    kept = exclude_titles(hits, titles, {normalized_title("Super_Bowl_50")}, top_p=5)
    assert [h.passage_index for h in kept] == [2]


def _tool():
    spec = importlib.util.spec_from_file_location("abstention_tool", REPO / "tools/abstention.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_calibration_refuses_validation_articles(tmp_path):
    tool = _tool()
    validation = tmp_path / "dev.json"
    validation.write_text(json.dumps({"data": [{"title": "Jupiter", "paragraphs": []}]}))
    training = tmp_path / "train.json"
    training.write_text(json.dumps({"data": [{"title": "Mars", "paragraphs": []}]}))
    tool.check_not_validation(training, validation)  # disjoint: fine
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps({"data": [{"title": "Mars", "paragraphs": []},
                                          {"title": "Jupiter", "paragraphs": []}]}))
    with pytest.raises(SystemExit, match="validation articles"):
        tool.check_not_validation(mixed, validation)


def test_calibration_names_a_missing_file_or_reader(tmp_path):
    tool = _tool()
    with pytest.raises(SystemExit, match="--train .*no such file"):
        tool.main(["calibrate", "--train", str(tmp_path / "none.json"), "--reader",
                   str(tmp_path), "--work", str(tmp_path / "w")])
    with pytest.raises(SystemExit, match="--reader .*not a reader folder"):
        tool.require_readers([str(tmp_path)])


def _read(tool, qid: str, in_corpus: bool, score, exact: float):
    row = {"score": score, "EM": exact, "score_ir": score, "EM_ir": exact}
    return tool.QuestionRead(qid, in_corpus, {"logits": row})


def test_a_non_finite_threshold_is_not_recorded(tmp_path):
    """No out-of-corpus question scored (none had a candidate): answering everything is best,
    the threshold -inf. --record wrote it into the manifest (as -Infinity), and a reader with
    it is refused when loaded (a server does not start)."""
    tool = _tool()
    reads = [_read(tool, "a", True, 2.0, 1.0), _read(tool, "b", True, 1.0, 1.0),
             _read(tool, "c", False, None, 0.0), _read(tool, "d", False, None, 0.0)]
    chosen = tool.thresholds_of(reads)
    assert chosen["logits"]["threshold"] == -math.inf
    manifest = tmp_path / "dil_jax_manifest.json"
    manifest.write_text(
        (REPO / "dil_jax/assets/minilm-squad-full/dil_jax_manifest.json").read_text())
    before = manifest.read_bytes()
    with pytest.raises(tool.NotRecorded) as refused:
        tool.record_in_manifest(tmp_path, chosen, "test")
    message = str(refused.value)
    assert message.startswith(f"--reader {tmp_path}: thresholds not recorded: logits threshold "
                              "= -inf: no out-of-corpus question was scored")
    assert "logits threshold_ir = -inf" in message and "\n" not in message
    assert manifest.read_bytes() == before  # untouched

    # Refusing everything is best when no answer is exact: +inf, refused too.
    worst = tool.thresholds_of([_read(tool, "a", True, 1.0, 0.0),
                                _read(tool, "c", False, 2.0, 0.0)])
    assert worst["logits"]["threshold"] == math.inf
    assert "threshold = inf: refusing every question" in tool.unrecordable(worst)[0]
    # Finite thresholds are recorded, and load.
    fine = tool.thresholds_of([_read(tool, "a", True, 2.0, 1.0), _read(tool, "c", False, 0.5, 0.0)])
    tool.record_in_manifest(tmp_path, fine, "test")
    assert Abstention.from_manifest(json.loads(manifest.read_text())).threshold(
        "logits", fused=False) == 2.0


# ------------------------------------------------ the second signal: the retrieval match, a rule


def test_logistic_fit_is_the_closed_form_on_three_saturated_points():
    # Three distinct points and three coefficients: the maximum likelihood fit (l2 = 0) gives
    # each point its observed share. (0, 0): 1 of 4 right -> bias = logit(1/4) = -ln 3;
    # (1, 0): 3 of 4 -> bias + w1 = ln 3, w1 = 2 ln 3; (0, 1): 1 of 2 -> bias + w2 = 0, w2 = ln 3.
    features = [(0, 0)] * 4 + [(1, 0)] * 4 + [(0, 1)] * 2
    labels = [1, 0, 0, 0] + [1, 1, 1, 0] + [1, 0]
    fit = fit_logistic(np.asarray(features), np.asarray(labels), l2=0.0)
    assert fit.bias == pytest.approx(-math.log(3), abs=1e-9)
    assert fit.weights == pytest.approx((2 * math.log(3), math.log(3)), abs=1e-9)


def test_logistic_fit_stays_finite_on_separable_symmetric_data():
    # x1 = -1 wrong, +1 right (separable), x2 constant. By symmetry the bias is 0, and x2, whose
    # standardised column is 0, gets weight 0; the penalised optimum of w (x1 has std 1) sets
    # the gradient to 0: -(1 - sigmoid(w)) - sigmoid(-w) + w = 0, i.e. w = 2 sigmoid(-w).
    fit = fit_logistic(np.asarray([(-1.0, 5.0), (1.0, 5.0)]), np.asarray([0, 1]), l2=1.0)
    (w, w2) = fit.weights
    assert fit.bias == pytest.approx(0.0, abs=1e-9) and w2 == 0.0
    assert w == pytest.approx(2 * float(sigmoid(-w)), abs=1e-9) and 0.5 < w < 1.0
    with pytest.raises(ValueError, match="both classes"):
        fit_logistic(np.asarray([(0.0, 0.0), (1.0, 1.0)]), np.asarray([1, 1]))


def test_choose_combined_refuses_what_the_reader_score_alone_cannot():
    # Reader scores alike (5.0) in and out of corpus; only the retrieval match tells them
    # apart (0.6 in, 0.1 out): the reader score alone is right 2 of 4 times at best, the
    # rule 4 of 4, refusing exactly the out-of-corpus questions. A question without a
    # candidate (None) is refused and left out of the fit.
    in_features = [(5.0, 0.6), (5.0, 0.6), None]
    out_features = [(5.0, 0.1), (5.0, 0.1)]
    assert choose_threshold([5.0, 5.0, None], [1.0, 1.0, 0.0], [5.0, 5.0]).accuracy == 2 / 5
    rule, choice = choose_combined(in_features, [1.0, 1.0, 0.0], out_features)
    assert choice.accuracy == 4 / 5 and choice.refused_out == 1.0
    assert choice.coverage == pytest.approx(2 / 3)
    assert rule.retrieval_match > 0
    assert rule.probability_of(5.0, 0.6) >= rule.probability > rule.probability_of(5.0, 0.1)


def test_retrieval_match_by_hand_on_a_three_passage_corpus():
    # rank-bm25 over "cat mat", "cat dog", "bird" (after stop words; N = 3, avgdl 5/3):
    # idf(mat) = ln(5/3); idf(cat) = its floor 0.25 x mean raw idf = ln(5/3) / 8;
    # idf(zebra), held by none, ln 7. A passage of dl 2 holding a term once gets idf x 2.5 /
    # (1 + 1.5 (0.25 + 0.75 x 2 / (5/3))) = idf x 2.5 / 2.725; the attainable is idf x 2.5.
    retriever = build_retriever(["the cat and the mat", "a cat, a dog", "bird"], "rank-bm25")
    inside = retriever.search("cat mat", 3)
    assert retrieval_match(inside, retriever.attainable("cat mat")) == pytest.approx(1 / 2.725)
    cat, zebra = math.log(5 / 3) / 8, math.log(7)
    outside = retriever.search("cat zebra", 3)
    assert retrieval_match(outside, retriever.attainable("cat zebra")) == pytest.approx(
        cat / (cat + zebra) / 2.725)
    assert retrieval_match([], 3.0) == 0.0 and retrieval_match([Hit(0, 1.0)], 0.0) == 0.0


def _combined_record(**change):
    rule = {"bias": -1.0, "reader_score": 0.5, "retrieval_match": 4.0, "probability": 0.5}
    by_rule = {"logits": {"threshold": 4.0, "threshold_ir": 3.5, "combined": dict(rule),
                          "combined_ir": dict(rule)}}
    for key, value in change.items():
        where, _, field = key.partition("__")
        if field:
            by_rule["logits"][where][field] = value
        elif value is None:
            del by_rule["logits"][where]
        else:
            by_rule["logits"][where] = value
    return {"abstention": {"by_rule": by_rule}}


@pytest.mark.parametrize("change, field, shown", [
    ({"combined_ir": None}, "abstention.by_rule.logits.combined_ir", "missing"),
    ({"combined": 0.5}, "abstention.by_rule.logits.combined", "0.5"),
    ({"combined__bias": "abc"}, "abstention.by_rule.logits.combined.bias", "'abc'"),
    ({"combined_ir__retrieval_match": math.nan},
     "abstention.by_rule.logits.combined_ir.retrieval_match", "nan"),
    ({"combined__probability": 1.5}, "abstention.by_rule.logits.combined.probability", "1.5"),
    ({"combined__probability": math.inf}, "abstention.by_rule.logits.combined.probability",
     "inf"),
])
def test_a_bad_combined_rule_is_named_with_its_file_and_field(change, field, shown):
    record = _combined_record(**change)
    with pytest.raises(CheckpointError) as error:
        Abstention.from_manifest(record, "reader/dil_jax_manifest.json")
    message = str(error.value)
    assert message.startswith("reader/dil_jax_manifest.json: ")
    assert f"'{field}" in message and shown in message


def test_the_combined_rule_decides_and_old_records_keep_the_threshold():
    abstention = Abstention.from_manifest(_combined_record())
    rule = abstention.logistic("logits", fused=False)
    assert rule == LogisticRule(-1.0, 0.5, 4.0, 0.5)
    # sigmoid(-1 + 0.5 x 2 + 4 x 0.1) = sigmoid(0.4) > 0.5: answered although the reader
    # score 2 is below the threshold 4; sigmoid(-1 + 0.5 x 1 + 4 x 0) = sigmoid(-0.5) < 0.5:
    # refused.
    answered = abstention.decide(2.0, "logits", fused=False, match=0.1)
    assert not answered.refused and answered.probability == pytest.approx(float(sigmoid(0.4)))
    assert answered.threshold is None and answered.probability_threshold == 0.5
    assert abstention.decide(1.0, "logits", fused=False, match=0.0).refused
    # Without the match (not asked), or with a record of thresholds only: the reader score.
    assert abstention.decide(2.0, "logits", fused=False, match=None).refused
    old = Abstention.from_manifest(_combined_record(combined=None, combined_ir=None))
    assert not old.uses_retrieval("logits", fused=True) and old.combined == {}
    assert old.decide(3.6, "logits", fused=True, match=0.9) == old.decide(3.6, "logits", True,
                                                                            None)


def _indexed_reader(rule: str):
    """A reader over a real BM25 index of three passages (no model: format_answer reads the
    passages and asks the retriever)."""
    texts = ["Jupiter is the fifth planet from the Sun.", "Mars is red.", "Birds fly south."]
    passages = [SimpleNamespace(text=t, title=t.split()[0], passage_id=f"p{i}")
                for i, t in enumerate(texts)]
    index = SimpleNamespace(passages=passages, retriever=build_retriever(texts, "rank-bm25"))
    return SimpleNamespace(index=index, span_score=rule)


def test_ask_decides_with_the_retrieval_match_on_a_tiny_index():
    reader = _indexed_reader("logits")
    candidate = Candidate(passage_index=0, rank=0, text="fifth", char_start=11, char_end=16,
                          reader_score=5.1, bm25_score=0.0)
    # Weights that refuse on the match alone: p = sigmoid(-2 + 0 x score + 10 x match) >= 0.5
    # answers when match >= 0.2.
    rule = LogisticRule(-2.0, 0.0, 10.0, 0.5)
    abstention = Abstention({"logits": (5.09, 5.09)}, combined={"logits": (rule, rule)})
    index = reader.index
    for question, answered in (("Which planet is Jupiter from the Sun?", True),
                               ("Which planet did Pope Julius II paint?", False)):
        hits = index.retriever.search(question, 3)
        match = retrieval_match(hits, index.retriever.attainable(question))
        assert (match >= 0.2) == answered  # Jupiter: most terms; the Pope: only "planet"
        shown = format_answer(reader, question, [candidate], hits, {}, None, abstention)
        probability = float(sigmoid(-2 + 10 * match))
        assert f"retrieval match {match:.2f}" in shown and f"{probability:.2f}" in shown
        if answered:
            assert "A: fifth\n" in shown
        else:  # the reader score 5.10 is above today's threshold 5.09: refused all the same
            assert "A: (no answer found in the corpus: the best answer's probability of being " \
                   f"right {probability:.2f} is below this reader's threshold 0.50" in shown
            assert "best guess: fifth" in shown


def _matched(tool, qid: str, in_corpus: bool, score, exact: float, match: float):
    row = {"score": score, "EM": exact, "score_ir": score, "EM_ir": exact}
    return tool.QuestionRead(qid, in_corpus, {"logits": row}, match)


def test_calibration_fits_records_and_refits_the_logistic_rule(tmp_path):
    """Reader scores that overlap in and out of corpus, retrieval matches that do not. The
    threshold: in 5.0 (exact), 6.0 (exact), 4.0; out 5.5, 4.5; right decisions at 4.0: 2 + 0,
    4.5: 2 + 0, 5.0: 2 + 1, 5.5: 1 + 2, 6.0: 1 + 2, inf: 0 + 2: 3 of 5, first at 5.0. The
    logistic rule: 4 of 5 (the two exact answered, both out-of-corpus refused; the inexact
    in-corpus one answered too, as ties go to the lower threshold)."""
    tool = _tool()
    reads = [_matched(tool, "a", True, 5.0, 1.0, 0.6), _matched(tool, "b", True, 6.0, 1.0, 0.5),
             _matched(tool, "c", True, 4.0, 0.0, 0.55),
             _matched(tool, "d", False, 5.5, 0.0, 0.1), _matched(tool, "e", False, 4.5, 0.0, 0.2)]
    chosen = tool.thresholds_of(reads)["logits"]
    assert chosen["on_calibration"]["accuracy"] == pytest.approx(3 / 5)
    assert chosen["on_calibration_combined"]["accuracy"] == pytest.approx(4 / 5)
    assert chosen["on_calibration_combined_ir"]["refused_out"] == 1.0
    folder = tmp_path / "reader"
    folder.mkdir()
    manifest = folder / "dil_jax_manifest.json"
    manifest.write_text(
        (REPO / "dil_jax/assets/minilm-squad-full/dil_jax_manifest.json").read_text())
    # calibrate's file, refitted and recorded by `fit` without reading
    calibration = tmp_path / "calibration.json"
    calibration.write_text(json.dumps({"chosen_on": "test", "readers": {str(folder): {
        "questions": [dataclasses.asdict(read) for read in reads]}}}))
    assert tool.main(["fit", "--calibration", str(calibration), "--reader", str(folder),
                      "--record"]) == 0
    abstention = Abstention.from_manifest(json.loads(manifest.read_text()))
    assert abstention.logistic("logits", fused=True) == LogisticRule(**chosen["combined_ir"])
    rows = tool.measured(reads, abstention)
    assert rows["logits, with retrieval match"]["out_of_corpus_refused"] == 100.0
    assert rows["logits, with retrieval match"]["coverage"] == 100.0
    assert rows["logits, with retrieval match"]["EM_of_answered"] == pytest.approx(200 / 3)
    assert chosen["threshold"] == 5.0
    assert rows["logits"]["out_of_corpus_refused"] == 50.0  # 5.5 >= 5.0 gets through
    # Reads without a retrieval match (an older calibration file): thresholds only.
    old = tool.thresholds_of([_read(tool, "a", True, 2.0, 1.0), _read(tool, "c", False, 0.5, 0.0)])
    assert "combined" not in old["logits"]
    with pytest.raises(SystemExit, match="no questions recorded for --reader other"):
        tool.main(["fit", "--calibration", str(calibration), "--reader", "other"])


def test_a_rule_that_cannot_be_fitted_is_left_out_with_why():
    tool = _tool()
    # No exact answer at all: one class only; the threshold still is chosen (refuse all: +inf).
    row = tool.thresholds_of([_matched(tool, "a", True, 1.0, 0.0, 0.5),
                              _matched(tool, "c", False, 2.0, 0.0, 0.1)])["logits"]
    assert "combined" not in row and "combined_ir" not in row
    assert "both classes" in row["combined_not_recorded"]
