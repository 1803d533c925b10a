"""The jit-compiled train step: accumulation scan, student + frozen teacher, AdamW update.

Gradient accumulation is an explicit `lax.scan` over micro-batches inside one jitted step, not
`optax.MultiSteps`. With the scan, one call = one global batch = one optimizer update, so the
step counter, the LR schedule, checkpoints and the data position all count the same thing, a
checkpoint never holds a half-accumulated gradient, and the 1-device / N-device / N-process runs
are the same function of the same global batch. (MultiSteps would make every call a micro-step and
carry the partial gradient sum in the optimizer state.) Memory is the same: one param-sized
gradient accumulator in the scan carry.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from dil_jax.model.delayed import DelayedInteractionModel, Params
from dil_jax.train import losses, teacher_logits
from dil_jax.train.optim import averaged
from dil_jax.train.sharding import batch_sharding, replicated

if TYPE_CHECKING:
    from dil_jax.readers.protocol import Reader

# q_ids, q_mask [A, M, Lq]; p_ids, p_mask [A, M, Lp] (QANet / BiDAF: also q_chars [A, M, Lq, C],
# p_chars [A, M, Lp, C], dil_jax.train.char_data); start, end, valid, labelled [A, M] (valid:
# 0 for the padding windows that fill a shared-normalisation group; labelled: 0 for
# distillation-only windows, which the span cross-entropy skips); optionally start_candidates,
# end_candidates [A, M, C] (every correct span, -1 padded: dil_jax.train.answer_candidates)
Batch = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
    """Everything a step changes. `step` counts optimizer updates (global batches)."""

    step: jax.Array  # int32 scalar
    params: Params
    opt_state: Any


def init_train_state(params: Params, tx: optax.GradientTransformation) -> TrainState:
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def weights_of(state: TrainState) -> Params:
    """The weights a state is evaluated and exported with: the moving average its optimizer
    keeps (`optim.ema_decay` > 0, `optim.ema_params`), else its params."""
    averaged_params = averaged(state.opt_state)
    return state.params if averaged_params is None else averaged_params


def compute_losses(student: Reader, teacher: DelayedInteractionModel | None,
                   weights: losses.LossWeights, params: Params, teacher_params: Params | None,
                   batch: Batch, dropout_rng: jax.Array | None,
                   deterministic: bool = False) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Total loss and its terms on one micro-batch [M, ...] (no accumulation axis).

    The teacher runs deterministically (no dropout) and its outputs are stop_gradient-ed, so it is
    frozen even though it runs in the same jitted computation; when the batch carries its
    stored scores (config.teacher.logits_file) it does not run at all and KD reads them.
    """
    stored = teacher_logits.BATCH_KEYS[0] in batch  # the teacher's scores, computed once
    use_teacher = teacher is not None and weights.needs_teacher and not stored
    need_states = use_teacher and weights.lrs > 0
    rngs = None if deterministic else {"dropout": dropout_rng}
    # The student's outputs on one micro-batch (a QANet / BiDAF also reads the batch's
    # characters, `Reader.outputs`; it has no hidden states for LRS, which the config rules
    # refuse for it).
    out = student.outputs(params, batch, deterministic=deterministic, rngs=rngs,
                          output_hidden_states=need_states)
    if weights.shared_norm_group:
        # The model reads the flat [M] windows; the loss normalises over each question's group
        # of consecutive windows (the data order keeps groups whole inside a micro-batch).
        ce = losses.grouped_span_loss(out, batch["start"], batch["end"], batch["valid"],
                                      weights.shared_norm_group)
    else:
        ce = losses.span_cross_entropy(out, batch["start"], batch["end"], batch.get("labelled"),
                                       batch.get("start_candidates"), batch.get("end_candidates"))
    kd = lrs = jnp.zeros((), jnp.float32)
    teacher_out = None
    if stored:
        teacher_out = teacher_logits.stored_teacher_output(batch)
    elif use_teacher:
        teacher_out = teacher(teacher_params, batch["q_ids"], batch["q_mask"], batch["p_ids"],
                              batch["p_mask"], deterministic=True,
                              output_hidden_states=need_states)
    if teacher_out is not None:
        teacher_out = jax.lax.stop_gradient(teacher_out)
        if weights.kd > 0:
            kd = losses.distillation_kd(out, teacher_out, weights.temperature)
        if need_states:
            mask = jnp.concatenate([batch["q_mask"], batch["p_mask"]], axis=1)
            lrs = losses.distillation_lrs(out.hidden_states, teacher_out.hidden_states, mask,
                                          student.config.num_lower_layers)
    total = weights.ce * ce + weights.kd * kd + weights.lrs * lrs
    return total, {"loss": total, "ce": ce, "kd": kd, "lrs": lrs}


