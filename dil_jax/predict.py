"""Extractive QA over featurized SQuAD-style examples with a delayed-interaction reader.

    reader = load_reader("dil_jax/assets/minilm-squad-full")   # dil_jax.checkpoints
    predictions = predict_squad(reader, examples)                # qid -> answer text
    spans = predict_squad_spans(reader, examples)                # qid -> Prediction

The delayed-interaction path, in fixed-shape jitted steps (one compilation each):
  1. each question `[CLS] q [SEP]` once through `encode_lower`;
  2. each DISTINCT passage window once: `PairGrid.passage_side` (`encode_lower` for k > 0; with
     k = 0 a passage's positions follow its question, so the full model embeds it per pair);
  3. every (question, window) pair through `encode_upper` (`PairGrid.read_pairs`).
Questions are taken in blocks of `question_block`, padded to a fixed size, so memory is bounded by
a block whatever the data set size. The compiled steps are `dil_jax.reading.grid.PairGrid`'s.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dil_jax.data.decoding import Prediction, answers, decode_predictions
from dil_jax.data.features import Features, featurize
from dil_jax.data.squad import SquadExample
from dil_jax.model.delayed import DelayedInteractionModel, Params, check_segment_lengths
from dil_jax.reading.grid import PairGrid
from dil_jax.reading.pairs import SpanScores, kept_positions
from dil_jax.rounding import round_up

if TYPE_CHECKING:
    from dil_jax.checkpoints.readers import Reader

log = logging.getLogger(__name__)


def _pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
    return np.pad(array, ((0, rows - array.shape[0]),) + ((0, 0),) * (array.ndim - 1))


@functools.lru_cache(maxsize=8)
def pair_grid(model: DelayedInteractionModel, mesh, batch_size: int) -> PairGrid:
    """The PairGrid that reads for `model` (by identity) on `mesh` in batches of `batch_size`,
    one per combination. A PairGrid compiles its programs per instance, and a training loop
    evaluates the same model object again and again: a new PairGrid each time recompiled
    every program at every evaluation (tests/test_squad_predict.py counts the compilations)."""
    return PairGrid(model, mesh=mesh, batch_size=batch_size, chunk_size=batch_size)


def check_lengths(model: DelayedInteractionModel, max_question_len: int,
                  max_passage_len: int) -> None:
    """Raises InputError when the segments do not fit the model's position table
    (`dil_jax.model.check_segment_lengths`, naming the flags to change)."""
    check_segment_lengths(model.config, max_question_len, max_passage_len,
                          fix="lower --max-question-len or --max-passage-len")


def window_logits(model: DelayedInteractionModel, params: Params, features: Features, *,
                  batch_size: int = 32, question_block: int = 1024, progress: bool = True,
                  mesh=None, keep: np.ndarray | None = None) -> SpanScores:
    """Start/end/null scores of every window of `features` (see the module docstring):
    [n_windows, max_passage_len] span scores over passage tokens, [n_windows] `[CLS]` scores.

    batch_size: rows per encode_lower batch and pairs per encode_upper chunk.
    question_block: questions (and their windows) per block; bounds memory.
    keep: [n_windows, p_len] bool, the tokens each window's pair reads in the upper blocks
    (sentence prescreening); the others score -inf, and a window with none is not read at all
    (its span scores -inf, its null scores +inf, so it never decides an answer).
    """
    from tqdm.auto import tqdm

    check_lengths(model, features.q_ids.shape[1], features.p_ids.shape[1])
    grid = pair_grid(model, mesh, batch_size)
    n_windows, p_len = features.p_ids.shape
    q_block = round_up(min(question_block, features.num_questions), grid.batch_size)
    blocks = []
    read = np.ones(n_windows, bool) if keep is None else np.asarray(keep).any(axis=1)
    for q0 in range(0, features.num_questions, q_block):
        rows = np.nonzero((features.example_index >= q0)
                          & (features.example_index < q0 + q_block) & read)[0]
        # One representative window row per distinct passage window of the block.
        _, first_row, p_index = np.unique(features.window_passage_index[rows],
                                                 return_index=True, return_inverse=True)
        blocks.append((q0, rows, rows[first_row], p_index.reshape(-1)))
    p_block = round_up(max(len(block[2]) for block in blocks), grid.batch_size)

    # Windows left unread (nothing kept) never decide an answer: spans -inf, null +inf.
    out = SpanScores.full(n_windows, p_len, -np.inf, np.inf)
    with tqdm(total=int(read.sum()), unit="window", disable=not progress,
              desc="reading") as bar:
        for q0, rows, passage_rows, p_index in blocks:
            if not len(rows):
                continue
            q_ids = _pad_rows(features.q_ids[q0:q0 + q_block], q_block)
            q_mask = _pad_rows(features.q_mask[q0:q0 + q_block], q_block)
            p_ids = _pad_rows(features.p_ids[passage_rows], p_block)
            p_mask = _pad_rows(features.p_mask[passage_rows], p_block)
            q_lower = grid.encode_questions(params, q_ids, q_mask)
            p_source = grid.passage_side(params, p_ids, p_mask)
            q_index = features.example_index[rows] - q0
            positions = None if keep is None else kept_positions(keep[rows])
            pairs = grid.read_pairs(params, q_lower, q_mask, p_source, p_mask, q_index,
                                      p_index, positions, on_chunk=bar.update)
            out.set_rows(rows, pairs)
    return out


def predict_squad(reader: Reader, examples: Sequence[SquadExample], **options: Any
                  ) -> dict[str, str]:
    """qid -> answer text for `examples` (the official predictions-file format); options are
    `predict_squad_spans`'."""
    return answers(predict_squad_spans(reader, examples, **options))


