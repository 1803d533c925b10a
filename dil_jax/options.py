"""What a value of a setting must be, stated once for a training config key and a command-line
flag alike: numeric rules (`Bound`) and the table of the reader and window options both name
(`OPTIONS`).

A `Bound` answers with what the value must be ("an integer >= 2") or None when it is fine: the
training config's table (`dil_jax.train.config_rules.RULES`) reports "config.KEY = VALUE: must
be ...", and `dil_jax.commands.arguments.flag_type` makes an argparse type of it ("argument
--max-passage-len: must be an integer >= 2, got '1'"). Light on purpose (no JAX): every command
imports it to build its parser.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable


def is_int(value: object) -> bool:
    """An integer that is not a bool (JSON and Python both let True pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """A finite int or float (not a bool)."""
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


@dataclasses.dataclass(frozen=True)
class Bound:
    """A rule with its one description: calling it with a value gives None when `accepts` it,
    else `wanted` (what the value must be). `kind` is the type a flag's text is parsed as."""

    wanted: str
    accepts: Callable[[object], bool]
    kind: type = int

    def __call__(self, value: object) -> str | None:
        return None if self.accepts(value) else self.wanted


def int_at_least(low: int, off: int | None = None) -> Bound:
    """An integer >= low (or exactly `off`, the value that switches the setting off)."""
    wanted = f"an integer >= {low}" + (f" (or {off} for off)" if off is not None else "")
    return Bound(wanted, lambda v: is_int(v) and (v >= low or v == off))


def number_in(low: float | None = None, high: float | None = None, *, low_open: bool = False,
              high_open: bool = False, optional: bool = False) -> Bound:
    """A finite number within the bounds (an open bound excludes itself); None if optional."""
    bounds = []
    if low is not None:
        bounds.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        bounds.append(f"{'<' if high_open else '<='} {high:g}")
    wanted = " ".join(["a number", " and ".join(bounds)]).strip()
    wanted += " (or None)" if optional else ""

    def accepts(v: object) -> bool:
        if v is None:
            return optional
        if not is_number(v):
            return False
        too_low = low is not None and (v <= low if low_open else v < low)
        too_high = high is not None and (v >= high if high_open else v > high)
        return not (too_low or too_high)

    return Bound(wanted, accepts, float)


# The options a training config key (model.NAME / data.NAME) and a flag (--NAME with dashes)
# both set, under the name they share: one rule each, so a value one route takes the other
# takes too.
OPTIONS: dict[str, Bound] = {
    "num_lower_layers": int_at_least(0),  # k; the flag is --k
    # The question segment `[CLS] q [SEP]` holds its first token, at least one question token (an
    # empty question is refused) and its closing token(s): 3 at the fewest, in every pair layout.
    # A layout with more specials (RoBERTa's `<s> q </s></s>`: 4) is checked against the
    # tokenizer itself (`tokenization.encode_questions`).
    "max_question_len": int_at_least(3),
    "max_passage_len": int_at_least(2),  # at least one passage token and [SEP]
    "doc_stride": int_at_least(1),
    "lsh_num_hashes": int_at_least(1),
    "lsh_bucket_size": int_at_least(1),
}