def accumulate_gradients(student: Reader,
                         teacher: DelayedInteractionModel | None, weights: losses.LossWeights,
                         params: Params, teacher_params: Params | None, batch: Batch,
                         step_rng: jax.Array) -> tuple[Params, dict[str, jax.Array]]:
    """Mean gradient and mean loss terms of a global batch [A, M, ...] over its A micro-batches.

    Returns (grads, metrics): grads has the structure of `params`; metrics holds the scalars
    "loss", "ce", "kd", "lrs". Micro-batch i draws its dropout from fold_in(step_rng, i). This is
    what gradient accumulation must preserve: for equal-size micro-batches and no dropout it
    equals the gradient of the one-batch loss (up to float summation order).
    """
    grad_fn = jax.value_and_grad(
        functools.partial(compute_losses, student, teacher, weights), has_aux=True)
    accum_steps = batch["start"].shape[0]
    if accum_steps == 1:
        # One micro-batch (the default): no loop. XLA:CPU runs a model's forward and backward
        # inside a while loop (lax.scan) far slower than the same ops outside one (QANet's
        # step: 8x; `benchmarks/qanet_train_step.py --scan`), and a loop of one iteration buys
        # nothing.
        micro = jax.tree.map(lambda values: values[0], batch)
        (_, metrics), grads = grad_fn(params, teacher_params, micro,
                                      jax.random.fold_in(step_rng, 0))
        return grads, metrics

    def micro_step(carry, xs):
        grad_sum, metric_sum = carry
        micro, index = xs
        (_, metrics), grads = grad_fn(params, teacher_params, micro,
                                      jax.random.fold_in(step_rng, index))
        grad_sum = jax.tree.map(jnp.add, grad_sum, grads)
        metric_sum = jax.tree.map(jnp.add, metric_sum, metrics)
        return (grad_sum, metric_sum), None

    zero_grads = jax.tree.map(jnp.zeros_like, params)
    zero_metrics = {name: jnp.zeros((), jnp.float32) for name in ("loss", "ce", "kd", "lrs")}
    (grad_sum, metric_sum), _ = jax.lax.scan(
        micro_step, (zero_grads, zero_metrics), (batch, jnp.arange(accum_steps)))
    # Equal-size micro-batches: the mean of micro-batch means is the global-batch mean.
    grads = jax.tree.map(lambda g: g / accum_steps, grad_sum)
    metrics = jax.tree.map(lambda m: m / accum_steps, metric_sum)
    return grads, metrics


def train_step(student: Reader, teacher: DelayedInteractionModel | None,
               weights: losses.LossWeights, tx: optax.GradientTransformation,
               schedule: optax.Schedule, state: TrainState, teacher_params: Params | None,
               batch: Batch, base_rng: jax.Array) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimizer update on a global batch [A, M, ...] (A accumulation steps of M windows).

    Dropout keys: fold_in(fold_in(base_rng, step), micro-batch index), so a resumed run draws
    exactly the masks the uninterrupted one would, whatever the device count.

    metrics: "loss", "ce", "kd", "lrs" (means over the micro-batches), "grad_norm" (before
    clipping), "learning_rate" (this step's), and "nonfinite": True when the loss, the gradient
    norm or any updated param is NaN/Inf.
    """
    step_rng = jax.random.fold_in(base_rng, state.step)
    grads, metrics = accumulate_gradients(student, teacher, weights, state.params,
                                          teacher_params, batch, step_rng)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics["grad_norm"] = optax.tree.norm(grads)
    metrics["learning_rate"] = jnp.asarray(schedule(state.step), jnp.float32)
    # A flag, not a host check: the loop keeps the first flagged step on device and reads it only
    # when it syncs anyway (log steps, saves), so a diverged run never trains on silently.
    metrics["nonfinite"] = ~(jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
                             & all_finite(params))
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def all_finite(tree: Any) -> jax.Array:
    """A bool scalar: every float value of `tree` is finite (no NaN, no Inf).

    Tested as the finiteness of the sum of all values: a NaN or Inf anywhere makes the sum NaN
    or Inf, and finite params could only sum past float32 range (3e38) with magnitudes ~1e30
    (for 1e8 params), which is a divergence too. A float sum is a vectorised reduction; isfinite
    + all per leaf cost ~3x more (measured on CPU, a 3.4M-param model: ~4% of its step vs ~1%).

    The updated params are checked, not only the loss and gradient norm: a finite gradient can
    still step a param past float range, and a damaged optimizer state (e.g. a NaN moment)
    shows only there.
    """
    sums = [jnp.sum(leaf, dtype=jnp.float32) for leaf in jax.tree.leaves(tree)
            if jnp.issubdtype(leaf.dtype, jnp.inexact)]
    return jnp.isfinite(sum(sums, jnp.zeros((), jnp.float32)))


def make_train_step(student: Reader, teacher: DelayedInteractionModel | None,
                    weights: losses.LossWeights, tx: optax.GradientTransformation,
                    schedule: optax.Schedule, mesh: Mesh):
    """jit(train_step) with state/teacher/rng replicated and the batch sharded over "data".

    The state is donated: its buffers are reused for the new state (halves peak param memory).
    """
    rep, shard = replicated(mesh), batch_sharding(mesh)
    fn = functools.partial(train_step, student, teacher, weights, tx, schedule)
    return jax.jit(fn, in_shardings=(rep, rep, shard, rep), out_shardings=(rep, rep),
                   donate_argnums=(0,))


def make_eval_loss(student: Reader, mesh: Mesh):
    """jit: (params, batch [A, M, ...], weights [A, M]) -> (sum of CE over rows, sum of weights).

    Padding rows (weight 0) let the last partial validation batch keep the compiled shape.
    """

    def eval_loss(params, batch, row_weights):
        def per_micro(micro):
            out = student.outputs(params, micro)
            return losses.span_cross_entropy_rows(out, micro["start"], micro["end"])

        per_row = jax.lax.map(per_micro, batch)  # [A, M]
        return jnp.sum(per_row * row_weights), jnp.sum(row_weights)

    rep, shard = replicated(mesh), batch_sharding(mesh)
    return jax.jit(eval_loss, in_shardings=(rep, shard, shard), out_shardings=(rep, rep))
