"""Extractive QA over featurized SQuAD-style examples with a delayed-interaction reader.

    reader = load_reader("dil_jax/assets/minilm-squad-full")   # dil_jax.readers
    predictions = predict_squad(reader, examples)                # qid -> answer text
    spans = predict_squad_spans(reader, examples)                # qid -> Prediction

The delayed-interaction path, in fixed-shape jitted steps (one compilation each):
  1. each question `[CLS] q [SEP]` once through `encode_lower`;
  2. each DISTINCT passage window once: `PairGrid.passage_side` (`encode_lower` for k > 0; with
     k = 0 a passage's positions follow its question, so the full model embeds it per pair);
  3. every (question, window) pair through `encode_upper` (`PairGrid.read_pairs`).
Questions are taken in blocks of `question_block`, padded to a fixed size, so memory is bounded by
a block whatever the data set size. The compiled steps are the reader's grid's
(`Reader.pair_grid`: `dil_jax.reading.grid.PairGrid` for the BERT family).

QANet and BiDAF take the same path through their `CharPairGrid`: their `encode_lower` (embedding
+ embedding encoder / contextual BiLSTM) once per question and per distinct window, with each
token's characters (`data.characters`, where the reader `reads_characters`), then
`encode_upper` per pair. What a reader cannot do is refused by its capabilities: a no-answer
score (SQuAD v1.1 only without one) and sentence prescreening.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dil_jax.data.characters import SquadCharacters, squad_characters
from dil_jax.data.decoding import Prediction, answers, decode_predictions
from dil_jax.data.features import Features, featurize
from dil_jax.data.squad import SquadExample
from dil_jax.model.delayed import InputError
from dil_jax.readers.protocol import TokenRows
from dil_jax.reading.pairs import SpanScores, kept_positions
from dil_jax.rounding import round_up

if TYPE_CHECKING:
    from dil_jax.readers.protocol import Reader

log = logging.getLogger(__name__)


# The grids `pair_grid` shares, by (model, mesh, batch size), the most recently read last.
_SHARED_GRIDS: dict[tuple[Any, Any, int], Any] = {}
SHARED_GRIDS_KEPT = 8


def pair_grid(reader: Reader, mesh, batch_size: int) -> Any:
    """The grid that reads for `reader`'s model (by identity) on `mesh` in batches of
    `batch_size`: the reader's own (`Reader.pair_grid`, `batch_size` pairs per chunk), made once
    per combination (the SHARED_GRIDS_KEPT most recently read are kept). A grid compiles its
    programs per instance, and a training loop evaluates the same model object again and again
    with new params (a new Reader each time): a new grid each time recompiled every program at
    every evaluation (tests/test_squad_predict.py counts the compilations)."""
    key = (reader.model, mesh, batch_size)
    grid = _SHARED_GRIDS.pop(key, None)
    if grid is None:
        grid = reader.pair_grid(mesh, batch_size, chunk_size=batch_size)
    _SHARED_GRIDS[key] = grid
    if len(_SHARED_GRIDS) > SHARED_GRIDS_KEPT:
        del _SHARED_GRIDS[next(iter(_SHARED_GRIDS))]
    return grid


def window_rows(features: Features, characters: SquadCharacters | None
                ) -> tuple[TokenRows, TokenRows]:
    """(questions [n_questions], windows [n_windows]) as the grid's two sides read them: the
    features' ids and masks, with each token's characters for a reader that reads them
    (`squad_characters` of the same features; a window's are its distinct passage's)."""
    if characters is None:
        return (TokenRows(features.q_ids, features.q_mask),
                TokenRows(features.p_ids, features.p_mask))
    return (TokenRows(features.q_ids, features.q_mask, characters.q_chars),
            TokenRows(features.p_ids, features.p_mask,
                      characters.p_chars[characters.p_source]))


def window_logits(reader: Reader, features: Features, characters: SquadCharacters | None = None,
                  *, batch_size: int = 32, question_block: int = 1024, progress: bool = True,
                  mesh=None, keep: np.ndarray | None = None) -> SpanScores:
    """Start/end/null scores of every window of `features` (see the module docstring):
    [n_windows, max_passage_len] span scores over passage tokens, [n_windows] `[CLS]` scores.

    characters: `squad_characters` of the same features, for a reader that reads characters.
    batch_size: rows per encode_lower batch and pairs per encode_upper chunk.
    question_block: questions (and their windows) per block; bounds memory.
    keep: [n_windows, p_len] bool, the tokens each window's pair reads in the upper blocks
    (sentence prescreening); the others score -inf, and a window with none is not read at all
    (its span scores -inf, its null scores +inf, so it never decides an answer).
    """
    from tqdm.auto import tqdm

    reader.check_lengths(features.q_ids.shape[1], features.p_ids.shape[1],
                         fix="lower --max-question-len or --max-passage-len")
    grid = pair_grid(reader, mesh, batch_size)
    n_windows, p_len = features.p_ids.shape
    read = np.ones(n_windows, bool) if keep is None else np.asarray(keep).any(axis=1)
    blocks = question_blocks(features, question_block, grid.batch_size, read)
    questions, windows = window_rows(features, characters)

    # Windows left unread (nothing kept) never decide an answer: spans -inf, null +inf.
    out = SpanScores.full(n_windows, p_len, -np.inf, np.inf)
    with tqdm(total=int(read.sum()), unit="window", disable=not progress,
              desc="reading") as bar:
        for block in blocks:
            q_rows, p_rows = block.question_rows(questions), block.passage_rows(windows)
            q_lower = reader.encode_questions(grid, q_rows)
            p_source = reader.passage_side(grid, p_rows)
            positions = None if keep is None else kept_positions(keep[block.rows])
            pairs = grid.read_pairs(reader.params, q_lower, q_rows.mask, p_source, p_rows.mask,
                                    block.q_index, block.p_index, positions,
                                    on_chunk=bar.update)
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

    def question_rows(self, questions: TokenRows) -> TokenRows:
        """The block's rows of every question's, padded to `size` rows."""
        return questions.take(slice(self.q0, self.q0 + self.size), self.size)

    def passage_rows(self, windows: TokenRows) -> TokenRows:
        """The block's distinct passages' rows of every window's, padded to `passage_size`
        rows."""
        return windows.take(self.passage, self.passage_size)


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


def check_reader_options(reader: Reader, null_threshold: float | None,
                         prescreen: tuple | None) -> None:
    """Raises InputError for what the reader cannot do: SQuAD 2.0's no-answer without a
    no-answer score, sentence prescreening where its pair program reads whole windows."""
    if null_threshold is not None and not reader.capabilities.null_score:
        raise InputError(f"a {reader.kind} reader has no no-answer score: it answers SQuAD "
                         "v1.1 files only (null_threshold must be None)")
    if prescreen is not None and not reader.capabilities.prescreening:
        raise InputError(f"sentence prescreening reads BERT-family readers only, not a "
                         f"{reader.kind}")


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
    check_reader_options(reader, null_threshold, prescreen)
    clock = time.perf_counter()
    max_question_len = reader.config.max_question_len
    reader.check_lengths(max_question_len, max_passage_len,
                         fix="lower --max-question-len or --max-passage-len")
    features = featurize(examples, reader.tokenizer, max_question_len=max_question_len,
                         max_passage_len=max_passage_len, doc_stride=doc_stride,
                         cache_dir=cache_dir)
    characters = (squad_characters(examples, features, reader.tokenizer)
                  if reader.capabilities.reads_characters else None)
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
    logits = window_logits(reader, features, characters, batch_size=batch_size,
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
