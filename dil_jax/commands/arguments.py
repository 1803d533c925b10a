"""The arguments shared by several commands: types that check a flag's range where it is parsed,
the flag checks run before any work, and the prescreening flags of the commands that read
(`add_reading_arguments`, `prescreen_from_args`). Commands import each other never, only this.

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


def int_at_least(low: int) -> Callable[[str], int]:
    """An integer >= low (e.g. 2 for a passage window: at least one token and [SEP])."""
    return _number(int, low, None)


window_len = int_at_least(2)
"""Passage window length: at least one passage token and the [SEP]."""


def cache_storage(text: str) -> str:
    """A passage cache storage scheme (--cache-dtype): float32, bfloat16, int8 or pca<d>
    (`dil_jax.open_domain.compression`; d <= the hidden size is checked once the model loads)."""
    from dil_jax.open_domain.compression import CacheStorageError, Storage

    try:
        return Storage.parse(text).name
    except CacheStorageError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


cache_storage.__name__ = "cache storage"


def int_list(element: Callable[[str], int]) -> Callable[[str], tuple[int, ...]]:
    """Comma-separated integers, e.g. `8,10,11`, each checked by `element`."""

    def parse(text: str) -> tuple[int, ...]:
        values = tuple(element(part.strip()) for part in text.split(",") if part.strip())
        if not values:
            raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
        return values

    parse.__name__ = f"comma-separated list of {element.__name__}"
    return parse


def check_window_flags(max_passage_len: int, doc_stride: int,
                       length_flag: str = "--max-passage-len",
                       stride_flag: str = "--doc-stride") -> None:
    """Windows hold max_passage_len - 1 passage tokens and a [SEP] and advance by doc_stride: a
    stride beyond a window would skip passage text, so it must be < max_passage_len."""
    from dil_jax.errors import UsageError

    if doc_stride >= max_passage_len:
        raise UsageError(f"{stride_flag} {doc_stride} must be smaller than {length_flag} "
                         f"{max_passage_len} (a window holds {length_flag} - 1 passage tokens "
                         f"and moves by {stride_flag}); lower {stride_flag} or raise "
                         f"{length_flag}")


def require_file(path: str, flag: str, what: str = "file") -> None:
    """Raises InputFileError unless `path` (given as `flag`) is an existing file (not a folder)."""
    import os

    from dil_jax.errors import InputFileError

    if os.path.isdir(path):
        raise InputFileError(f"{flag} {path} is a folder, not a {what}; give the {what} itself")
    if not os.path.exists(path):
        raise InputFileError(f"{flag} {path}: no such {what}")


def add_reading_arguments(parser: argparse.ArgumentParser, where: str) -> None:
    """--prescreen/--top-m/--mass of the commands that read (`where` completes the help)."""
    parser.add_argument("--prescreen", default=None, metavar="PRESCREENER",
                        help="read only the prescreened sentences of each passage in the upper "
                             "blocks ('default' = the bundled prescreener, or a folder written "
                             f"by dil-jax prescreen){where}")
    parser.add_argument("--top-m", type=positive_int, default=2,
                        help="with --prescreen: keep the m best sentences of each passage")
    parser.add_argument("--mass", type=fraction, default=None,
                        help="with --prescreen: keep the fewest best sentences holding this "
                             "much probability (at most --top-m)")


def prescreen_from_args(args: argparse.Namespace) -> tuple | None:
    """(SentencePrescreener, SentenceRule) of --prescreen/--top-m/--mass, or None."""
    if not args.prescreen:
        return None
    from dil_jax.prescreening.prescreener import SentencePrescreener
    from dil_jax.prescreening.screen import SentenceRule

    return (SentencePrescreener.load(args.prescreen),
            SentenceRule(top_m=args.top_m, mass=args.mass))
