"""Reading a question x passage grid on all devices.

Questions and passages are each encoded once by `encode_lower`; every (question, passage) pair then
runs the upper blocks (`reading.upper.read_upper`). Which exact reuses the pairs use (the first
upper block's q/k/v once per segment, the passages' attention statistics, the last block's rows,
chunks cut to their real tokens) is the grid's `ReusePlan` (`reading.plan`); `PairGrid(reuse=False)`
is the reference computation. Pairs are processed in fixed-size chunks (a few compilations, one per
width, memory bounded by the chunk, not by q x p), and each chunk is split across all devices of
a 1-D `Mesh`.

The straight line: `encode_questions` and `passage_side` (ids at k = 0, lower states otherwise)
once per segment, then `read_pairs` (any list of pairs) or `read_grid` (every pair) for the span
scores as numpy arrays; `iter_pair_chunks` is the chunk loop under both. The token widths and
`SpanScores` this uses are `reading.pairs`'s (no device program there).

Why a Mesh and not pmap: `jax.pmap` is in maintenance mode. A `jit` whose pair-index inputs carry
a `NamedSharding` over the mesh's "data" axis gives the same per-device semantics as pmap (each
device reads its slice of the chunk; params and lower states are replicated), while working the
same way on 1 CPU, forced host devices, a GPU, or every chip of a multi-host TPU slice.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dil_jax.defaults import default_pair_chunk_size
from dil_jax.mesh import DATA_AXIS, data_mesh
from dil_jax.model.attention import QKV, PassageAttentionStats
from dil_jax.model.delayed import DelayedInteractionModel, InputError, Params, check_segment_lengths
from dil_jax.model.span_reader import PADDED_LOGIT, PASSAGE_SEGMENT, QUESTION_SEGMENT
from dil_jax.reading.chunks import (
    ChunkShape,
    ShapeBook,
    chunk_row_choices,
    chunk_rows,
    chunk_spans,
    padded_chunk,
    width_spans,
)
from dil_jax.reading.pairs import (
    KEPT_BUCKET,
    QUESTION_BUCKET,
    SpanScores,
    chunk_width,
    collect_chunks,
    every_pair,
    real_lengths,
)
from dil_jax.reading.plan import ReusePlan
from dil_jax.reading.upper import passage_attention_stats, project_upper, read_upper
from dil_jax.rounding import round_up


def uncut_columns(start: jax.Array, end: jax.Array, p_len: int) -> tuple[jax.Array, jax.Array]:
    """Span scores of a chunk read at fewer passage columns ([chunk, width]) back to the
    window's p_len: the cut tokens are padding, and score what the span head gives padding
    (PADDED_LOGIT), as if they had been read."""
    cut = ((0, 0), (0, p_len - start.shape[1]))
    return (jnp.pad(start, cut, constant_values=PADDED_LOGIT),
            jnp.pad(end, cut, constant_values=PADDED_LOGIT))


class MeshGrid:
    """What every grid shares: its 1-D mesh, batch and chunk sizes rounded up to a multiple of
    the device count (every device gets an equal slice), the replicated and batch-sharded
    placements, and lowering its jitted programs by name (`lowered`)."""

    def __init__(self, mesh: Mesh | None, batch_size: int, chunk_size: int | None):
        """chunk_size: pairs per step of the pair program; None = `default_pair_chunk_size`
        for the platform of the mesh's devices."""
        self.mesh = data_mesh() if mesh is None else mesh
        num_devices = self.mesh.devices.size
        if chunk_size is None:
            chunk_size = default_pair_chunk_size(self.mesh.devices.flat[0].platform)
        self.batch_size = round_up(batch_size, num_devices)
        self.chunk_size = round_up(chunk_size, num_devices)
        self.replicated = NamedSharding(self.mesh, P())
        self.sharded = NamedSharding(self.mesh, P(DATA_AXIS))
        # The compiled chunk shapes a server reads at (`ShapeBook`); None: each chunk runs at
        # its own shape.
        self.shape_book: ShapeBook | None = None

    def set_chunk_size(self, chunk_size: int) -> None:
        """Reads pairs `chunk_size` at a time from now on (rounded up to a multiple of the
        device count). The jitted programs take any chunk size (one compilation per shape);
        a shape book of compiled shapes is the caller's to keep right (set it before one)."""
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.chunk_size = round_up(chunk_size, self.mesh.devices.size)

    def chunk_shape(self, signature: Hashable, pairs: int, q_width: int | None,
                    p_width: int | None, book: bool = True, record: bool = True) -> ChunkShape:
        """The shape a chunk of `pairs` real pairs reading these widths runs at: its own
        (`chunk_rows`), or through the grid's `shape_book` when it has one and `book`.
        record=False: only to price the chunk (a compiling book records nothing)."""
        needed = ChunkShape(chunk_rows(pairs, self.chunk_size, self.mesh.devices.size), q_width,
                            p_width)
        if self.shape_book is None or not book:
            return needed
        if not record:
            return self.shape_book.would_run_at(signature, needed)
        return self.shape_book.shape_for(signature, needed)

    def chunk_row_choices(self) -> list[int]:
        """Every row count a chunk program of this grid runs at (`chunk_row_choices`)."""
        return chunk_row_choices(self.chunk_size, self.mesh.devices.size)

    def programs(self) -> dict[str, Any]:
        """The grid's jitted programs by name (each grid says which it has)."""
        raise NotImplementedError

    def lowered(self, program: str, *abstract_args: Any) -> jax.stages.Lowered:
        """One of this grid's jitted programs (`programs`) lowered for the given argument
        shapes. Arguments may be `jax.ShapeDtypeStruct`s: nothing runs. For reading the
        compiled programs' cost and memory (dil_jax.bench)."""
        programs = self.programs()
        if program not in programs:
            raise ValueError(f"unknown program {program!r}; programs: {sorted(programs)}")
        return programs[program].lower(*abstract_args)


