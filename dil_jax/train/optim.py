"""AdamW with linear warmup and linear decay, global-norm clipping, decay only on weight matrices.

BERT's fine-tuning recipe (Devlin et al.; Hugging Face `run_squad`): weight decay applies to
kernels and embedding tables, never to biases or LayerNorm scales/offsets, whose decay toward 0
would only fight the normalization.
"""

from __future__ import annotations

from typing import Any

import jax
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
