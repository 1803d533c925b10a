"""An open-domain answer as `dil-jax ask` shows it to a person, whether it was read here
(`reader.format_answer`) or by a server (`dil_jax.client.format_answer`). The standard library
only: the client imports it."""

from __future__ import annotations


def passage_context(text: str, start: int, end: int, answer: str, reach: int = 200) -> str:
    """The passage around an answer, the answer marked [[...]], at most `reach` characters
    either side: what `dil-jax ask` shows under "passage:"."""
    first = max(0, start - reach)
    last = min(len(text), end + reach)
    return (("..." if first else "") + text[first:start] + "[[" + answer + "]]"
            + text[end:last] + ("..." if last < len(text) else ""))


def _score(value: float | None) -> str:
    # A server sends a non-finite score as null (JSON has no NaN).
    return "nan" if value is None else f"{value:.2f}"


def answer_lines(*, text: str, title: str, passage_id: str, rank: int, retrieved: int,
                 span_score: str, reader_score: float | None, bm25_score: float | None,
                 mu: float | None, threshold: float | None, context: str,
                 retrieval_match: float | None = None, probability: float | None = None,
                 probability_threshold: float | None = None) -> list[str]:
    """The lines of the best answer: "A: TEXT", or, when it is refused, "no answer found in
    the corpus" and the best guess; then its passage, BM25 rank (1-based, of `retrieved`) and
    scores (fused with `mu` when given), and `context` (`passage_context`).

    Refused: with a `probability_threshold` (the reader's logistic rule), when the
    `probability` that the answer is right, from its reader score and the `retrieval_match`,
    is below it (those numbers shown either way); else when its reader score falls below the
    reader's abstention `threshold`."""
    combined = probability_threshold is not None and probability is not None
    if combined:
        refused = probability < probability_threshold
    else:
        refused = threshold is not None and reader_score is not None and reader_score < threshold
    lines = []
    if refused and combined:
        lines.append(f"A: (no answer found in the corpus: the best answer's probability of "
                     f"being right {probability:.2f} is below this reader's threshold "
                     f"{probability_threshold:.2f}; best guess below)")
    elif refused:
        lines.append(f"A: (no answer found in the corpus: the best answer's reader score "
                     f"{reader_score:.2f} is below this reader's threshold "
                     f"{threshold:.2f}; best guess below)")
    lines += [f"   best guess: {text}" if refused else f"A: {text}",
              f"   from {title!r} ({passage_id}), BM25 rank {rank} of {retrieved}; reader "
              f"score ({span_score}) {_score(reader_score)}, BM25 {_score(bm25_score)}"
              + ("" if mu is None else f", fused with mu={mu}")]
    if combined:
        lines.append(f"   abstention: reader score {_score(reader_score)} and retrieval match "
                     f"{_score(retrieval_match)} (best BM25 score / attainable) give "
                     f"probability {probability:.2f} of being right, threshold "
                     f"{probability_threshold:.2f}")
    lines.append(f"   passage: {context}")
    return lines
