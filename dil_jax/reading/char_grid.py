"""Reading a question x passage grid with QANet or BiDAF, on all devices.

QANet and BiDAF are delayed-interaction readers by construction: question and passage go through
the embedding (and QANet's embedding encoder, BiDAF's contextual BiLSTM) separately, and meet only
at context-query attention. `CharPairGrid` reads them the way `PairGrid` reads a DilBERT: each
question and each distinct passage once through `encode_lower`, every (question, passage) pair
through `encode_upper`, in fixed-size chunks split over the devices of a 1-D mesh. A passage's
state depends on the passage alone, so it is what a cache may hold.

What `PairGrid` has and this has not: no `ReusePlan` (QANet's split is not "k of l blocks": no
hoisted first-block projections, attention statistics or last-block rows), no k = 0 passage ids
and no sentence prescreening. Chunks are cut to their real tokens (`trim_padding`) only where that
is exact: not with LSH attention in QANet's model encoder, whose buckets depend on the length.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from dil_jax.model.char_reader import CharModel
from dil_jax.model.delayed import InputError
from dil_jax.model.qanet import Variables
from dil_jax.model.qanet_inputs import QANetSegment, fit_chars
from dil_jax.reading.chunks import chunk_spans, padded_chunk
from dil_jax.reading.grid import MeshGrid, uncut_columns
from dil_jax.reading.pairs import (
    KEPT_BUCKET,
    QUESTION_BUCKET,
    SpanScores,
    chunk_width,
    collect_chunks,
    every_pair,
    real_lengths,
)
from dil_jax.rounding import round_up


def trims_exactly(model: CharModel) -> bool:
    """Whether reading a chunk cut to its real tokens gives what the full width gives: not for
    a QANet with LSH attention in its model encoder (the buckets follow the sequence length)."""
    return "model" not in getattr(model.config, "lsh_encoders", ())


def _check_whole_windows(*reuse: Any) -> None:
    """InputError unless every `PairGrid`-only argument is None: a QANet / BiDAF reads whole
    windows (no kept tokens) and hoists nothing into its pairs."""
    if any(value is not None for value in reuse):
        raise InputError("a QANet / BiDAF pair grid reads whole windows with nothing hoisted: "
                         "positions, q_qkv, p_qkv and p_stats must be None")


class CharPairGrid(MeshGrid):
    """Encodes segments and reads pair grids with one QANet / BiDAF on one mesh.

    Compiled functions are cached per instance; batch and chunk sizes are rounded up to a
    multiple of the device count so every device gets an equal slice. trim_padding (where
    `trims_exactly`): each chunk reads only its longest real question and passage, rounded up
    to QUESTION_BUCKET / KEPT_BUCKET tokens (a few compiled widths).
    """

    def __init__(self, model: CharModel, mesh: Mesh | None = None, batch_size: int = 32,
                 chunk_size: int | None = None, trim_padding: bool = True):
        """chunk_size: pairs per step of the pair program; None = `default_pair_chunk_size`
        for the platform of the mesh's devices."""
        self.model = model
        self.trim_padding = trim_padding and trims_exactly(model)
        super().__init__(mesh, batch_size, chunk_size)

    def programs(self) -> dict[str, Any]:
        """"lower" (variables, ids, chars, mask of one batch of segments) and "pairs" (one
        chunk: the arguments of `_read_chunk`, the widths None = untrimmed)."""
        return {"lower": self._lower_fn, "pairs": self._pair_fn}

    # --------------------------------------------------------------------- one segment

    @functools.cached_property
    def _lower_fn(self):
        def lower(variables, ids, chars, mask):
            segment = QANetSegment(ids, fit_chars(chars, self.model.config.max_chars), mask)
            return self.model.encode_lower(variables, segment)

        return jax.jit(lower, in_shardings=(self.replicated, self.sharded, self.sharded,
                                            self.sharded),
                       out_shardings=self.sharded)

    def encode_segments(self, variables: Variables, segment: QANetSegment) -> jax.Array:
        """States of many segments (questions or passages: the same weights), in
        device-sharded batches of `batch_size` (the last one padded).

        segment: ids, mask [n, seq], chars [n, seq, slots] (any integer dtype; the model keeps
        its `max_chars` of the slots) -> [n, seq, d_model], replicated for the pair phase.
        """
        ids = np.asarray(segment.ids, np.int32)
        chars = np.asarray(segment.chars)
        mask = np.asarray(segment.mask, np.int32)
        n = ids.shape[0]
        padded = round_up(max(n, 1), self.batch_size)

        def pad(array):
            return np.pad(array, [(0, padded - n)] + [(0, 0)] * (array.ndim - 1))

        ids, chars, mask = pad(ids), pad(chars), pad(mask)
        batches = [self._lower_fn(variables, *(jax.device_put(a[i:i + self.batch_size],
                                                              self.sharded)
                                               for a in (ids, chars, mask)))
                   for i in range(0, padded, self.batch_size)]
        return jax.device_put(jnp.concatenate(batches, axis=0)[:n], self.replicated)

    def encode_batch(self, variables: Variables, segment: QANetSegment) -> jax.Array:
        """States of one batch of segments through the lower program as it is: rows split over
        the devices, nothing padded or joined ([b, seq, d_model], sharded). For callers that
        pad and join on the host (a server: one program per batch shape)."""
        # As the cache builder's program reads them: the mask in int32.
        arrays = (segment.ids, segment.chars, np.asarray(segment.mask, np.int32))
        return self._lower_fn(variables, *(jax.device_put(a, self.sharded) for a in arrays))

    encode_questions = encode_segments
    encode_passages = encode_segments

    # --------------------------------------------------------------------- pairs

    def _read_chunk(self, variables, q_state, q_mask, p_state, p_mask, q_index, p_index,
                    q_width=None, p_width=None):
        """Span scores of one chunk of pairs (traced inside jit). q_width, p_width (static):
        read only the first q_width question and p_width passage tokens of every segment; the
        passage tokens cut off score PADDED_LOGIT, as padding does."""
        p_len = p_mask.shape[1]
        if q_width is not None:
            q_state, q_mask = q_state[:, :q_width], q_mask[:, :q_width]
        if p_width is not None:
            p_state, p_mask = p_state[:, :p_width], p_mask[:, :p_width]
        out = self.model.encode_upper(variables, q_state[q_index], q_mask[q_index],
                                            p_state[p_index], p_mask[p_index])
        start, end = out.start_logits, out.end_logits
        if p_width is not None:
            start, end = uncut_columns(start, end, p_len)
        return start, end, out.null_start_logits, out.null_end_logits

    @functools.cached_property
    def _pair_fn(self):
        # Only index vectors cross to the devices; each device gathers its own pairs from the
        # replicated states.
        rep, shard = self.replicated, self.sharded
        return jax.jit(self._read_chunk, in_shardings=(rep, rep, rep, rep, rep, shard, shard),
                       out_shardings=shard, static_argnums=(7, 8))

    def iter_pair_chunks(self, variables: Variables, q_state: jax.Array, q_mask: np.ndarray,
                         p_state: jax.Array, p_mask: np.ndarray, q_index: np.ndarray,
                         p_index: np.ndarray, positions: None = None, q_qkv: None = None,
                         p_qkv: None = None, p_stats: None = None
                         ) -> Iterator[tuple[np.ndarray, tuple[jax.Array, ...]]]:
        """Yields (indices into the pair list, device outputs) chunk by chunk.

        q_state: [nq, q_len, d] and p_state: [np, p_len, d] (`encode_segments`); q_mask,
        p_mask: [nq, q_len], [np, p_len]; q_index, p_index: [num_pairs] int. positions, q_qkv,
        p_qkv, p_stats: `PairGrid.iter_pair_chunks`' (kept tokens, hoisted first-upper-block
        arrays), taken so that both grids are called alike; none applies here (InputError
        unless None). With trimming,
        pairs are taken in order of passage length, so that each chunk is padded only to its
        own longest. Outputs per chunk: start/end [chunk, p_len], null start/end [chunk]; the
        first len(indices) rows are real.
        """
        _check_whole_windows(positions, q_qkv, p_qkv, p_stats)
        num_pairs = len(q_index)
        q_len, p_len = np.shape(q_mask)[1], np.shape(p_mask)[1]
        if np.shape(q_state)[:2] != np.shape(q_mask) or np.shape(p_state)[:2] != np.shape(p_mask):
            raise ValueError(f"states {np.shape(q_state)} / {np.shape(p_state)} do not match "
                             f"their masks {np.shape(q_mask)} / {np.shape(p_mask)}")
        q_mask_host = np.asarray(q_mask, np.int32)
        p_mask_host = np.asarray(p_mask, np.int32)
        q_mask = jax.device_put(q_mask_host, self.replicated)
        p_mask = jax.device_put(p_mask_host, self.replicated)
        # Placed as the programs take it whether it comes from the host (a context's windows)
        # or already on the devices (a served reader's resident passage side): one sharding,
        # so one compiled program for both.
        p_state = jax.device_put(p_state, self.replicated)
        q_index = np.asarray(q_index, np.int32)
        p_index = np.asarray(p_index, np.int32)
        if self.trim_padding:
            q_real, p_real = real_lengths(q_mask_host), real_lengths(p_mask_host)
            order = np.argsort(p_real[p_index], kind="stable")
        else:
            order = np.arange(num_pairs)
        # What the chunk program's shape depends on besides the chunk's own (`ShapeBook`).
        signature = (np.shape(q_mask_host), np.shape(p_mask_host))
        for span in chunk_spans(num_pairs, self.chunk_size):
            pairs = order[span]
            q_width = p_width = None
            if self.trim_padding:
                q_width = chunk_width(q_real[q_index[pairs]], QUESTION_BUCKET, q_len)
                p_width = chunk_width(p_real[p_index[pairs]], KEPT_BUCKET, p_len)
            shape = self.chunk_shape(signature, len(pairs), q_width, p_width)
            # Padding pairs repeat the chunk's last pair and are dropped by the caller.
            chunk_q = padded_chunk(q_index[pairs], shape.rows)
            chunk_p = padded_chunk(p_index[pairs], shape.rows)
            yield pairs, self._pair_fn(variables, q_state, q_mask, p_state, p_mask, chunk_q,
                                       chunk_p, shape.q_width, shape.p_width)

    def read_pairs(self, variables: Variables, q_state: jax.Array, q_mask: np.ndarray,
                   p_state: jax.Array, p_mask: np.ndarray, q_index: np.ndarray,
                   p_index: np.ndarray, positions: None = None, q_qkv: None = None,
                   p_qkv: None = None, p_stats: None = None,
                   on_chunk: Callable[[int], None] | None = None) -> SpanScores:
        """The span scores of every listed pair as numpy arrays: [num_pairs, p_len] and
        [num_pairs], row i for pair i (inputs as `iter_pair_chunks`). on_chunk (optional):
        called with the number of pairs of each chunk once it is read (a progress bar)."""
        chunks = self.iter_pair_chunks(variables, q_state, q_mask, p_state, p_mask, q_index,
                                       p_index, positions, q_qkv, p_qkv, p_stats)
        return collect_chunks(chunks, len(q_index), np.shape(p_mask)[1], on_chunk)

    def read_grid(self, variables: Variables, q_state: jax.Array, q_mask: np.ndarray,
                  p_state: jax.Array, p_mask: np.ndarray) -> SpanScores:
        """Every (question, passage) pair: scores [nq, np, p_len] / [nq, np]."""
        nq, np_ = np.shape(q_mask)[0], np.shape(p_mask)[0]
        q_index, p_index = every_pair(nq, np_)
        return self.read_pairs(variables, q_state, q_mask, p_state, p_mask, q_index,
                               p_index).reshape(nq, np_)
