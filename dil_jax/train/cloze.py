"""Cloze questions: unlabelled questions made by rule from a passage's own sentences.

Why: a delayed student (k > 0) must learn its question-passage interaction from few labelled
questions (SQuAD train is not on the development machines), and task-specific distillation gains
most from more inputs on which to copy the teacher (TinyBERT's data augmentation; Lewis et al.
2019, "Unsupervised question answering by cloze translation", make such questions the same way).
A cloze question is one sentence of the passage, cropped around a span that looks like an answer
(a year, a number, a capitalised name), with that span replaced by a question phrase:

    "The Normans conquered England in 1066."  ->  "The Normans conquered England in what year?"

The teacher reads each one with its paragraph and the student copies the teacher's start/end
distributions and upper-block states (`data.distill_file`: the span cross-entropy never sees
these questions, so the rule's own answer is only recorded, never trained on).

Everything here is a pure function of the text and a seed; `squad_json` makes a SQuAD-format
dict that `dil_jax.data.squad.load_squad` reads.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dil_jax.data.squad import SquadExample

# A sentence may end at . ! or ? followed by white space and an upper-case letter, digit or
# quote; `sentence_spans` then skips the ends that follow an abbreviation or an initial.
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s+(?=[A-Z0-9\"'(])")
_ABBREVIATIONS = frozenset({"st", "mr", "mrs", "dr", "ms", "jr", "sr", "vs", "no", "mt", "ca",
                            "c", "e.g", "i.e", "etc", "u.s", "u.k", "inc", "co", "ltd", "gen",
                            "col", "lt", "rev", "prof", "approx", "fig", "vol"})
_YEAR = re.compile(r"\b(?:1[0-9]{3}|20[0-9]{2})s?\b")
_NUMBER = re.compile(r"\b\d[\d,.]*(?:\s(?:million|billion|thousand|hundred))?\b")
# A capitalised name: one or more capitalised words (each with a lower-case letter or digit, so
# not an acronym alone), joined by spaces or by "of", "the", "de", "and", "du", "von", "van".
_NAME = re.compile(r"\b[A-Z][\w'’-]*[a-z0-9][\w'’-]*"
                   r"(?:(?:\s+(?:of|the|de|and|du|von|van)\s+|\s+)[A-Z][\w'’-]*[a-z0-9][\w'’-]*)*")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")
_DATE = re.compile(r"\b(?:" + "|".join(_MONTHS)
                   + r")(?:\s\d{1,2})?(?:,?\s(?:1[0-9]{3}|20[0-9]{2}))?\b")

QUESTION_PHRASES = {"year": "what year", "date": "when", "number": "how many", "name": "what"}
MAX_QUESTION_WORDS = 16  # words kept around the gap: a question, not a whole long sentence


@dataclass(frozen=True)
class AnswerSpan:
    """A span of a sentence that a cloze question asks for; start/end are character offsets
    into the sentence (end exclusive); kind picks the question phrase (QUESTION_PHRASES)."""

    start: int
    end: int
    kind: str


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of the sentences of `text`, without outer white space."""
    spans, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        words = text[start:match.start()].split()
        last_word = words[-1].lower().lstrip("(\"'") if words else ""
        if text[match.start()] == "." and (last_word in _ABBREVIATIONS or len(last_word) == 1):
            continue  # "St. Louis", "U.S. Army", "John F. Kennedy"
        spans.append((start, match.start() + 1))
        start = match.end()
    spans.append((start, len(text)))
    out = []
    for begin, end in spans:
        piece = text[begin:end]
        begin += len(piece) - len(piece.lstrip())
        end -= len(piece) - len(piece.rstrip())
        if begin < end:
            out.append((begin, end))
    return out


