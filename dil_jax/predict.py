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

QANet and BiDAF (`load_char_reader`) take the same path through `CharPairGrid`: their
`encode_lower` (embedding + embedding encoder / contextual BiLSTM) once per question and per
distinct window, with each token's characters (`data.characters`), then `encode_upper` per pair.
They have no no-answer score (SQuAD v1.1 only) and read whole windows (no prescreening).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dil_jax.data.characters import SquadCharacters, squad_characters
from dil_jax.data.decoding import Prediction, answers, decode_predictions
from dil_jax.data.features import Features, featurize
from dil_jax.data.squad import SquadExample
from dil_jax.model.char_reader import CharReaderModel
from dil_jax.model.delayed import (
    DelayedInteractionModel,
    InputError,
    Params,
    check_segment_lengths,
)
from dil_jax.model.qanet_inputs import QANetSegment
from dil_jax.reading.char_grid import CharPairGrid
from dil_jax.reading.grid import PairGrid
from dil_jax.reading.pairs import SpanScores, kept_positions
from dil_jax.rounding import round_up

if TYPE_CHECKING:
    from dil_jax.checkpoints.readers import Reader

log = logging.getLogger(__name__)


def _pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
    return np.pad(array, ((0, rows - array.shape[0]),) + ((0, 0),) * (array.ndim - 1))


@functools.lru_cache(maxsize=8)
def pair_grid(model: DelayedInteractionModel | CharReaderModel, mesh, batch_size: int
              ) -> PairGrid | CharPairGrid:
    """The grid that reads for `model` (by identity) on `mesh` in batches of `batch_size`, one
    per combination: a `PairGrid` for the BERT family, a `CharPairGrid` for QANet / BiDAF. A
    grid compiles its programs per instance, and a training loop evaluates the same model object
    again and again: a new grid each time recompiled every program at every evaluation
    (tests/test_squad_predict.py counts the compilations)."""
    if isinstance(model, CharReaderModel):
        return CharPairGrid(model, mesh=mesh, batch_size=batch_size, chunk_size=batch_size)
    return PairGrid(model, mesh=mesh, batch_size=batch_size, chunk_size=batch_size)


def check_lengths(model: DelayedInteractionModel, max_question_len: int,
                  max_passage_len: int) -> None:
    """Raises InputError when the segments do not fit the model's position table
    (`dil_jax.model.delayed.check_segment_lengths`, naming the flags to change)."""
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
    read = np.ones(n_windows, bool) if keep is None else np.asarray(keep).any(axis=1)
    blocks = question_blocks(features, question_block, grid.batch_size, read)

    # Windows left unread (nothing kept) never decide an answer: spans -inf, null +inf.
    out = SpanScores.full(n_windows, p_len, -np.inf, np.inf)
    with tqdm(total=int(read.sum()), unit="window", disable=not progress,
              desc="reading") as bar:
        for block in blocks:
            q_ids, q_mask = block.question_rows(features.q_ids, features.q_mask)
            p_ids, p_mask = block.passage_rows(features.p_ids, features.p_mask)
            q_lower = grid.encode_questions(params, q_ids, q_mask)
            p_source = grid.passage_side(params, p_ids, p_mask)
            positions = None if keep is None else kept_positions(keep[block.rows])
            pairs = grid.read_pairs(params, q_lower, q_mask, p_source, p_mask, block.q_index,
                                    block.p_index, positions, on_chunk=bar.update)
            out.set_rows(block.rows, pairs)
    return out


