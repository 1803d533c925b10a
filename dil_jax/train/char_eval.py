"""EM / F1 of a QANet / BiDAF being trained: `config.eval.evaluator` for those kinds.

    config.eval.evaluator = "dil_jax.train.char_eval:evaluator"

The validation examples are featurized once (as `squad_data.evaluator`'s `predict_squad` does:
the same windows, question length and stride) with their characters (`char_data`); each
evaluation reads every (question, window) pair whole with the step's variables (one jitted
program, fixed batch), decodes with the same `decode_predictions` (max-context rule, n-best 20,
answers up to 30 tokens, no null: SQuAD v1.1) and scores with the official metric.

A minimal path on purpose: no passage cache and no `PairGrid`. Reading QANet's passage side once
per distinct window (its `encode_lower`) belongs to the reader API of issue 40 (docs/qanet.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from dil_jax.data.features import Features
from dil_jax.data.squad import SquadExample
from dil_jax.errors import UsageError
from dil_jax.model.char_reader import CharReaderModel
from dil_jax.model.qanet import Variables

N_BEST, MAX_ANSWER_LENGTH = 20, 30  # predict_squad_spans' defaults


def pair_batches(num_pairs: int, batch_size: int) -> list[np.ndarray]:
    """Row indices [batch_size] per batch covering 0..num_pairs-1; the last batch is filled
    with row 0 (its outputs are dropped), so one compiled shape reads them all."""
    batches = []
    for begin in range(0, num_pairs, batch_size):
        rows = np.arange(begin, begin + batch_size)
        batches.append(np.where(rows < num_pairs, rows, 0))
    return batches


def window_logits(read: Callable[..., Any], variables: Variables, arrays: dict[str, np.ndarray],
                  batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and end logits [n_windows, p_len] of every (question, window) pair.

    read: jitted (variables, batch dict) -> ReaderOutput; arrays: "q_ids", "q_mask", "q_chars"
    per question, "p_ids", "p_mask" per window, "p_chars" per distinct window, "example_index"
    and "p_source" per window.
    """
    n_windows = len(arrays["p_ids"])
    starts, ends = [], []
    for rows in pair_batches(n_windows, batch_size):
        q = arrays["example_index"][rows]
        batch = {"q_ids": arrays["q_ids"][q], "q_mask": arrays["q_mask"][q],
                 "q_chars": arrays["q_chars"][q], "p_ids": arrays["p_ids"][rows],
                 "p_mask": arrays["p_mask"][rows],
                 "p_chars": arrays["p_chars"][arrays["p_source"][rows]]}
        out = read(variables, batch)
        starts.append(np.asarray(out.start_logits))
        ends.append(np.asarray(out.end_logits))
    return (np.concatenate(starts)[:n_windows], np.concatenate(ends)[:n_windows])


@dataclasses.dataclass(frozen=True)
class ValidationSet:
    """The validation examples featurized once: `features` (windows, offsets, max-context
    flags, for decoding) and `arrays`, what `window_logits` reads (ids, masks, characters)."""

    examples: list[SquadExample]
    features: Features
    arrays: dict[str, np.ndarray]


def validation_set(config: ml_collections.ConfigDict) -> ValidationSet:
    """The validation split of config.data, featurized as `predict` would (same windows)."""
    from dil_jax.data.features import featurize
    from dil_jax.tokenization import load_tokenizer
    from dil_jax.train.char_data import squad_characters
    from dil_jax.train.squad_data import split_examples

    examples = split_examples(config.data, "validation")
    tokenizer = load_tokenizer(config.data.tokenizer)
    features = featurize(examples, tokenizer, max_question_len=config.model.max_question_len,
                         max_passage_len=config.data.max_passage_len,
                         doc_stride=config.data.doc_stride)
    q_chars, p_chars, p_source = squad_characters(examples, features, tokenizer)
    arrays = {"q_ids": features.q_ids, "q_mask": features.q_mask, "q_chars": q_chars,
              "p_ids": features.p_ids, "p_mask": features.p_mask, "p_chars": p_chars,
              "example_index": features.example_index, "p_source": p_source}
    return ValidationSet(list(examples), features, arrays)


def scores(read: Callable[..., Any], variables: Variables, data: ValidationSet,
           batch_size: int) -> dict[str, float]:
    """{"exact", "f1"}: the official SQuAD v1.1 metric of the answers `read` gives (every
    window read, the best span of a question's windows decoded to its text)."""
    from dil_jax.data.decoding import answers, decode_predictions
    from dil_jax.data.squad import gold_answers
    from dil_jax.metrics.squad_metric import squad_scores

    start, end = window_logits(read, variables, data.arrays, batch_size)
    predictions = decode_predictions(data.examples, data.features, start, end, n_best=N_BEST,
                                     max_answer_length=MAX_ANSWER_LENGTH)
    result = squad_scores(gold_answers(data.examples), answers(predictions), version="1.1")
    return {"exact": float(result["exact"]), "f1": float(result["f1"])}


def evaluator(config: ml_collections.ConfigDict, model: CharReaderModel
              ) -> Callable[[Variables], dict[str, float]]:
    """factory(config, model) -> evaluate_fn(variables) -> {"exact", "f1"} on validation."""
    from dil_jax.data.squad import load_squad

    if not isinstance(model, CharReaderModel):
        raise UsageError(f"config.eval.evaluator = {config.eval.evaluator!r} reads QANet / "
                         "BiDAF only (config.model.kind 'qanet' or 'bidaf')")
    file_key = "validation_file" if config.data.get("validation_file") else "squad_file"
    if load_squad(config.data[file_key]).version == "2.0":
        raise UsageError(f"config.data.{file_key} = {config.data[file_key]!r} is SQuAD 2.0: a "
                         "QANet / BiDAF here has no no-answer score; validate on SQuAD v1.1")
    data = validation_set(config)
    batch_size = int(config.eval.batch_size)

    @jax.jit
    def read(variables, batch):
        return model(variables, batch["q_ids"], batch["q_chars"], batch["q_mask"],
                     batch["p_ids"], batch["p_chars"], batch["p_mask"])

    return lambda variables: scores(read, variables, data, batch_size)
