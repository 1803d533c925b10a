"""Argument types that check a flag's range where it is parsed.

A bad value ends in argparse's usual error (exit status 2) naming the flag and the value, e.g.
`dil-jax predict: error: argument --batch-size: must be an integer >= 1, got '0'`, before any
model or data is loaded.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _number(kind: type, low: float | None, high: float | None, low_open: bool = False
            ) -> Callable[[str], int | float]:
    name = "an integer" if kind is int else "a number"
    bounds = []
    if low is not None:
        bounds.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        bounds.append(f"<= {high:g}")
    wanted = f"{name} {' and '.join(bounds)}".strip()

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and value > high
        if too_low or too_high:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value

    parse.__name__ = wanted  # argparse names the type in some messages
    return parse


positive_int = _number(int, 1, None)
"""An integer >= 1 (sizes, counts, limits)."""
non_negative_int = _number(int, 0, None)
"""An integer >= 0 (k, seeds, offsets)."""
positive_float = _number(float, 0, None, low_open=True)
"""A finite number > 0."""
fraction = _number(float, 0, 1, low_open=True)
"""A number in (0, 1] (probability mass, shares)."""
unit_interval = _number(float, 0, 1)
"""A number in [0, 1] (mixing weights)."""
finite_float = _number(float, None, None)
"""Any finite number (thresholds)."""