def predict_squad_spans(reader: Reader, examples: Sequence[SquadExample], *,
                        max_passage_len: int = 384,
                        doc_stride: int = 128, batch_size: int = 32, max_answer_length: int = 30,
                        n_best: int = 20, null_threshold: float | None = None,
                        progress: bool = True, cache_dir: str | None = None,
                        question_block: int = 1024, mesh=None, prescreen: tuple | None = None,
                        report: dict | None = None) -> dict[str, Prediction]:
    """qid -> Prediction (answer text, best span score, null score) for `examples`, read by
    `reader` (its model, params and tokenizer).

    The question length is the reader's `config.max_question_len`. null_threshold: None answers
    every question (SQuAD 1.1); a float enables SQuAD 2.0's no-answer ("" when null_score -
    best_span_score > null_threshold); math.inf keeps every best span but still records the
    null scores, to choose a threshold (`dil_jax.data.decoding.null_score_differences`).
    prescreen: (SentencePrescreener, SentenceRule) to read only the kept sentences of each
    context in the upper blocks (answers are still spans of the original context). report: a
    dict that receives the seconds of each phase (featurize, prescreen, read, decode), and with
    prescreening the `Screening` and the kept token share.
    """
    import time

    report = {} if report is None else report
    clock = time.perf_counter()
    max_question_len = reader.config.max_question_len
    check_lengths(reader.model, max_question_len, max_passage_len)
    features = featurize(examples, reader.tokenizer, max_question_len=max_question_len,
                         max_passage_len=max_passage_len, doc_stride=doc_stride,
                         cache_dir=cache_dir)
    report["featurize_seconds"] = time.perf_counter() - clock
    keep = None
    if prescreen is not None:
        from dil_jax.prescreening.prescreener import screen_features

        clock = time.perf_counter()
        screening = screen_features(*prescreen, examples, features)
        keep = screening.keep
        report["prescreen_seconds"] = time.perf_counter() - clock
        report["screening"] = screening
        report["kept_token_share"] = float(keep.sum() / max(features.p_mask.sum(), 1))
    clock = time.perf_counter()
    logits = window_logits(reader.model, reader.params, features, batch_size=batch_size,
                           question_block=question_block, progress=progress, mesh=mesh,
                           keep=keep)
    report["read_seconds"] = time.perf_counter() - clock
    clock = time.perf_counter()
    with_null = null_threshold is not None
    predictions = decode_predictions(
        examples, features, logits.start_logits, logits.end_logits,
        logits.null_start_logits if with_null else None,
        logits.null_end_logits if with_null else None, n_best=n_best,
        max_answer_length=max_answer_length,
        null_threshold=null_threshold if with_null else 0.0)
    report["decode_seconds"] = time.perf_counter() - clock
    return predictions
