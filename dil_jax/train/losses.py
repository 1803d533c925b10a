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

Shared normalisation (Clark & Gardner 2018, "Simple and Effective Multi-Paragraph Reading
Comprehension") replaces the per-window CE by one softmax over all G windows of a question
(`shared_norm_span_loss`), so span scores become comparable across passages.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from dil_jax.model.span_reader import PADDED_LOGIT, ReaderOutput


@dataclasses.dataclass(frozen=True)
class LossWeights:
    """gamma, alpha, beta of the total loss and the KD temperature (hashable: a static arg)."""

    ce: float = 1.0
    kd: float = 0.0
    lrs: float = 0.0
    temperature: float = 1.0
    # > 0: the CE term is shared_norm_span_loss over groups of this many consecutive windows
    # (loss.shared_norm, data.windows_per_question); 0: the per-window span CE.
    shared_norm_group: int = 0

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


def multi_positive_nll(logits: jax.Array, candidates: jax.Array) -> jax.Array:
    """-log of the summed probability of every correct class. -> [B]

    logits: [B, C'] over [null ; passage tokens]; candidates: [B, K] token indices in the window
    of every correct span side (distinct), -1 padded. A row with no candidate is a no-answer
    window: its one correct class is the null. With one candidate per row this is the plain
    cross-entropy.
    """
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    present = candidates >= 0
    classes = jnp.where(present, candidates + 1, 0)  # 0 = null (also for padding)
    picked = jnp.take_along_axis(log_probs, classes, axis=-1)  # [B, K]
    # No candidate: the null alone (column 0 holds class 0 then, the other columns padding).
    correct = present.at[:, 0].set(present[:, 0] | ~jnp.any(present, axis=1))
    return -jax.nn.logsumexp(picked, axis=-1, where=correct)


def span_cross_entropy_rows(out: ReaderOutput, start: jax.Array, end: jax.Array,
                            start_candidates: jax.Array | None = None,
                            end_candidates: jax.Array | None = None) -> jax.Array:
    """(CE(start) + CE(end)) / 2 per window, as BERT's SQuAD head. start, end: [B] -> [B].

    start_candidates, end_candidates: [B, K] every correct start / end (-1 padded,
    `dil_jax.train.answer_candidates`); given, each side is `multi_positive_nll` over them
    instead (start / end are then their column 0).
    """
    start_classes = span_logits(out.start_logits, out.null_start_logits)
    end_classes = span_logits(out.end_logits, out.null_end_logits)
    if start_candidates is not None:
        return (multi_positive_nll(start_classes, start_candidates)
                + multi_positive_nll(end_classes, end_candidates)) / 2
    ce_start = _cross_entropy(start_classes, span_labels(start))
    ce_end = _cross_entropy(end_classes, span_labels(end))
    return (ce_start + ce_end) / 2


def span_cross_entropy(out: ReaderOutput, start: jax.Array, end: jax.Array,
                       labelled: jax.Array | None = None,
                       start_candidates: jax.Array | None = None,
                       end_candidates: jax.Array | None = None) -> jax.Array:
    """Mean of span_cross_entropy_rows over the labelled rows. -> scalar.

    labelled: [B] 1 for a window with a span label, 0 for a distillation-only one (its row is
    left out of the mean, so its logits get no CE gradient); None = every row. A batch with no
    labelled row gives 0. start_candidates, end_candidates: as span_cross_entropy_rows.
    """
    rows = span_cross_entropy_rows(out, start, end, start_candidates, end_candidates)
    if labelled is None:
        return jnp.mean(rows)
    weights = labelled.astype(jnp.float32)
    return jnp.sum(weights * rows) / jnp.maximum(jnp.sum(weights), 1.0)


def shared_norm_nll(logits: jax.Array, null: jax.Array, positions: jax.Array,
                    valid: jax.Array) -> jax.Array:
    """-log of the probability of all correct classes of each question group, one side (start or
    end). -> [Q]

    logits: [Q, G, Lp] passage logits of the G windows of each question; null: [Q, G] their null
    logits; positions: [Q, G] the label of each window (token index in it, -1 = not here);
    valid: [Q, G] 1 for a real window, 0 for padding.

    One log-softmax runs over the G * (Lp + 1) classes [null ; passage] of all windows of the
    group. The correct classes are the labelled token of every window that holds the answer (the
    same answer in two overlapping windows counts twice: their probabilities add); when no
    window holds it, the null of every real window. A padding window's classes (its null too) get
    logit PADDED_LOGIT, so exp() gives them exactly 0 probability and 0 gradient (no NaN: every
    group has at least one real window).
    """
    q, g, lp = logits.shape
    classes = jnp.concatenate([null[..., None], logits], axis=-1).astype(jnp.float32)
    valid = valid.astype(bool)
    classes = jnp.where(valid[..., None], classes, PADDED_LOGIT)  # [Q, G, Lp + 1]
    log_probs = jax.nn.log_softmax(classes.reshape(q, g * (lp + 1)), axis=-1)
    picked = jnp.take_along_axis(log_probs.reshape(q, g, lp + 1),
                                 span_labels(positions)[..., None], axis=-1)[..., 0]  # [Q, G]
    answered = (positions >= 0) & valid
    correct = jnp.where(jnp.any(answered, axis=1, keepdims=True), answered, valid)
    return -jax.nn.logsumexp(picked, axis=1, where=correct)


def shared_norm_span_loss(start_logits: jax.Array, end_logits: jax.Array,
                          null_start: jax.Array, null_end: jax.Array, start: jax.Array,
                          end: jax.Array, valid: jax.Array) -> jax.Array:
    """Mean over question groups of (shared_norm_nll(start) + shared_norm_nll(end)) / 2.

    start_logits, end_logits: [Q, G, Lp]; null_start, null_end, start, end, valid: [Q, G].
    -> scalar. With G = 1 and a real window it is `span_cross_entropy`.
    """
    nll_start = shared_norm_nll(start_logits, null_start, start, valid)
    nll_end = shared_norm_nll(end_logits, null_end, end, valid)
    return jnp.mean((nll_start + nll_end) / 2)


def grouped_span_loss(out: ReaderOutput, start: jax.Array, end: jax.Array, valid: jax.Array,
                      group: int) -> jax.Array:
    """shared_norm_span_loss of a flat batch [B] whose consecutive `group` windows are one
    question's (B a multiple of group). -> scalar."""
    def grouped(x: jax.Array) -> jax.Array:  # [B, ...] -> [B / group, group, ...]
        return x.reshape(x.shape[0] // group, group, *x.shape[1:])

    return shared_norm_span_loss(grouped(out.start_logits), grouped(out.end_logits),
                                 grouped(out.null_start_logits), grouped(out.null_end_logits),
                                 grouped(start), grouped(end), grouped(valid))


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
