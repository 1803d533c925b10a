"""Integer ceiling division and rounding up to a multiple (batch counts, padded sizes)."""

from __future__ import annotations

from typing import TypeVar

import numpy as np

# An int or a numpy integer array: both helpers work elementwise on arrays.
IntOrArray = TypeVar("IntOrArray", int, np.ndarray)


def ceil_div(value: IntOrArray, divisor: int) -> IntOrArray:
    """The smallest integer >= value / divisor (elementwise for an array `value`).

    Floor division of the negation, so it stays exact on integers of any size (no float).
    """
    return -(-value // divisor)


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= value."""
    return ceil_div(value, multiple) * multiple
