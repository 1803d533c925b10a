"""`POST /v1/read`'s answers, scored as Hugging Face's `pipeline("question-answering")` scores
them (transformers 4.x `QuestionAnsweringPipeline.postprocess`, `select_starts_ends`,
`decode_spans`), so a client that switches gets the same fields with the same meaning:

- each window of the context is scored alone: the start and end logits of the tokens that
  cannot be in an answer (question, [SEP], padding) are set to -10000, the `[CLS]` token's are
  kept, and each is turned into probabilities by a softmax over the window;
- the null score of a window is p_start([CLS]) x p_end([CLS]); the request's is the smallest
  over its windows; then the `[CLS]` probabilities are set to 0;
- a span (s, e) scores p_start(s) x p_end(e), for s <= e < s + max_answer_len; each window
  keeps its top_k spans whose start and end are context tokens (the pipeline may fill a top_k
  larger than the window's spans with zero-scored spans ending before they start: not here);
- the span's characters are widened to whole words (the pipeline's `align_to_words=True`:
  `token_to_word`, then `word_to_chars`);
- with handle_impossible_answer, {"score": null score, "start": 0, "end": 0, "answer": ""}
  joins the answers; all are sorted by score and the top_k kept (a dict when top_k is 1).

Here a window's question-token logits are never computed (the pair program reads the
passage rows only): they are exactly the ones set to -10000, whose probability is exp(-10000
- max) = 0 in float32, so leaving them out of the softmax changes nothing. The windows are the
index's (`max_passage_len` / `doc_stride` of `dil-jax index`), not the pipeline's 384 / 128, so
a context longer than one window may be cut elsewhere than the pipeline cuts it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

# What the pipeline writes into the logits of tokens that cannot be in an answer.
MASKED_LOGIT = -10000.0


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max())
    return shifted / shifted.sum()


def window_spans(start_logits: np.ndarray, end_logits: np.ndarray, null_start: float,
                 null_end: float, allowed: np.ndarray, top_k: int, max_answer_len: int
                 ) -> tuple[list[tuple[int, int, float]], float]:
    """One window's top_k spans (token start, token end, score) and its null score.

    start_logits, end_logits: [p_len] over the window's passage tokens; allowed: [p_len] bool,
    the context tokens (not [SEP], not padding)."""
    start = np.where(allowed, start_logits, MASKED_LOGIT).astype(np.float64)
    end = np.where(allowed, end_logits, MASKED_LOGIT).astype(np.float64)
    # [CLS] first, as in the pipeline's sequence, so the softmax is over the same tokens.
    p_start = _softmax(np.concatenate([[null_start], start]))
    p_end = _softmax(np.concatenate([[null_end], end]))
    null_score = float(p_start[0] * p_end[0])
    scores = np.outer(p_start[1:], p_end[1:])
    scores = np.tril(np.triu(scores), max_answer_len - 1)  # s <= e < s + max_answer_len
    flat = scores.ravel()
    if top_k == 1:
        order = np.array([np.argmax(flat)])
    else:
        order = np.argsort(-flat, kind="stable")[:top_k]
    starts, ends = np.unravel_index(order, scores.shape)
    # The pipeline keeps spans whose start and end are context tokens; it would also keep an
    # end before its start, scored 0, when top_k passes the number of spans: those are not
    # answers, and left out here.
    spans = [(int(s), int(e), float(scores[s, e])) for s, e in zip(starts, ends)
             if allowed[s] and allowed[e] and s <= e]
    return spans, null_score


def pipeline_answers(start_logits: np.ndarray, end_logits: np.ndarray,
                     null_start: np.ndarray, null_end: np.ndarray, allowed: np.ndarray,
                     char_span: Callable[[int, int, int], tuple[int, int]], context: str,
                     top_k: int, max_answer_len: int, handle_impossible_answer: bool
                     ) -> list[dict]:
    """The answers over every window of a context, best first (at most top_k).

    Arrays: [n_windows, p_len] and [n_windows]; char_span(window, start token, end token) ->
    the answer's (start, end) characters in `context` (already widened to words)."""
    answers = []
    min_null_score = 1000000.0  # the pipeline's "large and positive" start
    for window in range(start_logits.shape[0]):
        spans, null_score = window_spans(start_logits[window], end_logits[window],
                                         float(null_start[window]), float(null_end[window]),
                                         allowed[window], top_k, max_answer_len)
        min_null_score = min(min_null_score, null_score)
        for start, end, score in spans:
            char_start, char_end = char_span(window, start, end)
            answers.append({"score": score, "start": char_start, "end": char_end,
                            "answer": context[char_start:char_end]})
    if handle_impossible_answer:
        answers.append({"score": min_null_score, "start": 0, "end": 0, "answer": ""})
    answers.sort(key=lambda answer: answer["score"], reverse=True)
    return answers[:top_k]


def word_spans(word_ids: Sequence[int | None], word_chars: Callable[[int], tuple[int, int]],
               token_chars: np.ndarray) -> Callable[[int, int], tuple[int, int]]:
    """(flat start token, flat end token) -> characters widened to whole words: the start of
    the start token's word, the end of the end token's word (a token without a word keeps its
    own offsets, as the pipeline's fallback does). token_chars: [n_tokens, 2]."""

    def span(start: int, end: int) -> tuple[int, int]:
        first, last = word_ids[start], word_ids[end]
        if first is None or last is None:
            return int(token_chars[start, 0]), int(token_chars[end, 1])
        return word_chars(first)[0], word_chars(last)[1]

    return span
