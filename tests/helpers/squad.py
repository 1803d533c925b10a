"""SQuAD files and reads of the tests: a one-question file and `dil-jax predict` of it; the
gold-label round trip through SQuAD featurization and the decoder (logits peaking at the gold
labels, and why a question still comes back wrong). The window settings are the BERT
tokenizer's test (tests/data/test_squad_features.py), which the other tokenizers' tests reuse."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np

from dil_jax.metrics.squad_metric import exact_score

from tests.helpers import run_cli

EIFFEL = "The Eiffel Tower is in Paris. It was built in 1889."

Q_LEN, P_LEN, STRIDE = 64, 384, 128


def one_question_squad(folder: Path, context: str = EIFFEL,
                       question: str = "When was the tower built?") -> Path:
    """`folder/squad.json`: a one-question SQuAD v1.1 file (question id "q1"), its answer "1889"
    (which `context` must hold)."""
    data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{
        "context": context, "qas": [{"id": "q1", "question": question,
                                     "answers": [{"text": "1889",
                                                  "answer_start": context.index("1889")}]}]}]}]}
    path = folder / "squad.json"
    path.write_text(json.dumps(data))  # ensure_ascii: a lone surrogate is written as \\ud800
    return path


def predict_one_question(checkpoint: str | Path, tmp_path: Path, capsys, *flags: str,
                         squad: Path | None = None) -> tuple[int, str, Path]:
    """`dil-jax predict --checkpoint CHECKPOINT --no-progress FLAGS` of `squad` (default: a
    fresh `one_question_squad` in `tmp_path`) -> (status, stderr, the predictions' path)."""
    output = tmp_path / "predictions.json"
    status, _, err = run_cli(["predict", "--checkpoint", str(checkpoint), "--data",
                              str(squad or one_question_squad(tmp_path)), "--output", str(output),
                              "--no-progress", *flags], capsys)
    return status, err, output


def gold_logits(features) -> tuple[np.ndarray, np.ndarray]:
    """Logits peaking at the gold labels (+10 there, -10 elsewhere, -10 everywhere without one)."""
    column = np.arange(features.p_ids.shape[1])[None, :]
    start = np.where(column == features.start_positions[:, None], 10.0, -10.0)
    end = np.where(column == features.end_positions[:, None], 10.0, -10.0)
    return start, end


def explain_failures(examples, features, predicted) -> collections.Counter:
    """How many questions the gold round trip got wrong, by reason (printing the first five of
    each): no window holds the answer, its start is not max-context, or a token boundary."""
    reasons: collections.Counter = collections.Counter()
    for index, example in enumerate(examples):
        text = predicted[example.qid]
        if max(exact_score(text, gold) for gold in example.answer_texts):
            continue
        rows = np.nonzero(features.example_index == index)[0]
        labelled = [w for w in rows if features.start_positions[w] >= 0]
        if not labelled:
            why = "no window holds a whole answer (or no answer covers a token)"
        elif not any(features.max_context[w, features.start_positions[w]] for w in labelled):
            why = "answer start is not max-context in any window holding the answer"
        else:
            why = "tokenizer boundary: the gold text starts or ends inside a token"
        reasons[why] += 1
        if reasons[why] <= 5:
            start = example.answer_starts[0]
            print(f"  {example.qid}: predicted {text!r}, gold {sorted(set(example.answer_texts))}"
                  f" ({why}; context ...{example.context[max(0, start - 15):start + 40]!r}...)")
    return reasons
