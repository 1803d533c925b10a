"""The official SQuAD metric against the published scores of leaderboard predictions."""

from __future__ import annotations

import json

import pytest

from dil_jax.data.squad import SquadExample, gold_answers, load_squad
from dil_jax.metrics.squad_metric import f1_score_v1, f1_score_v2, normalize_answer, squad_scores

from tests.helpers import V11, V20, squad_file

# Reference scores printed by the official scripts (../shared/data/README.md).
REFERENCES = [
    (V11, "predictions-bert-large-ensemble.35-articles.json",
     {"exact": "85.41493430899718", "f1": "91.96583691120684", "total": "6013"}),
    (V11, "predictions-rnet-ensemble.35-articles.json",
     {"exact": "82.3548977216032", "f1": "88.70065145841818", "total": "6013"}),
    (V20, "predictions-v2.0-bert-large-single.json",
     {"exact": "78.74168280973637", "f1": "81.77528052374727", "total": "11873",
      "HasAns_f1": "80.18183293833516", "NoAns_exact": "83.36417157275021"}),
]


@pytest.mark.parametrize("data_name,predictions_name,expected", REFERENCES,
                         ids=[r[1].split(".")[0] for r in REFERENCES])
def test_reproduces_official_scores_to_the_last_digit(data_name, predictions_name, expected):
    dataset = load_squad(squad_file(data_name), check_spans=False)
    predictions = json.loads(squad_file(predictions_name).read_text())
    scores = squad_scores(dataset.gold_answers, predictions, dataset.version)
    assert {key: repr(scores[key]) for key in expected} == expected


def test_v2_breakdown_counts():
    dataset = load_squad(squad_file(V20), check_spans=False)
    predictions = json.loads(squad_file("predictions-v2.0-bert-large-single.json").read_text())
    scores = squad_scores(dataset.gold_answers, predictions, dataset.version)
    assert (scores["HasAns_total"], scores["NoAns_total"]) == (5928, 5945)
    assert "missing" not in scores


def test_evaluate_cli_prints_reference_numbers(monkeypatch, capsys):
    from dil_jax import cli

    # Only this module's commands: the CLI imports every listed command module.
    monkeypatch.setattr(cli, "COMMAND_MODULES", ("dil_jax.commands.evaluate",))
    code = cli.main(["evaluate", "--data", str(squad_file(V11)), "--predictions",
                     str(squad_file("predictions-bert-large-ensemble.35-articles.json"))])
    out = capsys.readouterr().out
    assert code == 0
    assert '"exact": 85.41493430899718' in out and '"f1": 91.96583691120684' in out
    assert json.loads(out)["total"] == 6013


def test_evaluate_only_predicted_scores_a_limit_subset(tmp_path, monkeypatch, capsys):
    """Predictions of `predict --limit 100` scored EM 1.06 against all 6,013 questions, with
    only a warning; --only-predicted scores those 100: the leaderboard file's own answers for
    them, scored question by question here with the official per-question metric."""
    from dil_jax import cli
    from dil_jax.metrics.squad_metric import question_scores

    monkeypatch.setattr(cli, "COMMAND_MODULES", ("dil_jax.commands.evaluate",))
    dataset = load_squad(squad_file(V11), check_spans=False)
    full = json.loads(squad_file("predictions-bert-large-ensemble.35-articles.json").read_text())
    first = [example.qid for example in dataset.examples[:100]]
    subset = tmp_path / "subset.json"
    subset.write_text(json.dumps({qid: full[qid] for qid in first}))
    expected = [question_scores(dataset.gold_answers[qid], full[qid], "1.1") for qid in first]
    argv = ["evaluate", "--data", str(squad_file(V11)), "--predictions", str(subset)]
    assert cli.main(argv) == 0
    every = json.loads(capsys.readouterr().out)
    assert every["total"] == 6013 and every["missing"] == 5913
    assert cli.main([*argv, "--only-predicted"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert scored["total"] == 100 and "missing" not in scored
    assert scored["exact"] == pytest.approx(100 * sum(e for e, _ in expected) / 100)
    assert scored["f1"] == pytest.approx(100 * sum(f for _, f in expected) / 100)


def test_evaluate_cli_rejects_bad_predictions_file(tmp_path, monkeypatch, capsys):
    from dil_jax import cli

    monkeypatch.setattr(cli, "COMMAND_MODULES", ("dil_jax.commands.evaluate",))
    bad = tmp_path / "preds.json"
    bad.write_text('{"5725b33f6a3fe71400b8952d": 3}')
    assert cli.main(["evaluate", "--data", str(squad_file(V11)), "--predictions",
                     str(bad)]) == 1
    err = capsys.readouterr().err
    assert str(bad) in err and "5725b33f6a3fe71400b8952d" in err


def test_normalization_and_empty_answers():
    assert normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert normalize_answer("an apple, a pear") == "apple pear"
    # v1.1 gives 0 when nothing is shared, even both empty; v2.0 gives 1 for both empty.
    assert f1_score_v1("", "") == 0
    assert f1_score_v2("", "") == 1
    assert f1_score_v2("the", "") == 1  # "the" normalizes to nothing
    assert f1_score_v2("Denver", "") == 0
    assert f1_score_v1("Denver Broncos", "the Broncos") == pytest.approx(2 / 3)


def test_missing_predictions_score_zero_and_are_counted():
    examples = [SquadExample("a", "t", "x y", "q?", ("x",), (0,)),
                SquadExample("b", "t", "x y", "q?", ("y",), (2,))]
    scores = squad_scores(gold_answers(examples), {"a": "x"}, version="1.1")
    assert scores == {"exact": 50.0, "f1": 50.0, "total": 2, "missing": 1}
