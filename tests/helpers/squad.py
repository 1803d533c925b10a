"""The gold-label round trip through SQuAD featurization and the decoder: logits peaking at the
gold labels, and why a question still comes back wrong. The window settings are the BERT
tokenizer's test (tests/data/test_squad_features.py), which the other tokenizers' tests reuse."""

from __future__ import annotations

import collections

import numpy as np

from dil_jax.metrics.squad_metric import exact_score

Q_LEN, P_LEN, STRIDE = 64, 384, 128


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