@dataclasses.dataclass(frozen=True)
class QuestionBlock:
    """A block of questions and the windows read with them.

    q0, size: the block's questions are q0 .. q0 + size - 1 (the last block padded to `size`);
    rows: [n] the window rows read; passage: [n_distinct] one representative window row per
    distinct passage window of the block, padded to `passage_size` when read; q_index, p_index:
    [n] each window's question (from q0) and distinct passage (into `passage`).
    """

    q0: int
    size: int
    rows: np.ndarray
    passage: np.ndarray
    passage_size: int
    q_index: np.ndarray
    p_index: np.ndarray

    def question_rows(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """Each per-question array's rows of the block, padded to `size` rows."""
        return [_pad_rows(a[self.q0:self.q0 + self.size], self.size) for a in arrays]

    def passage_rows(self, *arrays: np.ndarray) -> list[np.ndarray]:
        """Each per-window array's rows of the block's distinct passages, padded to
        `passage_size` rows."""
        return [_pad_rows(a[self.passage], self.passage_size) for a in arrays]


def question_blocks(features: Features, question_block: int, batch_size: int,
                    read: np.ndarray) -> list[QuestionBlock]:
    """The questions of `features` in blocks of `question_block` (rounded up to `batch_size`),
    each with its windows among `read` ([n_windows] bool); blocks with no window to read are
    left out. Every block pads its questions and its distinct passages to the same counts, so
    one compiled shape reads them all."""
    q_block = round_up(min(question_block, features.num_questions), batch_size)
    parts = []
    for q0 in range(0, features.num_questions, q_block):
        rows = np.nonzero((features.example_index >= q0)
                          & (features.example_index < q0 + q_block) & read)[0]
        # One representative window row per distinct passage window of the block.
        _, first_row, p_index = np.unique(features.window_passage_index[rows],
                                          return_index=True, return_inverse=True)
        parts.append((q0, rows, rows[first_row], p_index.reshape(-1)))
    p_block = round_up(max(len(part[2]) for part in parts), batch_size)
    return [QuestionBlock(q0, q_block, rows, passage, p_block,
                          features.example_index[rows] - q0, p_index)
            for q0, rows, passage, p_index in parts if len(rows)]


def char_window_logits(model: CharReaderModel, variables: Params, features: Features,
                       characters: SquadCharacters, *, batch_size: int = 32,
                       question_block: int = 1024, progress: bool = True, mesh=None
                       ) -> SpanScores:
    """`window_logits` for a QANet / BiDAF: each question and each distinct passage window of
    a block once through `encode_lower` (`CharPairGrid`), every (question, window) pair through
    `encode_upper`. characters: `data.characters.squad_characters` of the same features."""
    from tqdm.auto import tqdm

    grid = pair_grid(model, mesh, batch_size)
    n_windows, p_len = features.p_ids.shape
    blocks = question_blocks(features, question_block, grid.batch_size,
                             np.ones(n_windows, bool))
    window_chars = characters.p_chars[characters.p_source]  # per window row, as p_ids
    out = SpanScores.full(n_windows, p_len, -np.inf, np.inf)
    with tqdm(total=n_windows, unit="window", disable=not progress, desc="reading") as bar:
        for block in blocks:
            q_ids, q_chars, q_mask = block.question_rows(features.q_ids, characters.q_chars,
                                                         features.q_mask)
            p_ids, p_chars, p_mask = block.passage_rows(features.p_ids, window_chars,
                                                        features.p_mask)
            q_state = grid.encode_questions(variables, QANetSegment(q_ids, q_chars, q_mask))
            p_state = grid.encode_passages(variables, QANetSegment(p_ids, p_chars, p_mask))
            pairs = grid.read_pairs(variables, q_state, q_mask, p_state, p_mask, block.q_index,
                                    block.p_index, on_chunk=bar.update)
            out.set_rows(block.rows, pairs)
    return out


def check_char_reader_options(reader: Reader, null_threshold: float | None,
                              prescreen: tuple | None) -> None:
    """Raises InputError for what a QANet / BiDAF cannot do: SQuAD 2.0's no-answer (it has no
    no-answer score) and sentence prescreening (its pair program reads whole windows)."""
    kind = reader.model.kind
    if null_threshold is not None:
        raise InputError(f"a {kind} reader has no no-answer score: it answers SQuAD v1.1 "
                         "files only (null_threshold must be None)")
    if prescreen is not None:
        raise InputError(f"sentence prescreening reads BERT-family readers only, not a {kind}")


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
    if reader.is_char_reader:
        check_char_reader_options(reader, null_threshold, prescreen)
    clock = time.perf_counter()
    max_question_len = reader.config.max_question_len
    if not reader.is_char_reader:
        check_lengths(reader.model, max_question_len, max_passage_len)
    features = featurize(examples, reader.tokenizer, max_question_len=max_question_len,
                         max_passage_len=max_passage_len, doc_stride=doc_stride,
                         cache_dir=cache_dir)
    characters = (squad_characters(examples, features, reader.tokenizer)
                  if reader.is_char_reader else None)
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
    if characters is not None:
        logits = char_window_logits(reader.model, reader.params, features, characters,
                                    batch_size=batch_size, question_block=question_block,
                                    progress=progress, mesh=mesh)
    else:
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
