"""QANet's Reformer options: LSH attention, reversible stacks, chunked feed-forward.

References, as for the BERT family (tests/model/test_long_passages.py): the plain reader (itself
checked against the NumPy reference in tests/model/test_qanet.py) where an option must not change
the function (chunked feed-forward; LSH when one chunk holds the segment); plain autodiff through
the same forward functions (`reversible_scan_forward`) for the reversible stacks' custom backward
pass; the NumPy reference's own reversible stack for the reversible forward.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dil_jax.model.qanet_layers as qanet_layers
from dil_jax.model.encoder_config import ConfigError
from dil_jax.model.qanet import QANetModel
from dil_jax.model.qanet_layers import EncoderStack
from dil_jax.model.reversible import reversible_scan, reversible_scan_forward

import tests.helpers.qanet_numpy_reference as ref
from tests.helpers.qanet import perturb, segment, tiny_config, tiny_variables

# Logits of the tiny reader reach ~100-300 (tests/model/test_qanet.py); two float32 programs of the
# same function differ by a few ulp per op, ~1e-6 relative after ~40 sublayers (measured: the
# NumPy comparison's 2.2e-6). 1e-4 of the largest logit leaves a margin; a changed function
# (another attention pattern, a dropped chunk) moves logits by >= 1e-2 of it.
MODEL_RTOL = 1e-4


def _pairs(config, p_len=20):
    return segment(10, 2, 7, (0, 3), config), segment(11, 2, p_len, (5, 0), config)


def _assert_close_logits(got, want, passage):
    real = np.asarray(passage.mask) > 0
    scale = max(np.abs(np.asarray(want.start_logits)[real]).max(),
                np.abs(np.asarray(want.end_logits)[real]).max())
    for a, b in ((got.start_logits, want.start_logits), (got.end_logits, want.end_logits)):
        np.testing.assert_allclose(np.asarray(a)[real], np.asarray(b)[real],
                                   atol=MODEL_RTOL * scale, rtol=0)


def _assert_gradients_close(got, want, relative: float) -> None:
    """Every gradient entry within `relative` x the largest entry of all (as in
    tests/model/test_long_passages.py: rounding in a sum is relative to its largest terms)."""
    scale = max(float(np.abs(np.asarray(w)).max()) for w in jax.tree.leaves(want))
    wanted = dict(jax.tree_util.tree_leaves_with_path(want))
    for path, g in jax.tree_util.tree_leaves_with_path(got):
        np.testing.assert_allclose(np.asarray(g), np.asarray(wanted[path]),
                                   atol=relative * scale, err_msg=str(path))


def _loss(model, variables, question, passage, **kwargs):
    def loss(params):
        out = model({"params": params, "frozen": variables["frozen"]}, question, passage,
                    **kwargs)
        return jnp.sum(out.start_logits[:, :9] ** 2) * 1e-3 + jnp.sum(out.end_logits[:, 3:11])
    return loss


# ----------------------------------------------------------------------------- chunked FFN

@pytest.mark.parametrize("chunk", [3, 64])
def test_chunked_feed_forward_keeps_the_function_and_its_gradients(chunk):
    """Chunk 3 over 7- and 20-token segments (a ragged last chunk); 64 is longer than every
    segment (the unchunked path)."""
    config = tiny_config()
    variables = tiny_variables(config)
    question, passage = _pairs(config)
    plain, chunked = QANetModel(config), QANetModel(config.replace(ffn_chunk_size=chunk))
    _assert_close_logits(chunked(variables, question, passage),
                         plain(variables, question, passage), passage)
    _assert_gradients_close(jax.grad(_loss(chunked, variables, question, passage))(
        variables["params"]), jax.grad(_loss(plain, variables, question, passage))(
        variables["params"]), 1e-5)


# ----------------------------------------------------------------------------- LSH

def test_lsh_in_one_chunk_is_the_full_reader_and_its_gradients():
    """bucket_size 64 >= every segment: one chunk and one bucket, i.e. full attention
    (tests/model/test_lsh.py), in both encoders; the gradients flow through the sort as through
    full attention."""
    config = tiny_config()
    variables = tiny_variables(config)
    question, passage = _pairs(config)
    full = QANetModel(config)
    lsh = QANetModel(config.replace(lsh_encoders=("embedding", "model"), lsh_bucket_size=64))
    _assert_close_logits(lsh(variables, question, passage), full(variables, question, passage),
                         passage)
    _assert_gradients_close(jax.grad(_loss(lsh, variables, question, passage))(
        variables["params"]), jax.grad(_loss(full, variables, question, passage))(
        variables["params"]), 1e-5)


def test_lsh_with_many_chunks_is_fixed_at_inference_and_reseeded_in_training():
    config = tiny_config(lsh_encoders=("embedding", "model"), lsh_bucket_size=4)
    variables = tiny_variables(config)
    question, passage = _pairs(config, p_len=24)
    model = QANetModel(config)
    first = np.asarray(model.encode_lower(variables, passage))
    np.testing.assert_array_equal(np.asarray(model.encode_lower(variables, passage)), first)
    # LSH restricts attention for real: not the full reader's states.
    full = np.asarray(QANetModel(config.replace(lsh_encoders=())).encode_lower(variables,
                                                                                passage))
    assert np.abs(full - first).max() > 1e-2
    # Training without an "lsh" rng keeps the fixed seed (dropout is 0 here); with one, new
    # buckets; another lsh_seed, other buckets.
    no_rng = model.encode_lower(variables, passage, deterministic=False,
                                rngs={"dropout": jax.random.key(0)})
    np.testing.assert_array_equal(np.asarray(no_rng), first)
    reseeded = model.encode_lower(variables, passage, deterministic=False,
                                  rngs={"dropout": jax.random.key(0), "lsh": jax.random.key(5)})
    assert np.abs(np.asarray(reseeded) - first).max() > 1e-3
    other = QANetModel(config.replace(lsh_seed=1)).encode_lower(variables, passage)
    assert np.abs(np.asarray(other) - first).max() > 1e-3
    # The upper part's LSH (model encoder) is fixed too: the same logits twice.
    out = [model(variables, question, passage) for _ in range(2)]
    np.testing.assert_array_equal(np.asarray(out[0].start_logits),
                                  np.asarray(out[1].start_logits))


# ----------------------------------------------------------------------------- reversible

def test_reversible_reader_matches_the_numpy_reversible_stacks():
    config = tiny_config(reversible=True)
    variables = tiny_variables(config)
    question, passage = _pairs(config)
    out = jax.jit(lambda v, q, p: QANetModel(config)(v, q, p))(variables, question, passage)
    for row in range(2):
        real = np.asarray(passage.mask[row]) > 0
        start, end = ref.qanet_forward(variables, question, passage, row, config)
        scale = max(np.abs(start).max(), np.abs(end).max())
        np.testing.assert_allclose(np.asarray(out.start_logits[row])[real], start,
                                   atol=MODEL_RTOL * scale)
        np.testing.assert_allclose(np.asarray(out.end_logits[row])[real], end,
                                   atol=MODEL_RTOL * scale)


# Without LSH: slow (not in CI), since the LSH case recomputes the same blocks with LSH on top,
# and the scanned stack test below covers reversible blocks without LSH under jit.
@pytest.mark.parametrize("lsh", [pytest.param(False, marks=pytest.mark.slow), True])
def test_reversible_gradients_equal_plain_autodiff(monkeypatch, lsh):
    """With dropout and (optionally) LSH over several chunks in both encoders, so the
    recomputation must replay the same dropout masks and buckets. Tolerance as the BERT
    family's (tests/model/test_long_passages.py): the backward pass recovers each layer's inputs as
    y - F(x), exact in real arithmetic, a few ulp off in float32, carried by the remaining
    layers' Jacobians: ~1e-6 of the largest gradient entry; 1e-4 of it leaves two orders of
    magnitude, and a wrong recomputation (another dropout mask, another bucket) is O(1)."""
    config = tiny_config(reversible=True, dropout=0.1, char_dropout=0.1, word_dropout=0.1,
                         lsh_encoders=("embedding", "model") if lsh else (),
                         lsh_bucket_size=4)
    variables = tiny_variables(config)
    question, passage = _pairs(config, p_len=24)
    model = QANetModel(config)
    loss = _loss(model, variables, question, passage, deterministic=False,
                 rngs={"dropout": jax.random.key(4), "lsh": jax.random.key(6)})
    value, got = jax.value_and_grad(loss)(variables["params"])
    with monkeypatch.context() as patch:
        patch.setattr(qanet_layers, "reversible_scan",
                      lambda f, g, *args: reversible_scan_forward(f, g, *args))
        want_value, want = jax.value_and_grad(loss)(variables["params"])
    # The same forward: the custom_vjp's is traced as one function, plain autodiff's runs op by
    # op, so their float32 rounding differs (measured 1.6e-6 relative with LSH); 1e-5.
    assert float(value) == pytest.approx(float(want_value), rel=1e-5)
    _assert_gradients_close(got, want, 1e-4)


def test_scanned_reversible_stack_gradients_equal_plain_autodiff_under_jit(monkeypatch):
    """The model stack as the reader runs it in training: jitted, 3 blocks (3 iterations of
    `reversible_scan`'s loops), chained passes sharing the weights, dropout on, a padded row;
    gradients of the params AND the input against plain autodiff through the same forward
    (`reversible_scan_forward`, a Python loop over the blocks). Measured: 3.7e-6 of the
    largest entry, the function's own float32 noise floor (plain autodiff at the input times
    1 + 1e-7 moves by 4.0e-6); 1e-4 leaves ~25x, and a wrong recomputation (another block's
    params or dropout mask) is O(1). Without LSH: LSH makes the function discontinuous where a
    vector sits within rounding of a bucket boundary, so two float32 programs may differ there
    by O(1e-3) whatever the backward pass (the LSH case is the reader-level test above)."""
    config = tiny_config(model_blocks=3, reversible=True, dropout=0.1)
    stack = EncoderStack(config, "model")
    x = np.random.default_rng(0).normal(size=(2, 24, config.d_model)).astype(np.float32)
    mask = np.ones((2, 24), np.int32)
    mask[1, 19:] = 0
    params = perturb(jax.jit(stack.init)(jax.random.key(0), x, mask)["params"], 1)

    def loss(p, y):
        for i in range(2):
            y = stack.apply({"params": p}, y, mask, deterministic=False,
                            rngs={"dropout": jax.random.key(i)})
        return jnp.sum(y[:, :7] ** 2) + jnp.sum(y * 0.3)

    value, got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)
    with monkeypatch.context() as patch:
        patch.setattr(qanet_layers, "reversible_scan",
                      lambda f, g, *args: reversible_scan_forward(f, g, *args))
        want_value, want = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)
    assert float(value) == pytest.approx(float(want_value), rel=1e-5)
    _assert_gradients_close(got, want, 1e-4)


def _activation_bytes(fn, args, seq: int) -> int:
    """Bytes of the distinct arrays jax.vjp keeps for fn's backward pass that have a
    sequence axis (`seq` wide, a size no parameter has): the saved activations."""
    _, vjp_fn = jax.vjp(fn, *args)
    leaves = {id(leaf): leaf for leaf in jax.tree.leaves(vjp_fn)}
    return sum(leaf.size * leaf.dtype.itemsize for leaf in leaves.values()
               if seq in np.shape(leaf))


def test_reversible_stack_saves_activations_that_do_not_grow_with_depth():
    """The model encoder stack at 2 and 8 blocks: plain autodiff keeps every sublayer's
    activations (at least each block's [batch, heads, seq, seq] attention weights); the
    reversible stack only its outputs (and the mask)."""
    seq = 61
    x = np.random.default_rng(0).normal(size=(1, seq, 16)).astype(np.float32)
    mask = np.ones((1, seq), np.int32)
    sizes = {}
    for reversible in (False, True):
        for blocks in (2, 8):
            config = tiny_config(model_blocks=blocks, reversible=reversible)
            stack = EncoderStack(config, "model")
            params = perturb(stack.init(jax.random.key(0), x, mask)["params"], 1)
            sizes[reversible, blocks] = _activation_bytes(
                lambda p, y, s=stack: s.apply({"params": p}, y, mask), (params, x), seq)
    assert sizes[True, 8] == sizes[True, 2], sizes
    attention_weights = 1 * 2 * seq * seq * 4  # one block's [1, 2 heads, seq, seq] float32
    assert sizes[False, 8] - sizes[False, 2] >= 6 * attention_weights, sizes
    assert reversible_scan is qanet_layers.reversible_scan  # the stack's own kernel


@functools.cache
def _compiled_temp_bytes(stacks: tuple[tuple[str, int], ...], seq: int = 256) -> tuple[int, int]:
    """XLA's temporaries of the compiled gradient of reversible stacks applied in a chain
    (dropout on), and their param bytes (cached: the two tests share a compile). stacks:
    (encoder, blocks) in order, "model" entries sharing one stack's weights as the model
    encoder's passes do; x: [1, seq, d_model]."""
    blocks = dict(stacks)
    config = tiny_config(embedding_blocks=blocks.get("embedding", 1),
                         model_blocks=blocks.get("model", 1), reversible=True, dropout=0.1)
    x = np.random.default_rng(0).normal(size=(1, seq, config.d_model)).astype(np.float32)
    mask = np.ones((1, seq), np.int32)
    modules = {name: EncoderStack(config, name) for name in blocks}
    # Shapes only: compiling needs no values (and skips running the init).
    params = {name: jax.eval_shape(module.init, jax.random.key(0), x, mask)["params"]
              for name, module in modules.items()}

    def loss(p, key):
        y = x
        for i, (name, _) in enumerate(stacks):
            y = modules[name].apply({"params": p[name]}, y, mask, deterministic=False,
                                    rngs={"dropout": jax.random.fold_in(key, i)})
        return jnp.sum(y ** 2)

    compiled = jax.jit(jax.grad(loss)).lower(params, jax.random.key(1)).compile()
    param_bytes = sum(leaf.size * np.dtype(leaf.dtype).itemsize
                      for leaf in jax.tree.leaves(params))
    return int(compiled.memory_analysis().temp_size_in_bytes), param_bytes


def test_compiled_reversible_memory_does_not_grow_with_depth():
    """The COMPILED step, not the trace: XLA decides what is live (docs/results/qanet_log.md,
    "Memory and time"). Two chained passes of one stack, as the model encoder's (the case where
    XLA:CPU had hoisted the recomputation of the earlier pass and kept every block's attention
    weights live), at 2 and 4 blocks (scan lengths >= 2: XLA inlines a one-iteration loop).

    What must grow with depth is param-sized: the stacked params, the per-iteration gradients
    and their stacked result, copies at the loop boundary; 8x the added blocks' param bytes
    bounds it with margin (measured: 2.7x). Anything activation-sized is more: one block's
    attention weights alone, [1, 2 heads, 256, 256] float32 = 512 KiB, exceed the bound
    (160 KiB), and a plain stack adds ~1.6 MiB a block a pass here."""
    seq = 256
    temp_2, params_2 = _compiled_temp_bytes((("model", 2),) * 2, seq)
    temp_4, params_4 = _compiled_temp_bytes((("model", 4),) * 2, seq)
    attention_weights = 1 * 2 * seq * seq * 4
    bound = 8 * (params_4 - params_2)
    assert bound < attention_weights  # the bound would catch one block's activations
    assert temp_4 - temp_2 <= bound, (temp_2, temp_4, bound)


def test_compiled_reversible_chain_peaks_at_its_largest_part():
    """A chain of reversible stacks (an embedding stack, then two model passes, as in QANet):
    its backward runs the parts one after another, so its peak is the larger part's plus what
    crosses between them (saved outputs, cotangents: a few [1, seq, d_model] arrays; 8 of them,
    128 KiB, bound it), not the parts' sum. Without each layer's recomputation gated on its
    cotangent (`reversible._after`), XLA:CPU ran the embedding stack's recomputation early and
    kept it live through the model stack's backward (measured +1.1 MiB here)."""
    seq = 256
    model, _ = _compiled_temp_bytes((("model", 2),) * 2, seq)
    embedding, _ = _compiled_temp_bytes((("embedding", 1),), seq)
    chain, _ = _compiled_temp_bytes((("embedding", 1), ("model", 2), ("model", 2)), seq)
    crossing = 8 * seq * tiny_config().d_model * 4
    assert chain <= max(model, embedding) + crossing, (model, embedding, chain, crossing)


# ----------------------------------------------------------------------------- scanned blocks

def test_scanned_blocks_are_the_loop_of_blocks_and_its_gradients():
    """`scan_blocks`: the same block function over params stacked per block, so the loop's
    logits and gradients (the reference: the plain loop, itself checked against NumPy in
    tests/model/test_qanet.py), with 2 embedding and 3 model blocks so that both stacks scan;
    with LSH in both (buckets of 4: several chunks), so each block must also keep its own fixed
    hash rotations (a plain stack is the same scan without them)."""
    config = tiny_config(embedding_blocks=2, model_blocks=3, lsh_encoders=("embedding", "model"),
                         lsh_bucket_size=4)
    variables = tiny_variables(config)
    question, passage = _pairs(config, p_len=24)
    loop, scanned = QANetModel(config), QANetModel(config.replace(scan_blocks=True))
    _assert_close_logits(scanned(variables, question, passage),
                         loop(variables, question, passage), passage)
    _assert_gradients_close(jax.grad(_loss(scanned, variables, question, passage))(
        variables["params"]), jax.grad(_loss(loop, variables, question, passage))(
        variables["params"]), 1e-5)
    # It really scans: each stack's block is traced once, not once per block, so the program
    # holds fewer matmuls (the loop's: 2 + 3 x 3 block applications per pair).
    def matmuls(model):
        program = jax.jit(lambda v: model(v, question, passage).start_logits).lower(variables)
        return program.as_text().count("dot_general")

    assert matmuls(scanned) < matmuls(loop)


def test_scanned_blocks_train_with_dropout_and_refuse_stochastic_depth():
    config = tiny_config(model_blocks=3, dropout=0.2, scan_blocks=True)
    variables = tiny_variables(config)
    question, passage = _pairs(config)
    model = QANetModel(config)
    one, two = (model(variables, question, passage, deterministic=False,
                      rngs={"dropout": jax.random.key(seed)}) for seed in (0, 1))
    # Dropout draws with the key: another key, other logits; the same key, the same logits.
    assert np.abs(np.asarray(one.start_logits) - np.asarray(two.start_logits)).max() > 1e-3
    again = model(variables, question, passage, deterministic=False,
                  rngs={"dropout": jax.random.key(0)})
    np.testing.assert_array_equal(np.asarray(again.start_logits), np.asarray(one.start_logits))
    with pytest.raises(ConfigError, match="layer_dropout 0.1 with scan_blocks"):
        tiny_config(scan_blocks=True, layer_dropout=0.1)
