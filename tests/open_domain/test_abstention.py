"""Abstention ("no answer found in the corpus"): the threshold choice against a hand count, the
manifest record, how an answer below it is shown, and that calibration refuses validation
articles (thresholds are chosen on training questions only)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from types import SimpleNamespace

import pytest

from dil_jax.open_domain.abstention import (
    Abstention,
    choose_threshold,
    exclude_titles,
    normalized_title,
)
from dil_jax.open_domain.reader import format_answer
from dil_jax.open_domain.retrieval.bm25 import Hit
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
