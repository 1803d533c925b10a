"""Chunks of pairs: a short chunk runs short, and a chunk run at a larger booked shape (a
server's compiled one) gives the scores of a direct per-pair forward."""

from __future__ import annotations

import numpy as np
import pytest

from dil_jax.reading.chunks import (
    CHUNK_CALL_TOKENS,
    ChunkShape,
    ShapeBook,
    chunk_row_choices,
    chunk_rows,
    chunk_spans,
    padded_chunk,
    width_spans,
)

from tests.reading.test_grid import TINY_ENCODER, _tiny_segments


def test_row_choices_are_powers_of_two_of_the_device_count_up_to_the_chunk():
    assert chunk_row_choices(8) == [1, 2, 4, 8]
    assert chunk_row_choices(6) == [1, 2, 4, 6]
    assert chunk_row_choices(1) == [1]
    assert chunk_row_choices(16, 8) == [8, 16]
    assert chunk_row_choices(24, 8) == [8, 16, 24]
    assert [chunk_rows(n, 8) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert [chunk_rows(n, 16, 8) for n in (1, 8, 9, 16)] == [8, 8, 16, 16]
    with pytest.raises(ValueError, match="multiple of the device count"):
        chunk_row_choices(12, 8)
    with pytest.raises(ValueError, match="1..8 pairs, got 9"):
        chunk_rows(9, 8)


def test_the_short_chunk_comes_first_and_every_pair_once():
    assert list(chunk_spans(19, 8)) == [slice(0, 3), slice(3, 11), slice(11, 19)]
    assert list(chunk_spans(16, 8)) == [slice(0, 8), slice(8, 16)]
    assert list(chunk_spans(5, 8)) == [slice(0, 5)]
    assert list(chunk_spans(0, 8)) == []
    assert padded_chunk(np.array([4, 7]), 4).tolist() == [4, 7, 7, 7]


def test_a_book_runs_a_chunk_at_the_cheapest_recorded_shape_that_holds_it():
    book = ShapeBook()
    wide, narrow = ChunkShape(8, 32, 192), ChunkShape(8, 8, 64)
    needed = ChunkShape(1, 8, 32)
    assert book.shape_for("s", needed) == needed  # nothing recorded: its own shape
    book.compiling = True
    assert book.shape_for("s", wide) == wide and book.shape_for("s", narrow) == narrow
    book.compiling = False
    assert book.shape_for("s", needed) == narrow
    assert book.shape_for("s", ChunkShape(4, 16, 64)) == wide  # the narrow one is too narrow
    assert book.shape_for("other", needed) == needed  # shapes are per signature
    book.add("s", needed)
    assert book.shape_for("s", needed) == needed
    # Untrimmed widths (None) only hold untrimmed ones.
    assert not ChunkShape(8).holds(ChunkShape(1, 8, 32))
    assert ChunkShape(8).holds(ChunkShape(2)) and not ChunkShape(2).holds(ChunkShape(8))


class RecordingBook(ShapeBook):
    """A book that records the shapes it hands out once compiling is over."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: list[ChunkShape] = []

    def shape_for(self, signature, needed: ChunkShape) -> ChunkShape:
        shape = super().shape_for(signature, needed)
        if not self.compiling:
            self.handed.append(shape)
        return shape


@pytest.mark.parametrize("k", [0, 2])
def test_chunks_run_short_or_at_a_booked_shape_and_score_as_the_direct_forward(k):
    """Pair counts 1..9 on chunks of 8: each chunk's program has the rows of `chunk_rows`, and
    every pair's scores equal the model's direct forward over `[CLS] q [SEP] p [SEP]` (the
    reference of test_grid.py); then the same with every chunk run at one booked wide shape."""
    import jax

    from dil_jax.model.delayed import DelayedInteractionModel
    from dil_jax.model.encoder_config import EncoderConfig
    from dil_jax.reading.grid import PairGrid

    model = DelayedInteractionModel(EncoderConfig(**TINY_ENCODER, num_lower_layers=k))
    params = model.init(jax.random.key(0))
    # Passages of 48 token slots: chunks read 32 or 48 of them (KEPT_BUCKET 32).
    rng = np.random.default_rng(3)
    q_ids, q_mask, _, _ = _tiny_segments(3, (16,))
    p_ids = rng.integers(1, 50, (5, 48)).astype(np.int32)
    p_mask = (np.arange(48)[None] < np.array([[48], [9], [4], [40], [20]])).astype(np.int32)
    grid = PairGrid(model, batch_size=2, chunk_size=8)
    q_lower = grid.encode_questions(params, q_ids, q_mask)
    p_source = p_ids if k == 0 else grid.encode_passages(params, p_ids, p_mask)
    qi, pi = (a.ravel() for a in np.meshgrid(np.arange(2), np.arange(5), indexing="ij"))
    direct = model(params, q_ids[qi], q_mask[qi], p_ids[pi], p_mask[pi])
    for book in (None, RecordingBook()):
        grid.shape_book = book
        if book is not None:
            # Every pair count, every pair reading passage 0 (48 real tokens): the widest shape
            # of each row count and signature (whether the pair count makes the grid project
            # the first upper block once per question: 0 < k only), as a warm-up records them.
            book.compiling = True
            for n in range(1, 10):
                list(grid.iter_pair_chunks(params, q_lower, q_mask, p_source, p_mask, qi[:n],
                                           pi[:n] * 0))
            book.compiling = False
        for n in range(1, 10):
            rows, scores = [], np.zeros((n, 48), np.float32)
            for pairs, outputs in grid.iter_pair_chunks(params, q_lower, q_mask, p_source,
                                                        p_mask, qi[:n], pi[:n]):
                rows.append(np.shape(outputs[0])[0])
                scores[pairs] = np.asarray(outputs[0])[:len(pairs)]
            if n > 8:  # more than a chunk: the short remainder first, then whole chunks
                assert rows == [chunk_rows(n % 8, 8), 8], n
            else:  # a short list: cut where its widths differ when that is cheaper
                assert sum(rows) <= chunk_rows(n, 8), (n, rows)
            np.testing.assert_allclose(scores, np.asarray(direct.start_logits)[:n], atol=1e-5,
                                       err_msg=f"{n} pairs, book {book is not None}")
        if book is not None:  # passages 1-4 alone would read 32 tokens: all read at 48
            assert {shape.p_width for shape in book.handed} == {48}


@pytest.mark.parametrize("pairs, chunk_size, devices, rows", [
    (0, 16, 1, 0), (1, 16, 1, 1), (3, 16, 1, 4), (16, 16, 1, 16),
    # 19 = one whole chunk and a remainder of 3, run at 4 rows
    (19, 16, 1, 20), (33, 16, 1, 33),
    # two devices: rows come in 2, 4, 8 (per-device slices); 3 -> 4, 1 -> 2
    (1, 8, 2, 2), (11, 8, 2, 12)])
def test_padded_pairs_by_hand(pairs, chunk_size, devices, rows):
    from dil_jax.reading.chunks import padded_pairs

    assert padded_pairs(pairs, chunk_size, devices) == rows


def test_width_spans_takes_the_cheapest_cut_between_unequal_widths():
    """By hand, with rows x width as each chunk's cost (rows: `chunk_rows` on chunks of 8) and
    CHUNK_CALL_TOKENS (F) more per chunk."""
    def cost_of(widths):
        def cost(start, end):
            return chunk_rows(end - start, 8) * max(widths[start:end])
        return cost

    call = CHUNK_CALL_TOKENS
    # Equal widths are never cut, even where cutting would drop padding rows (3 -> 2 + 1).
    assert width_spans([64] * 3, cost_of([64] * 3), 8) == [slice(0, 3)]
    # A short tail and a full window: 2 x 200 + F = 416 as one chunk, 40 + 200 + 2F = 272 cut.
    assert width_spans([40, 200], cost_of([40, 200]), 8) == [slice(0, 1), slice(1, 2)]
    # Nearly equal: 2 x 200 + F = 416 against 192 + 200 + 2F = 424: one chunk.
    assert width_spans([192, 200], cost_of([192, 200]), 8) == [slice(0, 2)]
    # Three: [40, 48, 200]: {40, 48} + {200} = 2 x 48 + 200 + 2F = 328 beats each alone
    # (40 + 48 + 200 + 3F = 336) and all together (4 x 200 + F = 816).
    widths = [40, 48, 200]
    assert width_spans(widths, cost_of(widths), 8) == [slice(0, 2), slice(2, 3)]
    assert 2 * 48 + 200 + 2 * call < min(40 + 48 + 200 + 3 * call, 4 * 200 + call)
    for bad in (0, 9):
        with pytest.raises(ValueError, match=f"got {bad}"):
            width_spans([1] * bad, cost_of([1] * max(bad, 1)), 8)


@pytest.mark.parametrize("k", [0, 2])
def test_a_window_and_its_short_tail_are_read_apart_and_score_as_the_direct_forward(k):
    """A context's full window and its short tail (96 and 4 real tokens of 96; the question's 5
    read as 8): one chunk would read 2 x (8 + 96) = 208 tokens + CHUNK_CALL_TOKENS, two
    chunks (8 + 32) + (8 + 96) + 2 x CHUNK_CALL_TOKENS = 176: two one-row chunks, each at its
    own width, scoring as the direct forward."""
    import jax

    from dil_jax.model.delayed import DelayedInteractionModel
    from dil_jax.model.encoder_config import EncoderConfig
    from dil_jax.reading.grid import PairGrid

    config = EncoderConfig(**{**TINY_ENCODER, "max_position_embeddings": 128},
                           num_lower_layers=k)
    model = DelayedInteractionModel(config)
    params = model.init(jax.random.key(0))
    rng = np.random.default_rng(5)
    q_ids, q_mask, _, _ = _tiny_segments(1, (16,))
    p_ids = rng.integers(1, 50, (2, 96)).astype(np.int32)
    p_mask = (np.arange(96)[None] < np.array([[96], [4]])).astype(np.int32)
    grid = PairGrid(model, batch_size=1, chunk_size=8)
    q_lower = grid.encode_questions(params, q_ids, q_mask)
    p_source = p_ids if k == 0 else grid.encode_passages(params, p_ids, p_mask)
    qi, pi = np.zeros(2, np.int64), np.arange(2)
    direct = model(params, q_ids[qi], q_mask[qi], p_ids, p_mask)
    chunks = [(pairs.tolist(), np.asarray(outputs[0]))
              for pairs, outputs in grid.iter_pair_chunks(params, q_lower, q_mask, p_source,
                                                          p_mask, qi, pi)]
    assert [pairs for pairs, _ in chunks] == [[1], [0]]  # the tail first, each alone
    assert [start.shape[0] for _, start in chunks] == [1, 1]
    assert (8 + 32) + (8 + 96) + 2 * CHUNK_CALL_TOKENS < 2 * (8 + 96) + CHUNK_CALL_TOKENS
    for pairs, start in chunks:
        np.testing.assert_allclose(start[0], np.asarray(direct.start_logits)[pairs[0]],
                                   atol=1e-5)