class PairGrid(MeshGrid):
    """Encodes segments and reads pair grids with one model on one mesh.

    Compiled functions are cached per instance; batch and chunk sizes are rounded up to a
    multiple of the device count so every device gets an equal slice. `plan` holds the exact
    reuses the pairs use (`ReusePlan.for_config` of the model's config): reuse=False is the
    reference computation, every row of every upper block and full attention in each pair;
    trim_padding=False keeps the other reuses but reads every segment at its full length (to
    time what trimming adds).
    """

    def __init__(self, model: DelayedInteractionModel, mesh: Mesh | None = None,
                 batch_size: int = 32, chunk_size: int | None = None, reuse: bool = True,
                 trim_padding: bool = True):
        """chunk_size: pairs per step of the pair program; None = `default_pair_chunk_size`
        for the platform of the mesh's devices."""
        self.model = model
        # The caller's switches, kept for grids made alike (bench.programs); the decisions
        # they lead to are the plan's.
        self.reuse, self.trim_padding = reuse, trim_padding
        self.plan = ReusePlan.for_config(model.config, reuse=reuse, trim_padding=trim_padding)
        super().__init__(mesh, batch_size, chunk_size)

    def programs(self) -> dict[str, Any]:
        """"lower" (encode_lower: params, ids, mask, segment), "project" (project_upper:
        params, lower states), "stats" (passage_attention_stats: the passages' query, key,
        value, mask) and "pairs" (one chunk of pairs: the arguments of `_read_chunk`)."""
        return {"lower": self._lower_fn, "project": self._project_fn, "stats": self._stats_fn,
                "pairs": self._pair_fn}

    # --------------------------------------------------------------------- lower blocks

    @functools.cached_property
    def _lower_fn(self):
        def lower(params, ids, mask, segment):
            return self.model.encode_lower(params, ids, mask, segment)

        return jax.jit(lower, static_argnums=3,
                       in_shardings=(self.replicated, self.sharded, self.sharded),
                       out_shardings=self.sharded)

    @functools.cached_property
    def _project_fn(self):
        return jax.jit(functools.partial(project_upper, self.model),
                       in_shardings=(self.replicated, self.sharded), out_shardings=self.sharded)

    @functools.cached_property
    def _stats_fn(self):
        def stats(query, key, value, mask):
            return passage_attention_stats(self.model, (query, key, value), mask)

        return jax.jit(stats, in_shardings=(self.sharded,) * 4, out_shardings=self.sharded)

    def _in_batches(self, fn, params: Params, *arrays):
        """fn(params, *batch) over the rows of `arrays` in device-sharded batches of
        `batch_size` (the last one padded), outputs concatenated and replicated for the pair
        phase."""
        n = arrays[0].shape[0]
        padded = round_up(max(n, 1), self.batch_size)
        pad = jnp.pad if isinstance(arrays[0], jax.Array) else np.pad
        arrays = [pad(a, [(0, padded - n)] + [(0, 0)] * (a.ndim - 1)) for a in arrays]
        # device_put: a replicated input (lower states) is resharded along the batch first.
        batches = [fn(params, *(jax.device_put(a[i:i + self.batch_size], self.sharded)
                                for a in arrays))
                   for i in range(0, padded, self.batch_size)]
        joined = jax.tree.map(lambda *parts: jnp.concatenate(parts, axis=0)[:n], *batches)
        return jax.device_put(joined, self.replicated)

    def encode_segments(self, params: Params, ids: np.ndarray, mask: np.ndarray,
                        segment: int) -> jax.Array:
        """Lower states of many segments, in device-sharded batches.

        ids, mask: [n, seq] -> [n, seq, hidden] (a device array, replicated for the pair phase).
        """
        return self._in_batches(lambda p, i, m: self._lower_fn(p, i, m, segment), params,
                                np.asarray(ids), np.asarray(mask))

    def encode_batch(self, params: Params, ids: np.ndarray, mask: np.ndarray,
                     segment: int) -> jax.Array:
        """Lower states of one batch of segments through the lower program as it is: rows split
        over the devices, nothing padded or joined ([b, seq] -> [b, seq, hidden], sharded).
        For callers that pad and join on the host (a server: one program per batch shape)."""
        ids, mask = (jax.device_put(array, self.sharded) for array in (ids, mask))
        return self._lower_fn(params, ids, mask, segment)

    def project_segments(self, params: Params, lower: jax.Array | np.ndarray) -> QKV:
        """The first upper block's (query, key, value) of every segment, once per segment.

        lower: [n, seq, hidden] lower states -> 3 x [n, heads, seq, head_dim], replicated.
        `iter_pair_chunks` computes these itself when not given; callers that time phases or
        reuse them across calls pass them in.
        """
        return self._in_batches(self._project_fn, params, lower)

    def passage_attention_stats(self, p_qkv: QKV, p_mask: np.ndarray | jax.Array
                                ) -> PassageAttentionStats:
        """The first upper block's softmax statistics of every passage over its own keys.

        p_qkv: `project_segments` of the passages' lower states, 3 x [n, heads, p_len,
        head_dim]; p_mask: [n, p_len] -> PassageAttentionStats ([n, heads, p_len] and [n, heads,
        p_len, head_dim], float32, replicated). Once per passage, whatever number of pairs read
        it; `iter_pair_chunks` computes them itself when not given (see there).
        """
        if not self.plan.hoists_projections:
            raise InputError(f"passage attention statistics need 0 < k < l, got k = "
                             f"{self.model.config.num_lower_layers} of "
                             f"{self.model.config.num_layers} layers")
        return self._in_batches(lambda _, *batch: self._stats_fn(*batch), None, *p_qkv,
                                jnp.asarray(p_mask))

    def encode_questions(self, params: Params, ids: np.ndarray, mask: np.ndarray) -> jax.Array:
        """Question lower states: ids, mask [n, q_len] -> [n, q_len, hidden], replicated."""
        return self.encode_segments(params, ids, mask, QUESTION_SEGMENT)

    def encode_passages(self, params: Params, ids: np.ndarray, mask: np.ndarray) -> jax.Array:
        """Passage lower states, for k > 0. With k = 0 (the full model) a passage has no
        question-independent state to cache (its positions follow the question), so read_grid
        takes the passage ids instead and this raises."""
        if self.plan.reads_passage_ids:
            raise InputError("with k = 0 (the full model) passage states depend on the question "
                             "length through positions; pass passage ids to read_pairs instead")
        return self.encode_segments(params, ids, mask, PASSAGE_SEGMENT)

    def passage_side(self, params: Params, ids: np.ndarray, mask: np.ndarray
                     ) -> jax.Array | np.ndarray:
        """What the pairs read of each passage, for any k: ids, mask [n, p_len] -> the ids
        [n, p_len] themselves at k = 0 (`plan.reads_passage_ids`), else the lower states
        [n, p_len, hidden] (`encode_passages`). The `p_source` of read_pairs / read_grid."""
        if self.plan.reads_passage_ids:
            return ids
        return self.encode_passages(params, ids, mask)

    # --------------------------------------------------------------------- pair blocks

    def _read_chunk(self, params, q_lower, q_mask, p_source, p_mask, q_index, p_index,
                    positions=None, q_qkv=None, p_qkv=None, p_stats=None, q_width=None,
                    p_width=None):
        """Outputs of one chunk of pairs (traced inside jit; see iter_pair_chunks).

        q_width, p_width (static, `plan.trims_padding`): read only the first q_width question and
        p_width passage tokens of every segment (the chunk's real tokens all lie there); the
        passage tokens cut off score PADDED_LOGIT, as padding does.
        """
        model = self.model
        p_len = p_mask.shape[1]
        if q_width is not None:
            q_lower, q_mask = q_lower[:, :q_width], q_mask[:, :q_width]
            if q_qkv is not None:
                q_qkv = tuple(a[:, :, :q_width] for a in q_qkv)
        if p_width is not None:
            p_source, p_mask = p_source[:, :p_width], p_mask[:, :p_width]
            if p_qkv is not None:
                p_qkv = tuple(a[:, :, :p_width] for a in p_qkv)
            if p_stats is not None:  # every field is [n, heads, p_len(, head_dim)]
                p_stats = jax.tree.map(lambda a: a[:, :, :p_width], p_stats)
        pair_q_mask = q_mask[q_index]
        pair_p_mask = p_mask[p_index]
        pair_source = p_source[p_index]
        if positions is not None:
            # Only the kept tokens of each pair's window go through the upper blocks (sentence
            # prescreening): gather them, in order, into a shorter sequence. Padding positions
            # are p_len (out of range): clamped for the gather, masked out.
            kept = positions < p_len
            safe = jnp.minimum(positions, p_len - 1)
            pair_p_mask = jnp.take_along_axis(pair_p_mask, safe, axis=1) * kept
            index = safe if pair_source.ndim == 2 else safe[..., None]
            pair_source = jnp.take_along_axis(pair_source, index, axis=1)
        if self.plan.reads_passage_ids:
            # k = 0: the "lower" passage state is its embedding at standard BERT positions,
            # which start after the question's real tokens (kept tokens: numbered afresh, as if
            # the kept text were the passage).
            offset = jnp.sum(pair_q_mask, axis=1).astype(jnp.int32)
            p_lower = model.encode_lower(params, pair_source, pair_p_mask, PASSAGE_SEGMENT,
                                         offset)
        else:
            p_lower = pair_source
        out = read_upper(
            model, params, q_lower[q_index], pair_q_mask, p_lower, pair_p_mask,
            q_qkv=None if q_qkv is None else tuple(a[q_index] for a in q_qkv),
            p_qkv=None if p_qkv is None else tuple(a[p_index] for a in p_qkv),
            span_rows_only=self.plan.span_rows_only,
            p_stats=None if p_stats is None else jax.tree.map(lambda a: a[p_index], p_stats))
        start, end = out.start_logits, out.end_logits
        if positions is not None:
            # Back to the window's token positions; dropped tokens get -inf (never in a span).
            rows = jnp.arange(positions.shape[0])[:, None]
            blank = jnp.full((positions.shape[0], p_len), -jnp.inf, start.dtype)
            start = blank.at[rows, positions].set(start, mode="drop")
            end = blank.at[rows, positions].set(end, mode="drop")
        if p_width is not None:
            start, end = uncut_columns(start, end, p_len)
        return start, end, out.null_start_logits, out.null_end_logits

    @functools.cached_property
    def _pair_fn(self):
        # Gathering inside the jitted function means only index vectors cross to the devices;
        # each device gathers its own pairs from the replicated lower states (and q/k/v).
        # Optional arguments passed as None are empty pytrees: jit compiles one program per
        # combination in use.
        rep, shard = self.replicated, self.sharded
        return jax.jit(self._read_chunk,
                       in_shardings=(rep, rep, rep, rep, rep, shard, shard, shard, rep, rep,
                                     rep),
                       out_shardings=shard, static_argnums=(11, 12))

    def iter_pair_chunks(self, params: Params, q_lower: jax.Array, q_mask: np.ndarray,
                         p_source: jax.Array | np.ndarray, p_mask: np.ndarray,
                         q_index: np.ndarray, p_index: np.ndarray,
                         positions: np.ndarray | None = None, q_qkv: QKV | None = None,
                         p_qkv: QKV | None = None, p_stats: PassageAttentionStats | None = None
                         ) -> Iterator[tuple[np.ndarray, tuple[jax.Array, ...]]]:
        """Yields (indices into the pair list, device outputs) chunk by chunk.

        q_lower: [nq, q_len, hidden]; p_source: `passage_side` of the passages (lower states
        [np, p_len, hidden], or ids [np, p_len] at k = 0); q_index, p_index: [num_pairs] int.
        positions (optional): [num_pairs, kept_len] int, the window tokens each pair reads, in
        order, p_len for padding (see `kept_positions`); the other tokens are dropped before the
        upper blocks and score -inf. Pairs are then taken in order of kept length, so that each
        chunk is padded only to its own longest (rounded up to KEPT_BUCKET tokens). Without
        positions, `plan.trims_padding` takes pairs in order of passage length the same way and cuts
        each chunk to its longest real question and passage.
        q_qkv, p_qkv (optional, `plan.hoists_projections`): `project_segments` of q_lower /
        p_source. When not given, they are computed here where the plan says it pays
        (`ReusePlan.projects`, `projects_passages`). A choice of speed only: outputs are the same.
        p_stats (optional, `plan.passage_stats`): `passage_attention_stats` of the passages;
        when not given, computed here where the plan says (`computes_passage_stats`).
        Outputs per chunk: start/end [chunk, p_len], null start/end [chunk]; the first
        len(indices) rows are real.
        """
        num_pairs, p_len = len(q_index), np.shape(p_mask)[1]
        config = self.model.config
        kept_tokens = positions is not None
        # Before tracing: past the position table XLA would return NaN logits, not an error.
        check_segment_lengths(config, np.shape(q_mask)[1],
                              p_len if positions is None else np.shape(positions)[1])
        self.plan.check_given(qkv=q_qkv is not None or p_qkv is not None,
                              p_qkv=p_qkv is not None, p_stats=p_stats is not None,
                              kept_tokens=kept_tokens,
                              what=f"k = {config.num_lower_layers} of {config.num_layers} layers")
        q_len = np.shape(q_mask)[1]
        q_mask_host, p_mask_host = np.asarray(q_mask), np.asarray(p_mask)
        q_mask = jax.device_put(q_mask_host, self.replicated)
        p_mask = jax.device_put(p_mask_host, self.replicated)
        p_source = jax.device_put(p_source, self.replicated)
        num_passages = p_source.shape[0]
        if q_qkv is None and self.plan.projects(num_pairs, q_lower.shape[0]):
            q_qkv = self.project_segments(params, q_lower)
        if p_qkv is None and self.plan.projects_passages(num_pairs, num_passages, kept_tokens):
            p_qkv = self.project_segments(params, p_source)
        if p_stats is None and self.plan.computes_passage_stats(num_pairs, num_passages,
                                                                kept_tokens):
            p_stats = self.passage_attention_stats(p_qkv, p_mask)
        trim = not kept_tokens and self.plan.trims_padding
        if trim:
            q_real, p_real = real_lengths(q_mask_host), real_lengths(p_mask_host)
            order = np.argsort(p_real[np.asarray(p_index)], kind="stable")
        elif positions is None:
            order = np.arange(num_pairs)
        else:
            kept = np.sum(np.asarray(positions) < p_len, axis=1)
            order = np.argsort(kept, kind="stable")
        q_index, p_index = np.asarray(q_index, np.int32), np.asarray(p_index, np.int32)
        # What the chunk program's shape depends on besides the chunk's own (`ShapeBook`).
        signature = (np.shape(q_mask_host), np.shape(p_mask_host), q_qkv is not None,
                     p_qkv is not None, p_stats is not None)
        if trim and 0 < num_pairs <= self.chunk_size:
            spans = self._width_spans(signature, order, q_real[q_index], p_real[p_index], q_len,
                                      p_len)
        else:
            spans = chunk_spans(num_pairs, self.chunk_size)
        for span in spans:
            pairs = order[span]
            chunk_positions = q_width = p_width = None
            if trim:
                q_width = chunk_width(q_real[q_index[pairs]], QUESTION_BUCKET, q_len)
                p_width = chunk_width(p_real[p_index[pairs]], KEPT_BUCKET, p_len)
            shape = self.chunk_shape(signature, len(pairs), q_width, p_width,
                                     book=positions is None)
            # Padding pairs repeat the chunk's last pair and are dropped by the caller.
            chunk_q = padded_chunk(q_index[pairs], shape.rows)
            chunk_p = padded_chunk(p_index[pairs], shape.rows)
            if positions is not None:
                width = chunk_width(kept[pairs], KEPT_BUCKET, positions.shape[1])
                chunk_positions = np.asarray(positions, np.int32)[pairs, :width][
                    padded_chunk(np.arange(len(pairs)), shape.rows)]
            outputs = self._pair_fn(params, q_lower, q_mask, p_source, p_mask, chunk_q, chunk_p,
                                    chunk_positions, q_qkv, p_qkv, p_stats, shape.q_width,
                                    shape.p_width)
            yield pairs, outputs

    def _width_spans(self, signature: Hashable, order: np.ndarray, q_real: np.ndarray,
                     p_real: np.ndarray, q_len: int, p_len: int) -> list[slice]:
        """`width_spans` of a short list of trimmed pairs read in `order`: q_real, p_real
        [num_pairs] their real question and passage lengths, each chunk priced at the shape
        it would run at (`chunk_shape`, nothing recorded)."""
        q_real, p_real = q_real[order], p_real[order]

        def cost(start: int, end: int) -> int:
            return self.chunk_shape(
                signature, end - start, chunk_width(q_real[start:end], QUESTION_BUCKET, q_len),
                chunk_width(p_real[start:end], KEPT_BUCKET, p_len), record=False).cost

        widths = [(chunk_width(q_real[[pair]], QUESTION_BUCKET, q_len),
                   chunk_width(p_real[[pair]], KEPT_BUCKET, p_len)) for pair in range(len(order))]
        return width_spans(widths, cost, self.chunk_size)

    def read_pairs(self, params: Params, q_lower: jax.Array, q_mask: np.ndarray,
                   p_source: jax.Array | np.ndarray, p_mask: np.ndarray,
                   q_index: np.ndarray, p_index: np.ndarray,
                   positions: np.ndarray | None = None, q_qkv: QKV | None = None,
                   p_qkv: QKV | None = None, p_stats: PassageAttentionStats | None = None,
                   on_chunk: Callable[[int], None] | None = None) -> SpanScores:
        """The span scores of every listed pair, copied off the devices into numpy arrays.

        Inputs as iter_pair_chunks (q_index, p_index: [num_pairs]); the outputs are
        [num_pairs, p_len] and [num_pairs], row i for pair i. on_chunk (optional): called with
        the number of pairs of each chunk once it is read (a progress bar).
        """
        chunks = self.iter_pair_chunks(params, q_lower, q_mask, p_source, p_mask, q_index,
                                       p_index, positions, q_qkv, p_qkv, p_stats)
        return collect_chunks(chunks, len(q_index), np.shape(p_mask)[1], on_chunk)

    def read_grid(self, params: Params, q_lower: jax.Array, q_mask: np.ndarray,
                  p_source: jax.Array | np.ndarray, p_mask: np.ndarray,
                  q_qkv: QKV | None = None, p_qkv: QKV | None = None,
                  p_stats: PassageAttentionStats | None = None) -> SpanScores:
        """Every (question, passage) pair: scores [nq, np, p_len] / [nq, np]; see
        iter_pair_chunks for the inputs."""
        nq, np_ = q_mask.shape[0], p_mask.shape[0]
        q_index, p_index = every_pair(nq, np_)
        pairs = self.read_pairs(params, q_lower, q_mask, p_source, p_mask, q_index, p_index,
                                q_qkv=q_qkv, p_qkv=p_qkv, p_stats=p_stats)
        return pairs.reshape(nq, np_)
