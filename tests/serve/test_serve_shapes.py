"""Batch shapes of `dil-jax serve` (`--batch-shapes`): which question counts get their own
passage-row padding, and which padded reader a batch or a `/v1/read` context is read with.
No model: the readers are stand-ins carrying what the choice looks at."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from dil_jax.open_domain.index.windows import PassageWindows
from dil_jax.serve.engine import PreparedContext, context_groups
from dil_jax.serve.loading import ReadSettings, ServedReader, shaped_readers

# Windows per passage of a 6-passage index; questions read their top 2 passages.
WINDOW_COUNTS = np.array([3, 2, 2, 1, 1, 1])


INDEX = SimpleNamespace(windows=PassageWindows(
    first=np.concatenate([[0], np.cumsum(WINDOW_COUNTS)[:-1]]), count=WINDOW_COUNTS,
    passage_of_row=np.repeat(np.arange(len(WINDOW_COUNTS)), WINDOW_COUNTS)))


def _reader(batch_size: int):
    # passage_rows of a whole batch of 4: min(all 10 windows, 4 x (3 + 2)) = 10, rounded up
    # to whole 4 x 2 blocks: 16 (`shapes.passage_rows`).
    return SimpleNamespace(index=INDEX, top_p=2, passage_rows=16,
                           grid=SimpleNamespace(batch_size=batch_size))


def _smaller(count: int):
    """A stand-in of the reader for `count` questions (what loading.py builds)."""
    return SimpleNamespace(index=INDEX, top_p=2, passage_rows=None,
                           grid=SimpleNamespace(batch_size=count))


@pytest.mark.parametrize("shapes,batch,counts", [
    ((), 8, (8,)), ((1,), 8, (1, 8)), ((4, 1, 4, 8), 8, (1, 4, 8)), ((1,), 1, (1,))])
def test_shape_counts_always_end_with_the_batch_size(shapes, batch, counts):
    assert ReadSettings(batch_size=batch, batch_shapes=shapes).shape_counts() == counts


def test_each_count_pads_to_what_that_many_questions_read():
    reader = _reader(4)
    shaped = shaped_readers(reader, (1, 2, 4), _smaller)
    # 1 question: its 2 passages hold at most 3 + 2 = 5 windows, in whole 1 x 2 blocks: 6.
    # 2 questions: at most 10, in whole 2 x 4 blocks: 12 (still below a whole batch's 16).
    assert {n: r.passage_rows for n, r in shaped.items()} == {1: 6, 2: 12, 4: 16}
    assert {n: r.grid.batch_size for n, r in shaped.items()} == {1: 1, 2: 2, 4: 4}
    assert shaped[4] is reader and reader.passage_rows == 16  # the batch's rows stay


def test_a_batch_or_context_is_read_with_the_smallest_padding_that_holds_it():
    reader = _reader(4)
    served = ServedReader("delayed", "/ckpt", reader, None,
                          shaped_readers(reader, (1, 2, 4), _smaller))
    assert [served.for_questions(n).passage_rows for n in (1, 2, 3, 4)] == [6, 12, 16, 16]
    # (contexts, windows) -> the smallest shape holding both.
    assert [served.for_contexts(1, n).passage_rows for n in (1, 6, 7, 12, 13, 16)] == [
        6, 6, 12, 12, 16, 16]
    assert [served.for_contexts(n, 2).grid.batch_size for n in (1, 2, 3, 4)] == [1, 2, 4, 4]
    # No shapes (a fake engine's reader): the reader itself.
    bare = ServedReader("full", "/ckpt", reader, None)
    assert bare.for_questions(1) is reader and bare.for_contexts(1, 3) is reader


def _contexts(*window_counts: int) -> list[tuple[int, PreparedContext]]:
    return [(i, PreparedContext(None, SimpleNamespace(ids=np.zeros((n, 4))), None))
            for i, n in enumerate(window_counts)]


@pytest.mark.parametrize("counts,max_questions,max_windows,groups", [
    ((2, 3, 1, 4), 2, 5, [[0, 1], [2, 3]]),
    ((2, 3, 1, 4), 3, 4, [[0], [1, 2], [3]]),   # 2 + 3 > 4 windows
    ((1, 1, 1, 1, 1), 2, 10, [[0, 1], [2, 3], [4]]),  # 2 questions a batch
    ((5,), 8, 5, [[0]]),
])
def test_contexts_are_grouped_by_questions_and_windows(counts, max_questions, max_windows,
                                                       groups):
    got = context_groups(_contexts(*counts), max_questions, max_windows)
    assert [[position for position, _ in group] for group in got] == groups


def test_the_warm_up_context_of_several_windows_fits_the_rows_a_request_may_fill():
    """A small index's batches hold few passage rows: the warm-up's long context is cut to the
    most repetitions that fit (here each repetition adds one window to a first one), and left
    out where none does (a server over six one-window passages with batches of 2 has 6 rows;
    8 repetitions make 9 windows)."""
    from dil_jax.serve.engine import CHECK_CONTEXT, several_window_context

    def windows(text: str) -> int:
        return text.count(CHECK_CONTEXT) + 1

    assert several_window_context(windows, rows=6) == " ".join([CHECK_CONTEXT] * 5)
    assert several_window_context(windows, rows=40) == " ".join([CHECK_CONTEXT] * 8)
    assert several_window_context(windows, rows=2) is None
    assert several_window_context(lambda text: 1, rows=40) is None  # never several windows
