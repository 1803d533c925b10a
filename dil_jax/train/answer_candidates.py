"""Every occurrence of an ambiguous answer as a correct span (`data.answer_candidates_file`).

The shared SQuAD v1.1 training file gives each answer's `answer_start` as the first occurrence of
its text in the paragraph; for the 10.8% of answers whose text occurs more than once the true
span may be another occurrence (../shared/data/README.md). A candidates file maps such question
ids to every occurrence:

    {"explorer-train-000-000-02": {"text": "the Main Building", "candidates": [59, 152, 279]}, ...}

`window_candidates` turns those character offsets into token spans of each training window, so
the span loss can accept any of them (`dil_jax.train.losses`, multi-positive: minus the log of
the summed probability of the candidate starts, and likewise of the ends) instead of betting on
the first occurrence.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dil_jax.data.features import NO_ANSWER, Features
from dil_jax.data.squad import SquadExample
from dil_jax.errors import InputFileError

log = logging.getLogger(__name__)

# Candidate spans kept per window. A window rarely holds more than 3 occurrences of an answer;
# the few answers such as "the" that occur 10+ times keep their first 8, the labelled one first.
MAX_CANDIDATES = 8


def load_answer_candidates(path: str | Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{question id: (answer text, character offsets of every occurrence)} of a candidates file;
    InputFileError naming the file and the question for anything malformed."""
    source = f"config.data.answer_candidates_file = {str(path)!r}"
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputFileError(f"{source}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputFileError(f"{source}: cannot be read as JSON ({error})") from None
    if not isinstance(raw, dict):
        raise InputFileError(f"{source}: expected an object {{question id: {{\"text\", "
                             f"\"candidates\"}}}}, got {type(raw).__name__}")
    table: dict[str, tuple[str, tuple[int, ...]]] = {}
    for qid, record in raw.items():
        text = record.get("text") if isinstance(record, dict) else None
        offsets = record.get("candidates") if isinstance(record, dict) else None
        if (not isinstance(text, str) or not text or not isinstance(offsets, list) or not offsets
                or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0
                           for o in offsets)):
            raise InputFileError(f"{source}: question {qid!r}: expected {{\"text\": non-empty "
                                 "string, \"candidates\": non-empty list of character offsets "
                                 f">= 0}}, got {str(record)[:120]}")
        table[qid] = (text, tuple(offsets))
    return table


def _token_span(offsets: np.ndarray, char_start: int, char_end: int) -> tuple[int, int]:
    """(first, last) window-token indices of characters [char_start, char_end), or (-1, -1) when
    the window does not hold the whole span. offsets: [Lp, 2], -1 rows for [SEP] and padding.

    The same rule as the featurizer's labels: the first token ending past char_start, the last
    starting before char_end.
    """
    real = np.nonzero(offsets[:, 0] >= 0)[0]
    if not len(real):
        return NO_ANSWER, NO_ANSWER
    starts, ends = offsets[real, 0], offsets[real, 1]
    if starts[0] > char_start or ends[-1] < char_end:  # the window cuts the span
        return NO_ANSWER, NO_ANSWER
    after = np.nonzero(ends > char_start)[0]
    before = np.nonzero(starts < char_end)[0]
    if not len(after) or not len(before) or after[0] > before[-1]:
        return NO_ANSWER, NO_ANSWER
    return int(real[after[0]]), int(real[before[-1]])


@dataclasses.dataclass(frozen=True)
class CandidateSpans:
    """Labels of every window with answer candidates.

    start_positions, end_positions: [n_windows] the one label of each window: the featurizer's,
      or, where the window lacks the labelled occurrence but holds another, that one;
    start_candidates, end_candidates: [n_windows, C] every occurrence the window holds whole,
      column 0 = the one label, -1 padded.
    """

    start_positions: np.ndarray
    end_positions: np.ndarray
    start_candidates: np.ndarray
    end_candidates: np.ndarray


def window_candidates(features: Features, examples: Sequence[SquadExample],
                      candidates: Mapping[str, tuple[str, tuple[int, ...]]],
                      max_candidates: int = MAX_CANDIDATES) -> CandidateSpans:
    """The token spans of every occurrence of each window's answer that the window holds whole
    (`CandidateSpans`).

    Column 0 is the featurizer's own label (start_positions / end_positions) when it is in the
    window, so a question without candidates keeps exactly its one label; the other occurrences
    follow in text order, each once. A window whose question has candidates but holds none of
    them is a no-answer window (all -1), as with one label. Candidates whose text differs from
    the example's first answer are ignored with a warning (another file's ids).
    """
    n = features.num_windows
    start = np.full((n, max_candidates), NO_ANSWER, np.int32)
    end = np.full((n, max_candidates), NO_ANSWER, np.int32)
    start[:, 0], end[:, 0] = features.start_positions, features.end_positions
    mismatched: list[str] = []
    spans_of: dict[int, list[tuple[int, int]]] = {}
    for index, example in enumerate(examples):
        entry = candidates.get(example.qid)
        if entry is None or example.is_impossible or not example.answer_texts:
            continue
        text, offsets = entry
        if text != example.answer_texts[0] or any(
                example.context[o:o + len(text)] != text for o in offsets):
            mismatched.append(example.qid)
            continue
        spans_of[index] = [(o, o + len(text)) for o in sorted(set(offsets))]
    for window in np.nonzero(np.isin(features.example_index, list(spans_of)))[0]:
        chosen = [(int(start[window, 0]), int(end[window, 0]))] if start[window, 0] >= 0 else []
        for char_start, char_end in spans_of[int(features.example_index[window])]:
            span = _token_span(features.offsets[window], char_start, char_end)
            if span[0] >= 0 and span not in chosen:
                chosen.append(span)
        chosen = chosen[:max_candidates]
        start[window, :len(chosen)] = [s for s, _ in chosen]
        end[window, :len(chosen)] = [e for _, e in chosen]
    if mismatched:
        log.warning("answer candidates of %d question(s) do not match their answer text in the "
                    "training file and are ignored: %s", len(mismatched), mismatched[:5])
    added = int(np.sum(start >= 0)) - int(np.sum(features.start_positions >= 0))
    log.info("answer candidates: %d questions, %d more correct spans over the training windows",
             len(spans_of), added)
    return CandidateSpans(start[:, 0].copy(), end[:, 0].copy(), start, end)
