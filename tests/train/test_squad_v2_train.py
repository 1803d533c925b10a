"""SQuAD v2.0 training: the null threshold chosen on training questions, recorded by the exported
reader and used by `dil-jax predict`; the ",v2" suffix of configs/minilm_squad.py."""

from __future__ import annotations

import json
import logging
import math

import pytest

from dil_jax.data.decoding import Prediction, null_score_differences
from dil_jax.data.squad import SquadExample, gold_answers
from dil_jax.errors import UsageError
from dil_jax.metrics.squad_metric import best_null_threshold
from dil_jax.train.config_files import load_config_file
from dil_jax.train.squad_data import spread_subset

from tests.helpers import REPO, run_cli
from tests.helpers.training import tiny_config


def example(qid: str, *answers: str) -> SquadExample:
    context = "blue sky green tree big dog red cat"
    return SquadExample(qid, "t", context, "?", answers,
                        tuple(context.index(a) for a in answers), not answers)


# --------------------------------------------------------------------------- (a) the threshold

def test_best_null_threshold_by_hand():
    examples = [example("q1", "blue sky"), example("q2"), example("q3", "green tree"),
                example("q4"), example("q5", "big dog")]
    spans = {"q1": "blue sky", "q2": "red", "q3": "green", "q4": "cat", "q5": "red cat"}
    differences = {"q1": -2.0, "q2": 1.0, "q3": 0.5, "q4": 3.0, "q5": 4.0}
    # Everything "" scores the two unanswerable ones: F1 sum 2. Answering in order of difference:
    #   q1 (-2.0): + F1("blue sky") = 1        -> 3
    #   q3 ( 0.5): + F1("green" vs "green tree") = 2 * 1 * 0.5 / 1.5 = 2/3 -> 3 2/3  (best)
    #   q2 ( 1.0): "red" where "" was right: -1 -> 2 2/3
    #   q4 ( 3.0): -1 -> 1 2/3;  q5 (4.0): F1 0 -> 1 2/3
    threshold, f1 = best_null_threshold(gold_answers(examples), spans, differences)
    assert threshold == 0.5
    assert f1 == pytest.approx(100 * (3 + 2 / 3) / 5)


def test_best_null_threshold_answers_ties_together_and_can_null_everything():
    examples = [example("a", "blue sky"), example("b")]
    # Equal differences: no threshold answers "a" without "b"; together they gain 1 - 1 = 0 over
    # all-"" (F1 sum 1: "b"), so nulling everything stays best: a threshold below 1.0.
    threshold, f1 = best_null_threshold(gold_answers(examples), {"a": "blue sky", "b": "dog"},
                                        {"a": 1.0, "b": 1.0})
    assert threshold == 0.0 and f1 == 50.0
    # Only unanswerable questions with non-empty spans: answer none.
    threshold, f1 = best_null_threshold(gold_answers([example("b"), example("c")]),
                                        {"b": "dog", "c": "cat"},
                                        {"b": 2.0, "c": -3.0})
    assert threshold == -4.0 and f1 == 100.0


def test_null_score_differences_and_spread_subset():
    predictions = {"x": Prediction("dog", 2.0, 5.0), "y": Prediction("", -math.inf, 1.0)}
    assert null_score_differences(predictions) == {"x": 3.0, "y": math.inf}
    with pytest.raises(ValueError, match="no null score"):
        null_score_differences({"z": Prediction("dog", 2.0)})
    items = [example(f"q{i}") for i in range(10)]
    # floor(i * 10 / 4) for i < 4: 0, 2, 5, 7.
    assert [e.qid for e in spread_subset(items, 4)] == ["q0", "q2", "q5", "q7"]
    assert spread_subset(items, -1) == items and spread_subset(items, 20) == items


def test_recorded_threshold_is_read_and_checked(tmp_path):
    from dil_jax.checkpoints import CheckpointError, resolve_reader_checkpoint
    from dil_jax.commands.predict import choose_null_threshold

    def recorded_null_threshold(folder: str) -> float | None:
        return resolve_reader_checkpoint(folder).recorded_null_threshold()

    record = tmp_path / "trained_from.json"
    assert recorded_null_threshold(str(tmp_path)) is None  # no record: not a trained reader
    record.write_text(json.dumps({"step": 2}))
    assert recorded_null_threshold(str(tmp_path)) is None  # a v1.1 run chose none
    record.write_text(json.dumps({"step": 2, "null_threshold": -1.5}))
    assert recorded_null_threshold(str(tmp_path)) == -1.5
    for bad in ('"high"', "NaN", "true"):
        record.write_text('{"null_threshold": ' + bad + '}')
        with pytest.raises(CheckpointError, match="trained_from.json: 'null_threshold'"):
            recorded_null_threshold(str(tmp_path))
    assert choose_null_threshold("1.1", 2.0, -1.5)[0] is None  # v1.1: always an answer
    assert choose_null_threshold("2.0", 2.0, -1.5)[0] == 2.0
    assert choose_null_threshold("2.0", None, -1.5)[0] == -1.5
    assert choose_null_threshold("2.0", None, None)[0] == 0.0


