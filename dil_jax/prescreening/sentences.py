"""Sentence splitting with character offsets, and the answer-sentence label.

A rule-based splitter (no model to download): a sentence ends at `.`, `!` or `?` (optionally
followed by closing quotes or brackets) when whitespace and then an upper-case letter, a digit or
an opening quote follow, unless the word before the stop is a known abbreviation ("Mr.", "U.S.",
"e.g.") or a single capital initial ("J. R. R."). Offsets are kept so that answers found in a
kept sentence map back to the passage.
"""

from __future__ import annotations

import re

_BOUNDARY = re.compile(r"[.!?][\"')\]]*(?=\s+[\"'(\[]?[A-Z0-9])")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st mt ft vs etc e.g i.e u.s u.k a.d b.c no vol fig jan feb mar apr "
    "jun jul aug sep sept oct nov dec gen gov col lt sgt rev inc ltd co corp approx".split())


def _is_abbreviation(text: str, stop: int) -> bool:
    """Is the `.` at `stop` the end of an abbreviation or an initial?"""
    if text[stop] != ".":
        return False
    start = stop
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    word = text[start:stop].lower().strip("\"'([")
    if word in _ABBREVIATIONS or word.rstrip(".") in _ABBREVIATIONS:
        return True
    return len(word) == 1 and word.isalpha()  # an initial: "J. Smith"


def split_sentences(text: str) -> list[tuple[int, int]]:
    """[start, end) character spans of the sentences of `text`, whitespace trimmed, in order.

    The spans cover every non-space character: concatenating them (with the gaps) gives `text`.
    """
    spans, start = [], 0
    for match in _BOUNDARY.finditer(text):
        if _is_abbreviation(text, match.start()):
            continue
        end = match.end()
        spans.append((start, end))
        start = end
    spans.append((start, len(text)))
    trimmed = []
    for a, b in spans:
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        if b > a:
            trimmed.append((a, b))
    return trimmed


def answer_sentence(spans: list[tuple[int, int]], answer_start: int) -> int:
    """Index of the sentence containing character `answer_start` (the nearest one before it when
    the start falls in the whitespace between two sentences); -1 for no spans."""
    label = -1
    for index, (start, _) in enumerate(spans):
        if start <= answer_start:
            label = index
        else:
            break
    return label
