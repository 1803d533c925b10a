"""EM / F1 of a QANet / BiDAF being trained: `config.eval.evaluator` for those kinds.

    config.eval.evaluator = "dil_jax.train.char_eval:evaluator"

The validation examples are featurized once (as `squad_data.evaluator`'s `predict_squad` does:
the same windows, question length and stride) with their characters (`data.characters`); each
evaluation reads them by `predict`'s own path (`window_logits`: each question and each distinct
passage window once through `encode_lower`, every pair through `encode_upper`, on the reader's
grid compiled once per model), decodes with the same
`decode_predictions` (max-context rule, n-best 20, answers up to 30 tokens, no null: SQuAD v1.1)
and scores with the official metric.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import ml_collections
import numpy as np

from dil_jax.data.characters import SquadCharacters
from dil_jax.data.features import Features
from dil_jax.data.squad import SquadExample
from dil_jax.errors import UsageError
from dil_jax.model.qanet import Variables

if TYPE_CHECKING:
    from dil_jax.readers.protocol import Reader

N_BEST, MAX_ANSWER_LENGTH = 20, 30  # predict_squad_spans' defaults


@dataclasses.dataclass(frozen=True)
class ValidationSet:
    """The validation examples featurized once: `features` (windows, offsets, max-context
    flags, for decoding) and their `characters`."""

    examples: list[SquadExample]
    features: Features
    characters: SquadCharacters


def validation_set(config: ml_collections.ConfigDict) -> ValidationSet:
    """The validation split of config.data, featurized as `predict` would (same windows)."""
    from dil_jax.data.characters import squad_characters
    from dil_jax.data.features import featurize
    from dil_jax.tokenization import load_tokenizer
    from dil_jax.train.squad_data import split_examples

    examples = split_examples(config.data, "validation")
    tokenizer = load_tokenizer(config.data.tokenizer)
    features = featurize(examples, tokenizer, max_question_len=config.model.max_question_len,
                         max_passage_len=config.data.max_passage_len,
                         doc_stride=config.data.doc_stride)
    characters = squad_characters(examples, features, tokenizer)
    return ValidationSet(list(examples), features, characters)


def scores(start_logits: np.ndarray, end_logits: np.ndarray, data: ValidationSet
           ) -> dict[str, float]:
    """{"exact", "f1"}: the official SQuAD v1.1 metric of the answers decoded from the span
    scores of every window of `data` (start, end: [n_windows, p_len]; the best span of a
    question's windows, decoded to its text)."""
    from dil_jax.data.decoding import answers, decode_predictions
    from dil_jax.data.squad import gold_answers
    from dil_jax.metrics.squad_metric import squad_scores

    start, end = start_logits, end_logits
    predictions = decode_predictions(data.examples, data.features, start, end, n_best=N_BEST,
                                     max_answer_length=MAX_ANSWER_LENGTH)
    result = squad_scores(gold_answers(data.examples), answers(predictions), version="1.1")
    return {"exact": float(result["exact"]), "f1": float(result["f1"])}


def evaluator(config: ml_collections.ConfigDict, student: Reader
              ) -> Callable[[Variables], dict[str, float]]:
    """factory(config, student) -> evaluate_fn(variables) -> {"exact", "f1"} on validation."""
    from dil_jax.data.squad import load_squad

    if not student.capabilities.reads_characters:
        raise UsageError(f"config.eval.evaluator = {config.eval.evaluator!r} reads QANet / "
                         "BiDAF only (config.model.kind 'qanet' or 'bidaf')")
    file_key = "validation_file" if config.data.get("validation_file") else "squad_file"
    if load_squad(config.data[file_key]).version == "2.0":
        raise UsageError(f"config.data.{file_key} = {config.data[file_key]!r} is SQuAD 2.0: a "
                         "QANet / BiDAF here has no no-answer score; validate on SQuAD v1.1")
    from dil_jax.predict import window_logits

    data = validation_set(config)
    batch_size = int(config.eval.batch_size)

    def evaluate(variables: Variables) -> dict[str, float]:
        read = window_logits(student.with_params(variables), data.features, data.characters,
                             batch_size=batch_size, progress=False)
        return scores(read.start_logits, read.end_logits, data)

    return evaluate
