"""Reversible (RevNet) residual layers with a `jax.custom_vjp` that recomputes activations.

A reversible layer maps two streams (x1, x2) to

    y1 = x1 + F(x2)        y2 = x2 + G(y1)

and is inverted exactly in real arithmetic by x2 = y2 - G(y1), x1 = y1 - F(x2). The backward
pass of `reversible_layers` keeps only the LAST layer's outputs: it walks the layers backwards,
recomputing each layer's inputs from its outputs and differentiating F and G there, so the
activations saved for the gradient do not grow with depth (Gomez et al. 2017; Reformer). In
floating point the recovered inputs carry the rounding of y - F(x); the gradients therefore equal
plain autodiff's up to float rounding (tests/model/test_long_passages.py).

F and G are pure functions `(params, x, aux) -> [batch, seq, width]`: params are differentiated,
aux (masks, rng keys) is not.

`reversible_scan` is the same kernel for a stack of identical GROUPS of layers (QANet's blocks:
(conv, conv), ..., (attention, feed-forward)), with the params of each of a group's layers
stacked over the groups; forward and backward are `lax.scan`s over the groups. That is what
keeps the backward pass's memory flat in a COMPILED program, which `reversible_layers` (an
unrolled Python loop) does not guarantee: the recomputation of a layer's inputs, x2 = y2 -
G(y1), x1 = y1 - F(x2), depends on the saved outputs alone, not on any cotangent, so XLA's
scheduler may run the recomputations (and the vjp residuals they produce: attention
probabilities, ...) of many layers long before their gradients, and keep them all live; with
several stacks chained (QANet's model encoder, applied three times) XLA:CPU did exactly that
(docs/results/qanet_log.md, "Memory and time"). `jax.lax.optimization_barrier` cannot forbid it
there: the CPU compiler removes barriers (`OptimizationBarrierExpander`) before it schedules. Two
orderings that XLA keeps replace it: the iterations of a loop run in order, so a scan's backward
holds one group's recomputation at a time; and each layer's recomputation is made data-dependent on
its output cotangent (`_after`), so it cannot start before the layers after it (and the stacks after
this one) have their gradients: what also orders a one-group stack, whose one-iteration loop XLA
inlines.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Residual = Callable[[Any, jax.Array, Any], jax.Array]  # (params, x, aux) -> same shape as x


def reversible_forward(f: Residual, g: Residual, params: Sequence[Any], aux: Sequence[Any],
                       x1: jax.Array, x2: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The layers applied in order, differentiated by plain autodiff (the reference).

    params, aux: one entry per layer; x1, x2: [batch, seq, width] -> (y1, y2), the same shape.
    """
    for layer_params, layer_aux in zip(params, aux):
        x1 = x1 + f(layer_params, x2, layer_aux)
        x2 = x2 + g(layer_params, x1, layer_aux)
    return x1, x2


