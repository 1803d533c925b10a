"""Span cross-entropy and DeFormer's distillation losses (KD and LRS).

Span distributions are over `[null ; passage tokens]`: index 0 is the `[CLS]` score (the answer
is not in this window), index i+1 is passage token i. Padded passage positions carry logit -1e9
from the model and so get exactly zero probability.

DeFormer (Cao et al., ACL 2020) trains the decomposed student (k > 0) with
  total = gamma * CE + alpha * KD + beta * LRS
  KD  = T^2 * KL(teacher_T || student_T) of the start and end distributions at temperature T
  LRS = mean over upper layers k+1..l of the MSE between student and teacher token states.
The teacher is the full model (k = 0). Both models' `hidden_states` use the same concatenated
layout [question padded to Lq ; passage], so layer i of one lines up with layer i of the other
token by token, although the student's passage positions restart at 0 and the teacher's continue.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from dil_jax.model.modules import ReaderOutput


@dataclasses.dataclass(frozen=True)
class LossWeights:
    """gamma, alpha, beta of the total loss and the KD temperature (hashable: a static arg)."""

    ce: float = 1.0
    kd: float = 0.0
    lrs: float = 0.0
    temperature: float = 1.0

    @property
    def needs_teacher(self) -> bool:
        return self.kd > 0 or self.lrs > 0


def span_logits(start_or_end: jax.Array, null: jax.Array) -> jax.Array:
    """[B, Lp] passage logits and [B] null logits -> [B, Lp + 1] with null first."""
    return jnp.concatenate([null[:, None], start_or_end], axis=1).astype(jnp.float32)


def span_labels(positions: jax.Array) -> jax.Array:
    """Token index in the window (-1 = not here) -> class in [null ; passage] (0 = null)."""
    return jnp.where(positions < 0, 0, positions + 1).astype(jnp.int32)


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """logits [B, C], labels [B] -> [B]."""
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(log_probs, labels[:, None], axis=-1)[:, 0]


def span_cross_entropy_rows(out: ReaderOutput, start: jax.Array, end: jax.Array) -> jax.Array:
    """(CE(start) + CE(end)) / 2 per window, as BERT's SQuAD head. start, end: [B] -> [B]."""
    ce_start = _cross_entropy(span_logits(out.start_logits, out.null_start_logits),
                              span_labels(start))
    ce_end = _cross_entropy(span_logits(out.end_logits, out.null_end_logits), span_labels(end))
    return (ce_start + ce_end) / 2


def span_cross_entropy(out: ReaderOutput, start: jax.Array, end: jax.Array) -> jax.Array:
    """Batch mean of span_cross_entropy_rows. -> scalar."""
    return jnp.mean(span_cross_entropy_rows(out, start, end))


def _kl(teacher_logits: jax.Array, student_logits: jax.Array, temperature: float) -> jax.Array:
    """KL(softmax(t/T) || softmax(s/T)) per row: [B, C] x2 -> [B].

    Written as sum p_t (log p_t - log p_s); padded classes have p_t = 0 exactly and finite logs
    (-1e9 / T), so they contribute 0 and no NaN.
    """
    log_p_t = jax.nn.log_softmax(teacher_logits / temperature, axis=-1)
    log_p_s = jax.nn.log_softmax(student_logits / temperature, axis=-1)
    return jnp.sum(jnp.exp(log_p_t) * (log_p_t - log_p_s), axis=-1)


def distillation_kd(student: ReaderOutput, teacher: ReaderOutput,
                    temperature: float) -> jax.Array:
    """T^2 * mean over batch of (KL_start + KL_end) / 2; the teacher gets no gradient. -> scalar."""
    teacher = jax.lax.stop_gradient(teacher)
    kl_start = _kl(span_logits(teacher.start_logits, teacher.null_start_logits),
                   span_logits(student.start_logits, student.null_start_logits), temperature)
    kl_end = _kl(span_logits(teacher.end_logits, teacher.null_end_logits),
                 span_logits(student.end_logits, student.null_end_logits), temperature)
    # T^2 keeps the gradient scale of the soft targets independent of T (Hinton et al. 2015).
    return temperature ** 2 * jnp.mean((kl_start + kl_end) / 2)


def distillation_lrs(student_states: tuple[jax.Array, ...], teacher_states: tuple[jax.Array, ...],
                     mask: jax.Array, num_lower_layers: int) -> jax.Array:
    """MSE of the student's upper-block states against the teacher's same layers. -> scalar.

    student_states, teacher_states: l+1 arrays [B, Lq + Lp, H] (embeddings, then each block).
    mask: [B, Lq + Lp], 1 on real tokens; padding is excluded from the mean. Layers compared:
    the outputs of blocks k+1..l, i.e. states[k+1:].
    """
    if len(student_states) != len(teacher_states):
        raise ValueError(f"student has {len(student_states) - 1} layers, teacher "
                         f"{len(teacher_states) - 1}: LRS needs the same depth")
    upper = range(num_lower_layers + 1, len(student_states))
    if not upper:
        return jnp.zeros((), jnp.float32)
    weights = mask.astype(jnp.float32)[..., None]  # [B, S, 1]
    hidden = student_states[0].shape[-1]
    denominator = jnp.maximum(jnp.sum(weights) * hidden, 1.0)
    per_layer = []
    for layer in upper:
        s = student_states[layer].astype(jnp.float32)
        t = jax.lax.stop_gradient(teacher_states[layer]).astype(jnp.float32)
        per_layer.append(jnp.sum(weights * (s - t) ** 2) / denominator)
    return jnp.mean(jnp.stack(per_layer))
