"""Featurization of SQuAD examples for delayed interaction: question segments and passage windows.

Each example gives ONE question segment `[CLS] q [SEP]` (padded to max_question_len) and one or
more passage windows `p_window [SEP]` of at most max_passage_len - 1 context tokens, taken every
`doc_stride` tokens and padded to max_passage_len. A window points at its question through
`example_index` (the row of q_ids is the example's index), so a question is encoded once however
many windows it has, and at its distinct passage window through `window_passage_index` (windows
depend only on the context, so the questions of one paragraph share them: with k > 0 each is
encoded once).

The full model (k = 0) and a delayed one read exactly these arrays.

Labels are token indices inside the passage window, or -1 when the window does not hold the whole
answer or the question is unanswerable (training maps -1 to the [CLS] / null logit).

Everything is tokenized in two batched fast-tokenizer calls (distinct contexts once, since
paragraphs repeat across questions; all questions), and windowing, the max-context rule and the
label mapping are numpy array operations.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import itertools
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dil_jax.atomic import write_atomic
from dil_jax.data.squad import SquadExample
from dil_jax.errors import DilJaxError, OutputPathError
from dil_jax.rounding import ceil_div
from dil_jax.tokenization import NO_OFFSET, encode_questions

log = logging.getLogger(__name__)

# Bump when the meaning or layout of the arrays changes: old cache files then stop matching.
# (Dropping an array needs no bump: old files still hold every field, and extra ones are ignored.)
FEATURE_FORMAT = 1
# The label of a window that does not hold the whole answer (or of an unanswerable question);
# training points it at the null ([CLS]) logit: label 0 of the [null, passage...] distribution.
NO_ANSWER = -1


class FeaturizationError(DilJaxError, ValueError):
    """Lengths that cannot make windows, or a tokenizer that gives no usable offsets."""


@dataclasses.dataclass
class Features:
    """Model inputs and labels of a list of examples (numpy arrays).

    Questions (one per example, in example order):
      q_ids, q_mask: [n_questions, max_question_len] int32, `[CLS] q [SEP]` + padding.
    Windows (grouped by example, in example order):
      p_ids, p_mask: [n_windows, max_passage_len] int32, `p_window [SEP]` + padding.
      offsets: [n_windows, max_passage_len, 2] int32 character [start, end) of each token in the
        example's context; NO_OFFSET (-1) for [SEP] and padding.
      max_context: [n_windows, max_passage_len] bool, the token has its most central position in
        this window (BERT's max-context rule); False for [SEP] and padding.
      start_positions, end_positions: [n_windows] int32 answer token indices inside the window,
        or -1 (no whole answer in this window, or unanswerable).
      example_index: [n_windows] int32 index of the window's example, which is also the row of
        q_ids of its question (one question per example).
      window_passage_index: [n_windows] int32 id of the distinct (context, window start): equal
        ids mean identical p_ids rows.
      window_start: [n_windows] int32 first context token of the window.
    """

    q_ids: np.ndarray
    q_mask: np.ndarray
    p_ids: np.ndarray
    p_mask: np.ndarray
    offsets: np.ndarray
    max_context: np.ndarray
    start_positions: np.ndarray
    end_positions: np.ndarray
    example_index: np.ndarray
    window_passage_index: np.ndarray
    window_start: np.ndarray

    @property
    def num_questions(self) -> int:
        return self.q_ids.shape[0]

    @property
    def num_windows(self) -> int:
        return self.p_ids.shape[0]

    def arrays(self) -> dict[str, np.ndarray]:
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}


# ----------------------------------------------------------------------------- featurize


def featurize(examples: Sequence[SquadExample], tokenizer, *, max_question_len: int = 64,
              max_passage_len: int = 384, doc_stride: int = 128, realign_answers: bool = True,
              cache_dir: str | os.PathLike | None = None) -> Features:
    """Features of `examples` (see the module docstring); cached in `cache_dir` when given.

    realign_answers: label an answer that starts or ends inside a token at the nearest
      whole-token occurrence of the same text instead (see `_realign`).
    The cache file is keyed by a hash of the examples' content, the tokenizer (its full
    serialized definition: vocab, normalizer, ...) and these settings.
    """
    _check_window_args(max_passage_len, doc_stride)
    if not examples:
        raise FeaturizationError("no examples to featurize")
    cache_path = None
    if cache_dir is not None:
        key = cache_key(examples, tokenizer, max_question_len, max_passage_len, doc_stride,
                        realign_answers)
        cache_path = Path(cache_dir) / f"squad-features-{key}.npz"
        cached = _load_cached(cache_path)
        if cached is not None:
            return cached
    features = _featurize(examples, tokenizer, max_question_len, max_passage_len, doc_stride,
                          realign_answers)
    if cache_path is not None:
        _save_atomically(cache_path, features)
    return features


def _featurize(examples: Sequence[SquadExample], tokenizer, max_question_len: int,
               max_passage_len: int, doc_stride: int, realign_answers: bool) -> Features:
    questions = encode_questions(tokenizer, [e.question for e in examples], max_question_len)

    # Distinct contexts, tokenized once, flattened into one token array.
    context_ids: dict[str, int] = {}
    example_context = np.asarray([context_ids.setdefault(e.context, len(context_ids))
                                  for e in examples], dtype=np.int64)
    contexts = list(context_ids)
    flat = _tokenize_flat(tokenizer, contexts)
    flat_offsets, base, lengths = flat.offsets, flat.base, flat.lengths
    windows = _windows_of(flat, tokenizer, max_passage_len, doc_stride)
    counts, first_window = windows.counts, windows.first_window
    cw_start, cw_length = windows.window_start, windows.length
    cw_ids, cw_mask, cw_offsets, cw_max_context = (windows.ids, windows.mask, windows.offsets,
                                                   windows.max_context)

    # Pairs: each example reads all windows of its context.
    ex_counts = counts[example_context]
    example_index = np.repeat(np.arange(len(examples)), ex_counts)
    within = np.arange(ex_counts.sum()) - np.repeat(np.cumsum(ex_counts) - ex_counts, ex_counts)
    passage_index = first_window[example_context][example_index] + within

    token_start, token_end = _answer_tokens(examples, example_context, flat_offsets, base,
                                            lengths, contexts, realign_answers)
    w_start, w_length = cw_start[passage_index], cw_length[passage_index]
    t_start, t_end = token_start[example_index], token_end[example_index]
    inside = (t_start >= 0) & (t_start >= w_start) & (t_end < w_start + w_length)
    return Features(
        q_ids=questions.ids, q_mask=questions.mask,
        p_ids=cw_ids[passage_index], p_mask=cw_mask[passage_index],
        offsets=cw_offsets[passage_index], max_context=cw_max_context[passage_index],
        start_positions=np.where(inside, t_start - w_start, NO_ANSWER).astype(np.int32),
        end_positions=np.where(inside, t_end - w_start, NO_ANSWER).astype(np.int32),
        example_index=example_index.astype(np.int32),
        window_passage_index=passage_index.astype(np.int32),
        window_start=w_start.astype(np.int32))


@dataclasses.dataclass
class _FlatTokens:
    """Tokens of many texts in one array: text i is ids[base[i]:base[i] + lengths[i]]."""

    ids: np.ndarray       # [total] int32
    offsets: np.ndarray   # [total, 2] int32 character offsets in the text
    lengths: np.ndarray   # [n_texts] int64
    base: np.ndarray      # [n_texts] int64


def _tokenize_flat(tokenizer, texts: Sequence[str]) -> _FlatTokens:
    encoded = tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True,
                        return_attention_mask=False, return_token_type_ids=False, verbose=False)
    lengths = np.asarray([len(ids) for ids in encoded["input_ids"]], dtype=np.int64)
    base = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    flat_ids = np.fromiter(itertools.chain.from_iterable(encoded["input_ids"]), dtype=np.int32,
                           count=int(lengths.sum()))
    flat_offsets = np.asarray(list(itertools.chain.from_iterable(encoded["offset_mapping"])),
                              dtype=np.int32).reshape(-1, 2)
    return _FlatTokens(flat_ids, flat_offsets, lengths, base)


@dataclasses.dataclass
class ContextWindows:
    """`p_window [SEP]` windows of distinct texts (the passage side of features).

    ids, mask: [n_windows, max_passage_len] int32; offsets: [n_windows, max_passage_len, 2]
    character offsets in the window's text (NO_OFFSET for [SEP]/padding); max_context:
    [n_windows, max_passage_len] bool; context_index: [n_windows] int32 text of each window;
    window_start: [n_windows] first token of the window in its text; length: [n_windows] tokens
    (without [SEP]); counts, first_window: [n_texts] windows per text and the first one's row.
    """

    ids: np.ndarray
    mask: np.ndarray
    offsets: np.ndarray
    max_context: np.ndarray
    context_index: np.ndarray
    window_start: np.ndarray
    length: np.ndarray
    counts: np.ndarray
    first_window: np.ndarray


def _windows_of(flat: _FlatTokens, tokenizer, max_passage_len: int,
                doc_stride: int) -> ContextWindows:
    window = max_passage_len - 1
    # Windows of each text: starts 0, stride, 2 stride, ... until one reaches the end.
    counts = 1 + ceil_div(np.maximum(flat.lengths - window, 0), doc_stride)
    first_window = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    context = np.repeat(np.arange(len(counts)), counts)
    start = (np.arange(counts.sum()) - first_window[context]) * doc_stride
    length = np.minimum(window, flat.lengths[context] - start)
    ids, mask, offsets, max_context = _window_arrays(
        flat.ids, flat.offsets, flat.base[context] + start, length, max_passage_len,
        tokenizer.sep_token_id, tokenizer.pad_token_id)
    return ContextWindows(ids, mask, offsets, max_context, context.astype(np.int32),
                          start.astype(np.int32), length.astype(np.int32), counts, first_window)


def _check_window_args(max_passage_len: int, doc_stride: int) -> None:
    window = max_passage_len - 1
    if window < 1:
        raise FeaturizationError(f"max_passage_len must be >= 2 (p [SEP]), got {max_passage_len}")
    if not 1 <= doc_stride <= window:
        raise FeaturizationError(f"doc_stride must be in 1..{window} (max_passage_len - 1), "
                                 f"got {doc_stride}")


def window_contexts(tokenizer, texts: Sequence[str], *, max_passage_len: int = 384,
                    doc_stride: int = 128) -> ContextWindows:
    """Strided `p_window [SEP]` windows of each text, exactly as `featurize` makes them (the
    open-domain index uses this, so a passage reads the same as a SQuAD context)."""
    _check_window_args(max_passage_len, doc_stride)
    return _windows_of(_tokenize_flat(tokenizer, texts), tokenizer, max_passage_len, doc_stride)


def _window_arrays(flat_ids: np.ndarray, flat_offsets: np.ndarray, first: np.ndarray,
                   length: np.ndarray, max_passage_len: int, sep_id: int, pad_id: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Padded `p_window [SEP]` rows of the distinct windows.

    first, length: [n] flat index of each window's first token and its token count.
    Returns ids, mask [n, Lp] int32, offsets [n, Lp, 2] int32, max_context [n, Lp] bool.
    """
    n = len(first)
    column = np.arange(max_passage_len)
    is_token = column[None, :] < length[:, None]                     # [n, Lp]
    source = np.where(is_token, first[:, None] + column[None, :], 0)
    rows = np.arange(n)
    ids = np.where(is_token, flat_ids[source] if len(flat_ids) else pad_id, pad_id)
    ids = ids.astype(np.int32)
    ids[rows, length] = sep_id
    mask = (column[None, :] <= length[:, None]).astype(np.int32)
    offsets = np.full((n, max_passage_len, 2), NO_OFFSET, dtype=np.int32)
    if len(flat_offsets):
        offsets[is_token] = flat_offsets[source[is_token]]

    # Max-context rule: a token belongs to the window where min(left, right context) +
    # 0.01 * window length is largest; the earliest window wins ties, as in BERT.
    score = np.minimum(column[None, :], length[:, None] - 1 - column[None, :]) + 0.01 * length[
        :, None]
    token_rows, token_cols = np.nonzero(is_token)
    token = source[token_rows, token_cols]
    order = np.lexsort((token_rows, -score[token_rows, token_cols], token))
    best = np.ones(len(order), dtype=bool)
    best[1:] = token[order][1:] != token[order][:-1]
    max_context = np.zeros((n, max_passage_len), dtype=bool)
    max_context[token_rows[order[best]], token_cols[order[best]]] = True
    return ids, mask, offsets, max_context


