"""AdamW with linear warmup and linear decay, global-norm clipping, decay only on weight matrices.

BERT's fine-tuning recipe (Devlin et al.; Hugging Face `run_squad`): weight decay applies to
kernels and embedding tables, never to biases or LayerNorm scales/offsets, whose decay toward 0
would only fight the normalization.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

# Leaf names that get weight decay; everything else (bias, LayerNorm scale) does not.
DECAYED_LEAVES = ("kernel", "embedding")


def _path_names(path) -> list[str]:
    return [str(getattr(part, "key", getattr(part, "name", part))) for part in path]


def frozen_mask(params: Any, frozen: tuple[str, ...] = ()) -> Any:
    """True for leaves under one of the `frozen` path prefixes ("embeddings/word_embeddings")."""
    prefixes = [tuple(prefix.strip("/").split("/")) for prefix in frozen if prefix]

    def is_frozen(path, _leaf) -> bool:
        names = tuple(_path_names(path))
        return any(names[:len(prefix)] == prefix for prefix in prefixes)

    return jax.tree_util.tree_map_with_path(is_frozen, params)


def weight_decay_mask(params: Any, frozen: tuple[str, ...] = ()) -> Any:
    """A pytree of bools like `params`: True for kernels and embedding tables not frozen."""
    frozen_leaves = frozen_mask(params, frozen)

    def decayed(path, _leaf, is_frozen) -> bool:
        return _path_names(path)[-1] in DECAYED_LEAVES and not is_frozen

    return jax.tree_util.tree_map_with_path(decayed, params, frozen_leaves)


def warmup_linear_decay(peak: float, total_steps: int, warmup_steps: int) -> optax.Schedule:
    """0 -> peak over warmup_steps, then peak -> 0 at total_steps."""
    warmup_steps = max(0, min(warmup_steps, total_steps))
    decay = optax.linear_schedule(peak, 0.0, max(total_steps - warmup_steps, 1))
    if warmup_steps == 0:
        return decay
    warmup = optax.linear_schedule(0.0, peak, warmup_steps)
    return optax.join_schedules([warmup, decay], [warmup_steps])


def make_optimizer(learning_rate: float, total_steps: int, warmup_steps: int,
                   weight_decay: float = 0.01, max_grad_norm: float | None = 1.0,
                   b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
                   frozen: tuple[str, ...] = ()
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(optimizer, schedule). One optimizer step = one global batch (after accumulation).

    frozen: param path prefixes that never change: their gradients are zeroed before clipping
    and they get no weight decay, so AdamW's update for them is exactly 0.
    """
    schedule = warmup_linear_decay(learning_rate, total_steps, warmup_steps)
    parts = []
    if frozen:
        parts.append(optax.masked(optax.set_to_zero(), lambda p: frozen_mask(p, frozen)))
    if max_grad_norm:
        parts.append(optax.clip_by_global_norm(max_grad_norm))
    parts.append(optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                             mask=lambda p: weight_decay_mask(p, frozen)))
    return optax.chain(*parts), schedule


class EmaParams(NamedTuple):
    """The optimizer state of `ema_params`: updates seen (count) and the average (ema, a
    pytree like the params)."""

    count: jax.Array
    ema: Any


def ema_decay_at(decay: float, count: jax.Array) -> jax.Array:
    """The decay of update number `count` (0-based): min(decay, (1 + count) / (10 + count)), the
    rule of TensorFlow's ExponentialMovingAverage with `num_updates` (QANet's 0.9999): early
    averages are not dominated by the initial weights."""
    count = jnp.asarray(count, jnp.float32)
    return jnp.minimum(decay, (1.0 + count) / (10.0 + count))


def ema_params(decay: float) -> optax.GradientTransformation:
    """Keeps an exponential moving average of the params AFTER each update (chain it last:
    the updates it sees are the final ones); passes the updates through unchanged. The average
    lives in the optimizer state (`EmaParams`), so checkpoints and resumes carry it; `averaged`
    reads it. Yu et al. (2018): "exponential moving average is applied on all trainable
    variables with a decay rate 0.9999"."""

    def init(params):
        return EmaParams(jnp.zeros((), jnp.int32), jax.tree.map(jnp.asarray, params))

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("ema_params needs the params (optax passes them to update)")
        new = optax.apply_updates(params, updates)
        rate = ema_decay_at(decay, state.count)
        ema = jax.tree.map(lambda avg, value: rate * avg + (1.0 - rate) * value, state.ema, new)
        return updates, EmaParams(state.count + 1, ema)

    return optax.GradientTransformation(init, update)


def averaged(opt_state: Any) -> Any | None:
    """The params' moving average an optimizer state holds (`ema_params`), or None."""
    found = [node for node in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(
        x, EmaParams)) if isinstance(node, EmaParams)]
    return found[0].ema if found else None
