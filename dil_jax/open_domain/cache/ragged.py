"""Ragged rows: a cache's per-token arrays kept as real tokens only, and read back padded.

A window row r of a cache holds `lengths[r]` real tokens (`p [SEP]`), then padding up to
p_len; its mask is ones then zeros (a prefix: `window_contexts` makes every window so). The
ragged store keeps only the real tokens, row after row, in one array [num_tokens, ...], with

    token_starts  [num_rows + 1] int64: row r is tokens token_starts[r] .. token_starts[r + 1] - 1

(token_starts[0] = 0, token_starts[-1] = num_tokens). Reading rows gathers their tokens and pads
them back to [n, p_len, ...] with a fill value (the tokenizer's pad id for ids, NO_OFFSET for
offsets, 0 for states: a padding slot's stored value was never read, by the mask).

All functions are pure numpy; the store itself is `dil_jax.open_domain.cache.zarr_store`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dil_jax.errors import DilJaxError


class RaggedError(DilJaxError, ValueError):
    """Rows that cannot be stored ragged (a mask that is not a prefix of ones, padding that
    holds something else than the pad value); the message names the row."""


def row_lengths(mask: np.ndarray) -> np.ndarray:
    """[n] int64 real tokens of each row of mask [n, p_len] (ones then zeros); RaggedError
    naming the first row whose mask is not such a prefix."""
    mask = np.asarray(mask) != 0
    lengths = mask.sum(axis=1).astype(np.int64)
    prefix = np.arange(mask.shape[1])[None, :] < lengths[:, None]
    bad = np.nonzero((prefix != mask).any(axis=1))[0]
    if len(bad):
        raise RaggedError(f"row {int(bad[0])}: its mask is not ones then zeros, so its real "
                          "tokens are not a prefix and cannot be stored without padding")
    return lengths


def starts_of(lengths: np.ndarray, first: int = 0) -> np.ndarray:
    """[n + 1] int64 token starts of rows of these lengths [n], the first at token `first`."""
    return np.concatenate([[0], np.cumsum(np.asarray(lengths, np.int64))]) + int(first)


def check_padding(values: np.ndarray, lengths: np.ndarray, pad: int | float, name: str) -> None:
    """RaggedError unless every padding slot of values [n, p_len, ...] (slots past each row's
    length) holds `pad`: what `unpack` restores there, so ragged storage loses nothing."""
    values = np.asarray(values)
    padding = np.arange(values.shape[1])[None, :] >= np.asarray(lengths)[:, None]  # [n, p_len]
    differs = (values != pad).reshape(values.shape[:2] + (-1,)).any(axis=2) & padding
    bad = np.nonzero(differs.any(axis=1))[0]
    if len(bad):
        raise RaggedError(f"{name}: row {int(bad[0])} holds something else than {pad} in its "
                          "padding slots; a ragged store would not give it back")


def pack(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """values [n, p_len, ...] -> [sum(lengths), ...]: each row's first lengths[r] slots, row
    after row."""
    values = np.asarray(values)
    real = np.arange(values.shape[1])[None, :] < np.asarray(lengths)[:, None]
    return values[real]  # boolean indexing walks rows in order, each row's slots in order


def token_index(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """[sum(lengths)] int64 flat token positions of rows whose tokens begin at starts [n] and
    number lengths [n], row after row (what one read of the ragged array gathers)."""
    starts, lengths = np.asarray(starts, np.int64), np.asarray(lengths, np.int64)
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, np.int64)
    # Position within its row of each gathered token, plus its row's start.
    row = np.repeat(np.arange(len(lengths)), lengths)
    within = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return starts[row] + within


def unpack(flat: np.ndarray, lengths: np.ndarray, p_len: int, fill: int | float = 0,
           dtype=None) -> np.ndarray:
    """flat [sum(lengths), ...] (rows' tokens, row after row) -> [n, p_len, ...] with `fill`
    in the padding slots; `pack`'s inverse on the real tokens."""
    flat = np.asarray(flat)
    lengths = np.asarray(lengths, np.int64)
    if len(lengths) and int(lengths.max()) > p_len:
        raise RaggedError(f"a row of {int(lengths.max())} tokens is longer than p_len = {p_len}")
    out = np.full((len(lengths), p_len) + flat.shape[1:], fill, dtype or flat.dtype)
    real = np.arange(p_len)[None, :] < lengths[:, None]
    out[real] = flat
    return out


def mask_of(lengths: Sequence[int] | np.ndarray, p_len: int) -> np.ndarray:
    """[n, p_len] int32: ones for each row's real tokens, zeros after."""
    return (np.arange(p_len)[None, :] < np.asarray(lengths, np.int64)[:, None]).astype(np.int32)