def _answer_tokens(examples: Sequence[SquadExample], example_context: np.ndarray,
                   flat_offsets: np.ndarray, base: np.ndarray, lengths: np.ndarray,
                   contexts: list[str], realign_answers: bool = True
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Context-token indices [n_examples] of each example's labelled answer: first, last token.

    An answer's first token is the first whose end lies past its first character, its last the
    last whose start lies before its end. The label is the first gold answer whose characters
    match its tokens' boundaries exactly, else the first gold answer that covers any token (an
    answer starting or ending inside a word cannot be a token span; SQuAD files whose
    answer_start is the text's first occurrence, e.g. "equality" inside "inequality", have such).
    -1 for unanswerable examples and when no answer covers a token.
    """
    n = len(examples)
    token_start = np.full(n, NO_ANSWER, dtype=np.int64)
    token_end = np.full(n, NO_ANSWER, dtype=np.int64)
    owner = np.asarray([i for i, e in enumerate(examples) if not e.is_impossible
                        for _ in e.answer_texts], dtype=np.int64)
    if not len(owner) or not len(flat_offsets):
        return token_start, token_end
    rank = np.asarray([r for e in examples if not e.is_impossible
                       for r in range(len(e.answer_texts))], dtype=np.int64)
    local_start = np.asarray([s for e in examples if not e.is_impossible
                              for s in e.answer_starts], dtype=np.int64)
    local_end = local_start + np.asarray([len(t) for e in examples if not e.is_impossible
                                          for t in e.answer_texts], dtype=np.int64)
    # Shift each context's characters past the previous one's so that one sorted search over all
    # tokens serves every answer; running max / suffix min make the keys monotone even where a
    # tokenizer's offsets are not, without changing "first end > s" / "last start < e".
    char_base = np.concatenate([[0], np.cumsum([len(c) + 1 for c in contexts])[:-1]])
    token_context = np.repeat(np.arange(len(contexts)), lengths)
    ends = np.maximum.accumulate(flat_offsets[:, 1] + char_base[token_context])
    starts = np.minimum.accumulate((flat_offsets[:, 0] + char_base[token_context])[::-1])[::-1]
    ctx = example_context[owner]

    def token_span(char_start: np.ndarray, char_end: np.ndarray):
        first = np.searchsorted(ends, char_start + char_base[ctx], side="right")
        last = np.searchsorted(starts, char_end + char_base[ctx], side="left") - 1
        ok = (first < base[ctx] + lengths[ctx]) & (last >= base[ctx]) & (first <= last)
        safe_first, safe_last = np.where(ok, first, 0), np.where(ok, last, 0)
        aligned = ok & (flat_offsets[safe_first, 0] == char_start) & (
            flat_offsets[safe_last, 1] == char_end)
        return first, last, ok, aligned

    first, last, ok, aligned = token_span(local_start, local_end)
    if realign_answers and not aligned.all():
        moved = _realign(np.nonzero(~aligned)[0], owner, local_start, local_end, examples,
                         example_context, flat_offsets, base, lengths)
        if moved:
            first, last, ok, aligned = token_span(local_start, local_end)
    # Per example: aligned answers first, then file order; answers covering no token never.
    priority = np.where(aligned, rank, rank + 1_000_000)
    candidates = np.nonzero(ok)[0]
    order = candidates[np.lexsort((priority[candidates], owner[candidates]))]
    chosen = order[np.r_[True, owner[order][1:] != owner[order][:-1]]] if len(order) else order
    token_start[owner[chosen]] = first[chosen] - base[ctx[chosen]]
    token_end[owner[chosen]] = last[chosen] - base[ctx[chosen]]
    unlabelled = sorted({examples[i].qid for i in owner} - {examples[i].qid for i in
                                                              owner[chosen]})
    if unlabelled:
        log.warning("%d answerable question(s) have no answer covering a token, so no label: %s",
                    len(unlabelled), unlabelled[:10])
    return token_start, token_end


def _realign(rows: np.ndarray, owner: np.ndarray, local_start: np.ndarray,
             local_end: np.ndarray, examples: Sequence[SquadExample], example_context: np.ndarray,
             flat_offsets: np.ndarray, base: np.ndarray, lengths: np.ndarray) -> int:
    """Moves answers that start or end inside a token to the nearest occurrence of the same text
    that is a whole token span (in place); returns how many moved.

    Files whose answer_start is the first occurrence of the text (e.g. "4" found inside "1864"
    before the standalone "4") otherwise label the wrong words.
    """
    moved = 0
    boundaries: dict[int, tuple[set[int], set[int]]] = {}
    for row in rows.tolist():
        c = int(example_context[owner[row]])
        if c not in boundaries:
            spans = flat_offsets[base[c]:base[c] + lengths[c]]
            boundaries[c] = (set(spans[:, 0].tolist()), set(spans[:, 1].tolist()))
        token_starts, token_ends = boundaries[c]
        context = examples[owner[row]].context
        start, size = int(local_start[row]), int(local_end[row] - local_start[row])
        text = context[start:start + size]
        best = None
        position = context.find(text)
        while text and position >= 0:
            if position in token_starts and position + size in token_ends and (
                    best is None or abs(position - start) < abs(best - start)):
                best = position
            position = context.find(text, position + 1)
        if best is not None:
            local_start[row], local_end[row] = best, best + size
            moved += 1
    if moved:
        log.info("%d answer(s) not on token boundaries moved to a whole-token occurrence of the "
                 "same text", moved)
    return moved


# ----------------------------------------------------------------------------- cache


def tokenizer_identity(tokenizer) -> str:
    """The tokenizer's definition (vocabulary, normalizer, pre-tokenizer, model, ...) as text,
    without its truncation and padding settings: a fast tokenizer's backend keeps those from the
    last call that set them (`featurize` sets them), so they would make the same tokenizer name
    different features files before and after its first use."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return repr(sorted(tokenizer.get_vocab()))
    definition = json.loads(backend.to_str())
    for call_state in ("truncation", "padding"):
        definition.pop(call_state, None)
    return json.dumps(definition, sort_keys=True)


def cache_key(examples: Sequence[SquadExample], tokenizer, max_question_len: int,
              max_passage_len: int, doc_stride: int, realign_answers: bool = True) -> str:
    """Hex digest naming a features file: examples, tokenizer definition, lengths, format."""
    digest = hashlib.sha256()
    digest.update(f"format={FEATURE_FORMAT};q={max_question_len};p={max_passage_len};"
                  f"s={doc_stride};r={int(realign_answers)};".encode())
    digest.update(hashlib.sha256(tokenizer_identity(tokenizer).encode()).digest())
    for e in examples:
        record = "\x1f".join([e.qid, e.question, e.context, *e.answer_texts,
                              *map(str, e.answer_starts), str(e.is_impossible)])
        digest.update(record.encode("utf-8", "surrogatepass") + b"\x1e")
    return digest.hexdigest()[:32]


def _load_cached(path: Path) -> Features | None:
    if not path.is_file():
        return None
    try:
        with np.load(path) as data:
            features = Features(**{f.name: data[f.name] for f in dataclasses.fields(Features)})
    except Exception as error:  # a damaged or foreign file: rebuild rather than fail
        log.warning("ignoring unreadable features cache %s (%s: %s)", path,
                    type(error).__name__, error)
        return None
    log.info("features loaded from cache %s", path)
    return features


def _save_atomically(path: Path, features: Features) -> None:
    """np.savez to a temporary file in the same folder, then rename: readers never see half.
    A folder that cannot take it (read-only, full, a file-size limit) is a WARNING naming it,
    not the end of the run: the cache only saves the next run's featurization."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, lambda out: np.savez(out, **features.arrays()))
    except (OSError, OutputPathError) as error:
        cause = error if isinstance(error, OSError) else error.__cause__
        reason = (f"{cause.strerror}, {errno.errorcode.get(cause.errno or 0, cause.errno)}"
                  if isinstance(cause, OSError) else str(error))
        log.warning("features not cached: cannot write %s (%s); the next run featurizes again "
                    "(give a writable --cache-dir, or none)", path, reason)
        return
    log.info("features cached in %s", path)
