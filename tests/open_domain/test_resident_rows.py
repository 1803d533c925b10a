"""`ResidentRows`: a served reader's passage side kept on the devices, each read writing its own
rows first (checked by hand on small arrays)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from dil_jax.open_domain.reader import ResidentRows
from dil_jax.serve.metrics import CompileCounter


def _resident(rows: int) -> ResidentRows:
    return ResidentRows(rows, jax.sharding.SingleDeviceSharding(jax.devices()[0]))


def test_a_write_puts_its_rows_first_and_leaves_the_rest():
    resident = _resident(8)
    first = np.arange(3 * 2 * 5, dtype=np.float32).reshape(3, 2, 5)
    written = np.asarray(resident.write_rows("side", first))
    assert written.shape == (8, 2, 5) and written.dtype == np.float32
    np.testing.assert_array_equal(written[:3], first)
    np.testing.assert_array_equal(written[3:], 0)
    # One row over three: row 0 is new, rows 1-2 still the first write's (no pair reads them).
    second = np.full((1, 2, 5), -1.0, np.float32)
    again = resident.write_rows("side", second)
    np.testing.assert_array_equal(np.asarray(again[0]), second[0])
    np.testing.assert_array_equal(np.asarray(again[1:3]), first[1:3])


def test_a_tree_of_arrays_is_written_leaf_by_leaf_in_their_dtypes():
    resident = _resident(4)
    values = (np.ones((2, 3), np.int32), {"x": np.full((2,), 0.5, np.float32)})
    ids, named = resident.write_rows("tree", values)
    assert ids.shape == (4, 3) and ids.dtype == np.int32 and named["x"].shape == (4,)
    np.testing.assert_array_equal(np.asarray(ids), [[1] * 3, [1] * 3, [0] * 3, [0] * 3])
    np.testing.assert_array_equal(np.asarray(named["x"]), [0.5, 0.5, 0, 0])


def test_an_earlier_write_is_given_up():
    """The buffers are donated to the next write: an array an earlier call returned is deleted,
    so no caller can read rows a later read replaced."""
    resident = _resident(4)
    old = resident.write_rows("side", np.ones((1, 2), np.float32))
    resident.write_rows("side", np.zeros((1, 2), np.float32))
    assert old.is_deleted()


def test_rows_beyond_the_buffer_are_refused():
    with pytest.raises(ValueError, match="9 rows to write: the passage side holds at most 8"):
        _resident(8).write_rows("side", np.ones((9, 2), np.float32))


def test_no_rows_writes_nothing():
    """A read with nothing retrieved reads no passage: the buffers are given as they are
    (zeros before any write)."""
    resident = _resident(4)
    empty = np.asarray(resident.write_rows("side", np.zeros((0, 2), np.float32)))
    assert empty.shape == (4, 2) and not empty.any()
    resident.write_rows("side", np.ones((2, 2), np.float32))
    np.testing.assert_array_equal(
        np.asarray(resident.write_rows("side", np.zeros((0, 2), np.float32)))[:2], 1)


def test_compiled_writes_cover_every_row_count():
    """After `compile_writes` no write of 1..rows rows compiles (row counts run at powers of
    two, capped at the buffer's rows: 1, 2, 4, 8, 12 for 12 rows)."""
    CompileCounter.register()
    resident = _resident(12)
    resident.compile_writes("side", np.zeros((1, 3, 7), np.float16))
    before = CompileCounter.count
    for n in range(1, 13):
        resident.write_rows("side", np.ones((n, 3, 7), np.float16))
    assert CompileCounter.count == before
