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


def _backward(f, g, saved, cotangents):
    params, aux, y1, y2 = saved
    grad_y1, grad_y2 = cotangents
    grad_params = []
    for layer_params, layer_aux in zip(reversed(params), reversed(aux)):
        g_out, g_vjp = jax.vjp(lambda p, y, a=layer_aux: g(p, y, a), layer_params, y1)
        x2 = y2 - g_out
        f_out, f_vjp = jax.vjp(lambda p, x, a=layer_aux: f(p, x, a), layer_params, x2)
        x1 = y1 - f_out
        # y2 = x2 + G(y1): y1's gradient gains G's; y1 = x1 + F(x2): x2's gains F's.
        grad_g_params, grad_y1_from_g = g_vjp(grad_y2)
        grad_y1 = grad_y1 + grad_y1_from_g
        grad_f_params, grad_x2_from_f = f_vjp(grad_y1)
        grad_params.append(jax.tree.map(jnp.add, grad_f_params, grad_g_params))
        y1, y2 = x1, x2
        grad_y2 = grad_y2 + grad_x2_from_f
    grad_params = type(params)(reversed(grad_params))  # params: a list or tuple
    return grad_params, jax.tree.map(_zero_cotangent, aux), grad_y1, grad_y2


reversible_layers.defvjp(_forward, _backward)