def answer_spans(sentence: str) -> list[AnswerSpan]:
    """The spans of `sentence` a cloze question may ask for, without overlaps (dates before
    years before other numbers before names, the first found wins). A name that opens the
    sentence is skipped: its capital may be only the sentence's, and the question would start
    with its own question phrase and nothing before it to match."""
    taken: list[AnswerSpan] = []

    def free(start: int, end: int) -> bool:
        return all(end <= span.start or start >= span.end for span in taken)

    for kind, pattern in (("date", _DATE), ("year", _YEAR), ("number", _NUMBER),
                          ("name", _NAME)):
        for match in pattern.finditer(sentence):
            start, end = match.span()
            if kind == "date" and " " not in match.group():
                continue  # a bare month name ("May") is too often another word
            if kind == "name" and (start == 0 or match.group() in _MONTHS):
                continue
            if free(start, end):
                taken.append(AnswerSpan(start, end, kind))
    return sorted(taken, key=lambda span: span.start)


def cloze_question(sentence: str, span: AnswerSpan,
                   max_words: int = MAX_QUESTION_WORDS) -> str:
    """`sentence` with `span` replaced by its question phrase, cropped to at most `max_words`
    words centred on the gap, ending in "?"."""
    phrase = QUESTION_PHRASES[span.kind]
    before = sentence[:span.start].split()
    after = sentence[span.end:].split()
    room = max(max_words - len(phrase.split()), 0)
    keep_before = min(len(before), max(room // 2, room - len(after)))
    keep_after = min(len(after), room - keep_before)
    words = before[len(before) - keep_before:] + [phrase] + after[:keep_after]
    text = " ".join(words).rstrip(" .,;:!?")
    return text[0].upper() + text[1:] + "?" if text else "?"


def paragraph_cloze_examples(title: str, context: str, qid_prefix: str, *,
                             max_per_paragraph: int, rng: random.Random) -> list[SquadExample]:
    """Up to `max_per_paragraph` cloze questions on one paragraph (a random subset of all its
    sentences' answer spans, in text order, when there are more), each with its rule answer."""
    candidates = [(sentence_start, context[sentence_start:sentence_end], span)
                  for sentence_start, sentence_end in sentence_spans(context)
                  for span in answer_spans(context[sentence_start:sentence_end])]
    if len(candidates) > max_per_paragraph:
        kept = sorted(rng.sample(range(len(candidates)), max_per_paragraph))
        candidates = [candidates[i] for i in kept]
    examples = []
    for number, (sentence_start, sentence, span) in enumerate(candidates):
        answer_start = sentence_start + span.start
        examples.append(SquadExample(
            qid=f"{qid_prefix}-{number}", title=title, context=context,
            question=cloze_question(sentence, span),
            answer_texts=(context[answer_start:sentence_start + span.end],),
            answer_starts=(answer_start,)))
    return examples


def cloze_examples(paragraphs: Iterable[tuple[str, str]], *, max_per_paragraph: int,
                   seed: int = 0) -> list[SquadExample]:
    """Cloze questions on every distinct (title, context) paragraph, in first-seen order, ids
    "cloze-<paragraph number>-<question number>" (unique in the output)."""
    rng = random.Random(seed)
    out: list[SquadExample] = []
    for number, (title, context) in enumerate(dict.fromkeys(paragraphs)):
        out += paragraph_cloze_examples(title, context, f"cloze-{number}",
                                        max_per_paragraph=max_per_paragraph, rng=rng)
    return out


def squad_json(examples: Sequence[SquadExample], version: str = "1.1") -> dict:
    """The SQuAD JSON layout of `examples`: articles by title and paragraphs by context, both in
    first-seen order."""
    articles: dict[str, dict[str, list[dict]]] = {}
    for example in examples:
        paragraphs = articles.setdefault(example.title, {})
        paragraphs.setdefault(example.context, []).append({
            "id": example.qid, "question": example.question,
            "answers": [{"text": text, "answer_start": start}
                        for text, start in zip(example.answer_texts, example.answer_starts)]})
    return {"version": version, "data": [
        {"title": title, "paragraphs": [{"context": context, "qas": qas}
                                        for context, qas in paragraphs.items()]}
        for title, paragraphs in articles.items()]}