def _zero_cotangent(x: Any) -> Any:
    """The cotangent of an undifferentiated input: zeros, float0 for integer and key arrays."""
    if jnp.issubdtype(jnp.result_type(x), jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(np.shape(x), dtype=jax.dtypes.float0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def reversible_layers(f: Residual, g: Residual, params: Sequence[Any], aux: Sequence[Any],
                      x1: jax.Array, x2: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`reversible_forward`, with a backward pass that recomputes each layer's inputs.

    params, aux: one entry per layer (the same params object may repeat: ALBERT's shared
    blocks; its gradients add up); x1, x2: [batch, seq, width] -> (y1, y2). aux gets zero
    cotangents.
    """
    return reversible_forward(f, g, params, aux, x1, x2)


def _forward(f, g, params, aux, x1, x2):
    y1, y2 = reversible_forward(f, g, params, aux, x1, x2)
    # Saved for the backward pass: the outputs only (params and aux exist anyway).
    return (y1, y2), (params, aux, y1, y2)


def _layer_backward(f, g, layer_params, layer_aux, y1, y2, grad_y1, grad_y2):
    """One reversible layer backwards: its inputs (x1, x2) rebuilt from its outputs, their
    gradients and the layer's parameter gradients. Returns (x1, x2, grad_x1, grad_x2,
    grad_params)."""
    g_out, g_vjp = jax.vjp(lambda p, y: g(p, y, layer_aux), layer_params, y1)
    x2 = y2 - g_out
    f_out, f_vjp = jax.vjp(lambda p, x: f(p, x, layer_aux), layer_params, x2)
    x1 = y1 - f_out
    # y2 = x2 + G(y1): y1's gradient gains G's; y1 = x1 + F(x2): x2's gains F's.
    grad_g_params, grad_y1_from_g = g_vjp(grad_y2)
    grad_x1 = grad_y1 + grad_y1_from_g
    grad_f_params, grad_x2_from_f = f_vjp(grad_x1)
    grad_params = jax.tree.map(jnp.add, grad_f_params, grad_g_params)
    return x1, x2, grad_x1, grad_y2 + grad_x2_from_f, grad_params


def _backward(f, g, saved, cotangents):
    params, aux, y1, y2 = saved
    grad_y1, grad_y2 = cotangents
    grad_params = []
    for layer_params, layer_aux in zip(reversed(params), reversed(aux)):
        y1, y2, grad_y1, grad_y2, layer_grads = _layer_backward(
            f, g, layer_params, layer_aux, y1, y2, grad_y1, grad_y2)
        grad_params.append(layer_grads)
    grad_params = type(params)(reversed(grad_params))  # params: a list or tuple
    return grad_params, jax.tree.map(_zero_cotangent, aux), grad_y1, grad_y2


reversible_layers.defvjp(_forward, _backward)


def _after(x: jax.Array, dependency: jax.Array) -> jax.Array:
    """x, as a value XLA can compute only once `dependency` is: x + 0 * dependency[0, ..., 0].

    A data dependence is the one ordering every XLA backend keeps (`optimization_barrier` is
    removed by XLA:CPU before scheduling). Exact for a finite dependency (x + 0.0 is x; a -0.0
    may become +0.0); a non-finite one makes x NaN, where the gradients it gates are non-finite
    already.
    """
    first = dependency[(0,) * dependency.ndim]
    return x + (0.0 * first).astype(x.dtype)


def _group_forward(f: Residual, g: Residual, group_params: Sequence[Any],
                   group_aux: Sequence[Any], shared: Any, x1: jax.Array, x2: jax.Array
                   ) -> tuple[jax.Array, jax.Array]:
    """One group's layers in order; layer j's F and G get aux (shared, group_aux[j])."""
    for layer_params, layer_aux in zip(group_params, group_aux, strict=True):
        x1 = x1 + f(layer_params, x2, (shared, layer_aux))
        x2 = x2 + g(layer_params, x1, (shared, layer_aux))
    return x1, x2


def _group_slice(tree: Any, index: int) -> Any:
    return jax.tree.map(lambda leaf: leaf[index], tree)


def num_groups(params: Sequence[Any]) -> int:
    """The groups of a `reversible_scan` stack: the leading axis of its params' leaves."""
    return jax.tree.leaves(params)[0].shape[0]


def reversible_scan_forward(f: Residual, g: Residual, params: Sequence[Any],
                            aux: Sequence[Any], shared: Any, x1: jax.Array, x2: jax.Array
                            ) -> tuple[jax.Array, jax.Array]:
    """`reversible_scan`'s function as a plain Python loop over the groups, differentiated by
    plain autodiff (the reference of its backward pass); the same arguments."""
    for group in range(num_groups(params)):
        x1, x2 = _group_forward(f, g, _group_slice(params, group), _group_slice(aux, group),
                                shared, x1, x2)
    return x1, x2


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def reversible_scan(f: Residual, g: Residual, params: Sequence[Any], aux: Sequence[Any],
                    shared: Any, x1: jax.Array, x2: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Groups of reversible layers in a `lax.scan`, with a backward pass that recomputes each
    layer's inputs from its outputs, one group per loop iteration (module docstring).

    params: one entry per layer of a group (L entries), each a pytree whose leaves are stacked
    over the groups, [groups, ...] (differentiated); aux: L entries likewise stacked, [groups,
    ...] (dropout / LSH keys; None entries allowed; zero cotangents); shared: a pytree every
    layer gets unstacked (the mask; zero cotangents); x1, x2: [batch, seq, width] -> (y1, y2),
    the same shapes. Layer j of group i runs f(params[j][i], x, (shared, aux[j][i])) and g
    likewise: the groups in order, the layers of a group in order.
    """
    (y1, y2), _ = _scan_forward(f, g, params, aux, shared, x1, x2)
    return y1, y2


def _scan_forward(f, g, params, aux, shared, x1, x2):
    def body(carry, group):
        group_params, group_aux = group
        return _group_forward(f, g, group_params, group_aux, shared, *carry), None

    return jax.lax.scan(body, (x1, x2), (params, aux))


def _scan_vjp_forward(f, g, params, aux, shared, x1, x2):
    (y1, y2), _ = _scan_forward(f, g, params, aux, shared, x1, x2)
    # Saved for the backward pass: the outputs only (params, aux and shared exist anyway).
    return (y1, y2), (params, aux, shared, y1, y2)


def _scan_vjp_backward(f, g, saved, cotangents):
    params, aux, shared, y1, y2 = saved

    def body(carry, group):
        y1, y2, grad_y1, grad_y2 = carry
        group_params, group_aux = group
        grads = []
        for layer_params, layer_aux in zip(reversed(group_params), reversed(group_aux),
                                           strict=True):
            y1 = _after(y1, grad_y2)
            y1, y2, grad_y1, grad_y2, layer_grads = _layer_backward(
                f, g, layer_params, (shared, layer_aux), y1, y2, grad_y1, grad_y2)
            grads.append(layer_grads)
        return (y1, y2, grad_y1, grad_y2), type(group_params)(reversed(grads))

    (_, _, grad_x1, grad_x2), grad_params = jax.lax.scan(
        body, (y1, y2, *cotangents), (params, aux), reverse=True)
    return (grad_params, jax.tree.map(_zero_cotangent, aux),
            jax.tree.map(_zero_cotangent, shared), grad_x1, grad_x2)


reversible_scan.defvjp(_scan_vjp_forward, _scan_vjp_backward)
