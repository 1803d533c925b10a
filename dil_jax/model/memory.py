"""Memory helpers of the encoder for long sequences: chunked row-wise maps and remat policies.

Pure functions; `layers.Block` and `bert.SpanReaderModule` call them when `EncoderConfig` asks
(`ffn_chunk_size`, `remat_policy`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from dil_jax.model.encoder_config import REMAT_POLICIES, ConfigError
from dil_jax.rounding import round_up


def map_row_chunks(fn: Callable[[jax.Array], jax.Array], x: jax.Array,
                   chunk_size: int) -> jax.Array:
    """fn over the sequence in chunks of `chunk_size` rows, one chunk at a time.

    x: [batch, seq, width_in]; fn: a ROW-WISE map [batch, rows, width_in] -> [batch, rows,
    width_out] -> [batch, seq, width_out]. Row-wise is what makes it exact: each output row is
    fn of its own input row, whatever chunk it is in. The chunks run in a `lax.map` (a loop), so
    at most one chunk's intermediates (e.g. the FFN's [batch, chunk, intermediate]) are live;
    fn is `jax.checkpoint`ed, so training saves only each chunk's input and recomputes the
    intermediates in the backward pass (Reformer's chunked feed-forward). The last chunk is
    zero-padded; padded rows are dropped.
    """
    batch, seq, width = x.shape
    padded = round_up(seq, chunk_size)
    if padded != seq:
        x = jnp.pad(x, [(0, 0), (0, padded - seq), (0, 0)])
    chunks = x.reshape(batch, padded // chunk_size, chunk_size, width).swapaxes(0, 1)
    out = jax.lax.map(jax.checkpoint(fn), chunks)  # [chunks, batch, chunk, width_out]
    return out.swapaxes(0, 1).reshape(batch, padded, -1)[:, :seq]


def checkpoint_policy(name: str) -> Callable[..., Any] | None:
    """The `jax.checkpoint` policy of a `remat_policy` name ("full": None, jax.checkpoint's
    default, which saves nothing but the block's inputs). "none" is no remat: not a policy."""
    policies = {"full": None, "dots_saveable": jax.checkpoint_policies.dots_saveable,
                "dots_with_no_batch_dims_saveable":
                    jax.checkpoint_policies.dots_with_no_batch_dims_saveable}
    if name not in policies:
        raise ConfigError(f"remat_policy {name!r} is not a jax.checkpoint policy; policies: "
                          f"{[n for n in REMAT_POLICIES if n != 'none']}")
    return policies[name]
