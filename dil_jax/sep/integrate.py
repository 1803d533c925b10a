"""Reading only the prescreened sentences: top-m sentences of each passage, answers mapped back.

The reduced passage is the kept sentences, verbatim and in their original order, joined by one
space; `offset_map[i]` is the original character of reduced character `i`, so a span the reader
finds in the reduced passage maps back to the original one (a span across a join maps to the
original characters from its first to its last, which then include the dropped text between).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np

from dil_jax.data.squad import SquadExample


def reduce_context(context: str, spans: Sequence[tuple[int, int]],
                   keep: Sequence[int]) -> tuple[str, np.ndarray]:
    """(reduced text, [len(reduced)] original character index of each reduced character)."""
    pieces, mapping = [], []
    for n, index in enumerate(sorted(keep)):
        start, end = spans[index]
        if n:
            pieces.append(" ")
            mapping.append(start - 1 if start > 0 else 0)  # the join: a char just before
        pieces.append(context[start:end])
        mapping.extend(range(start, end))
    return "".join(pieces), np.asarray(mapping, dtype=np.int64)


def map_span_back(offset_map: np.ndarray, start: int, end: int) -> tuple[int, int]:
    """A [start, end) span of the reduced text -> [start, end) in the original text."""
    if end <= start:
        return -1, -1
    return int(offset_map[start]), int(offset_map[end - 1]) + 1


@dataclasses.dataclass
class Prescreened:
    examples: list[SquadExample]      # the same questions over reduced contexts
    offset_maps: list[np.ndarray]
    kept_answer_sentence: np.ndarray  # [n] bool: the gold answer's sentence was kept


def prescreen_examples(examples: Sequence[SquadExample], spans: Sequence[Sequence[tuple]],
                       scores: np.ndarray, labels: np.ndarray, top_m: int) -> Prescreened:
    """Keeps each example's top_m scored sentences. scores: [n, S]; labels: [n]."""
    reduced, maps, kept = [], [], []
    for example, example_spans, row, label in zip(examples, spans, scores, labels,
                                                  strict=True):
        order = np.argsort(-row[:len(example_spans)], kind="stable")[:top_m]
        text, offset_map = reduce_context(example.context, example_spans, order.tolist())
        reduced.append(dataclasses.replace(example, context=text, answer_texts=(),
                                           answer_starts=()))
        maps.append(offset_map)
        kept.append(int(label) in order.tolist())
    return Prescreened(reduced, maps, np.asarray(kept))


def timed_predict(model, params, tokenizer, examples, **kwargs) -> tuple[dict[str, str], float]:
    from dil_jax.predict import predict_squad

    started = time.perf_counter()
    answers = predict_squad(model, params, tokenizer, examples, progress=False, **kwargs)
    return answers, time.perf_counter() - started