# --------------------------------------------------------------------------- (c) the config

def test_v2_suffix_of_the_minilm_config(capsys):
    config_file = f"{REPO}/configs/minilm_squad.py"
    for variant in ("full", "k4", "k4_distill"):
        v1 = load_config_file(f"{config_file}:{variant}")
        v2 = load_config_file(f"{config_file}:{variant},v2")
        assert v1.data.squad_file.endswith("dev-v1.1.35-articles.json")
        assert v2.data.squad_file.endswith("dev-v2.0.json")
        assert v2.workdir == f"runs/minilm_squad_{variant}_v2"
        assert v2.model.num_lower_layers == v1.model.num_lower_layers
        assert v2.eval.threshold_questions == 1000
    assert load_config_file(f"{config_file}:k4_distill,v2").teacher.checkpoint == (
        "runs/minilm_squad_full_v2/params")
    for spec, named in (("full,v3", "unknown suffix 'v3'"), ("full,", "unknown suffix ''"),
                        ("k4,v2,v2", "repeated suffix"),
                        ("k7,v2", "unknown variant 'k7'")):
        with pytest.raises(UsageError, match=named):
            load_config_file(f"{config_file}:{spec}")
    status, _, err = run_cli(["train", "--config", f"{config_file}:full,V2", "--print-config"],
                             capsys)
    assert status == 1 and "unknown suffix 'V2'" in err and "Traceback" not in err


def test_threshold_questions_is_checked_by_key(tmp_path, capsys):
    status, _, err = run_cli(["train", "--config", f"{REPO}/configs/tiny.py",
                              f"--config.workdir={tmp_path / 'run'}",
                              "--config.eval.threshold_questions=0"], capsys)
    assert status == 1 and "config.eval.threshold_questions = 0" in err
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- (b) end to end

CONTEXTS = [
    "The river Nile flows north through Egypt and reaches the sea near Alexandria.",
    "Mount Fuji is the highest mountain in Japan and last erupted in 1707.",
    "Paris is the capital of France and sits on the river Seine.",
]
QUESTIONS = [  # (article, question, answer or None)
    (0, "Which way does the Nile flow?", "north"),
    (0, "Which country does the Nile cross?", "Egypt"),
    (0, "Who built the first dam on the Amazon?", None),
    (1, "When did Mount Fuji last erupt?", "1707"),
    (1, "How tall is Mount Everest?", None),
    (2, "Which river runs through Paris?", "Seine"),
    (2, "What is the capital of Spain?", None),
]


def write_v2_file(path) -> None:
    articles = []
    for index, context in enumerate(CONTEXTS):
        qas = []
        for n, (article, question, answer) in enumerate(QUESTIONS):
            if article != index:
                continue
            answers = [] if answer is None else [{"text": answer,
                                                  "answer_start": context.index(answer)}]
            qas.append({"id": f"q{n}", "question": question, "answers": answers,
                        "is_impossible": answer is None})
        articles.append({"title": f"article {index}",
                         "paragraphs": [{"context": context, "qas": qas}]})
    path.write_text(json.dumps({"version": "v2.0", "data": articles}))


def test_v2_run_records_its_threshold_and_predict_uses_it(tmp_path, hf_folder_factory, capsys,
                                                           caplog):
    from dil_jax.data.decoding import answers
    from dil_jax.data.squad import load_squad
    from dil_jax.predict import predict_squad_spans
    from dil_jax.readers import load_reader
    from dil_jax.train.loop import train

    folder, _ = hf_folder_factory("bert", vocab_size=30522)  # the default tokenizer's vocabulary
    data = tmp_path / "v2.json"
    write_v2_file(data)
    config = tiny_config(tmp_path / "run", {
        "model.checkpoint": folder, "model.num_lower_layers": 2, "model.max_question_len": 16,
        "data.featurizer": "dil_jax.train.squad_data:featurize", "data.squad_file": data,
        "data.tokenizer": "default", "data.train_articles": "0:2",
        "data.validation_articles": "2:3", "data.max_passage_len": 16, "data.doc_stride": 8,
        "eval.evaluator": "dil_jax.train.squad_data:evaluator", "eval.threshold_questions": 3,
        "eval.batch_size": 4, "batch_size": 4, "num_train_steps": 2,
        "checkpoint.every_steps": 1, "checkpoint.best_metric": "f1",
        "checkpoint.best_mode": "max", "log.every_steps": 1})
    result = train(config)
    assert result.best_step in (1, 2)
    evals = {row["step"]: row for row in map(json.loads, (tmp_path / "run" / "metrics.jsonl")
                                             .read_text().splitlines())
             if row.get("split") == "eval"}
    assert set(evals) == {1, 2}
    for row in evals.values():  # validation: one answerable, one unanswerable question
        assert {"exact", "f1", "HasAns_f1", "NoAns_f1", "null_threshold"} <= set(row)
        assert row["f1"] == pytest.approx((row["HasAns_f1"] + row["NoAns_f1"]) / 2)
    params = tmp_path / "run" / "params"
    record = json.loads((params / "trained_from.json").read_text())
    # The exported step's threshold, as its evaluation chose it.
    assert record["step"] == result.best_step
    assert record["null_threshold"] == evals[result.best_step]["null_threshold"]
    # ...chosen on training questions: eval.threshold_questions = 3 of the 5 training ones,
    # floor(i * 5 / 3) = q0, q1, q3 (never the validation articles' q5, q6).
    reader = load_reader(str(params), None, 16, "default")
    subset = [e for e in load_squad(data).examples if e.qid in ("q0", "q1", "q3")]
    spans = predict_squad_spans(reader, subset, max_passage_len=16, doc_stride=8, batch_size=4,
                                null_threshold=math.inf, progress=False)
    differences = null_score_differences(spans)
    threshold, _ = best_null_threshold(gold_answers(subset), answers(spans), differences)
    assert record["null_threshold"] == pytest.approx(threshold, abs=1e-4)

    def predict(threshold: float, *flags: str, used: str) -> dict[str, str]:
        record["null_threshold"] = threshold
        (params / "trained_from.json").write_text(json.dumps(record))
        output = tmp_path / f"predictions{len(flags)}{threshold}.json"
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="dil_jax.commands.predict"):
            status, _, err = run_cli(["predict", "--checkpoint", str(params), "--tokenizer",
                                      "default", "--data", str(data), "--output", str(output),
                                      "--max-passage-len", "16", "--doc-stride", "8",
                                      "--no-progress", *flags], capsys)
        assert status == 0, err
        assert used in caplog.text
        return json.loads(output.read_text())

    # "" when null_score - best_span_score > threshold: a very negative threshold nulls every
    # question, a very large one none.
    everything_null = predict(-1e9, used="null threshold -1e+09 (recorded by the reader")
    assert list(everything_null) == [f"q{n}" for n in range(len(QUESTIONS))]
    assert set(everything_null.values()) == {""}
    never_null = predict(1e9, used="null threshold 1e+09 (recorded by the reader")
    assert all(answer and answer in CONTEXTS[QUESTIONS[int(qid[1:])][0]]
               for qid, answer in never_null.items())
    # --null-threshold wins over the recorded one.
    assert predict(-1e9, "--null-threshold", "1e9",
                   used="null threshold 1e+09 (--null-threshold)") == never_null
    # A reader that records none: 0.0, said so.
    del record["null_threshold"]
    (params / "trained_from.json").write_text(json.dumps(record))
    with caplog.at_level(logging.INFO, logger="dil_jax.commands.predict"):
        status, _, err = run_cli(["predict", "--checkpoint", str(params), "--tokenizer",
                                  "default", "--data", str(data), "--output",
                                  str(tmp_path / "none.json"), "--max-passage-len", "16",
                                  "--doc-stride", "8", "--no-progress"], capsys)
    assert status == 0, err
    assert "null threshold 0 (the default: the reader records none)" in caplog.text
    # The export records the windows the run featurized (16 / 8), and `predict` without window
    # flags reads with them: the answers of the same call with the flags given.
    assert record["windows"] == {"max_passage_len": 16, "doc_stride": 8}
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dil_jax.commands.predict"):
        status, _, err = run_cli(["predict", "--checkpoint", str(params), "--tokenizer",
                                  "default", "--data", str(data), "--output",
                                  str(tmp_path / "recorded.json"), "--no-progress"], capsys)
    assert status == 0, err
    assert "passage windows of 16 tokens every 8 (the reader's training windows" in caplog.text
    assert (json.loads((tmp_path / "recorded.json").read_text())
            == json.loads((tmp_path / "none.json").read_text()))
    # The export holds the run's tokenizer files (data.tokenizer "default"): read without
    # --tokenizer, the same answers (a training export used to need `--tokenizer default`,
    # which nothing told the user).
    assert (params / "tokenizer.json").is_file()
    status, _, err = run_cli(["predict", "--checkpoint", str(params), "--data", str(data),
                              "--output", str(tmp_path / "own.json"), "--no-progress"], capsys)
    assert status == 0, err
    assert (json.loads((tmp_path / "own.json").read_text())
            == json.loads((tmp_path / "none.json").read_text()))
