"""The encoder's long-passage options: chunked FFN, LSH layers, remat policies, reversible blocks.

References: the unchunked / full-attention / non-remat reader (itself checked against the NumPy
reader in tests/model/test_delayed.py) for the options that must not change the function; for the
reversible blocks, plain autodiff through the same functions (`reversible_forward`).
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dil_jax.model.bert as bert
from dil_jax.bench.programs import program_stats
from dil_jax.checkpoints import encoder_config_from_hf, hf_config_from_encoder_config
from dil_jax.errors import CheckpointError
from dil_jax.model.attention import attention_bias
from dil_jax.model.delayed import DelayedInteractionModel, InputError
from dil_jax.model.encoder_config import (
    LONG_PASSAGE_DEFAULTS,
    ConfigError,
    EncoderConfig,
    ReaderOverrides,
)
from dil_jax.model.layers import Block
from dil_jax.model.reversible import reversible_forward, reversible_layers
from dil_jax.model.span_reader import PASSAGE_SEGMENT
from dil_jax.reading.grid import PairGrid
from dil_jax.reading.upper import project_upper, read_upper

from tests.helpers.hf import tiny_hf_config

MAX_Q = 8
# The tiny reader: initializer_range 0.2 so that attention is far from uniform (see
# tests/helpers/hf.py).
TINY = dict(vocab_size=99, hidden_size=32, num_layers=4, num_heads=4, intermediate_size=37,
            embedding_size=32, max_position_embeddings=128, max_question_len=MAX_Q,
            hidden_dropout=0.0, attention_dropout=0.0, initializer_range=0.2)


def _config(**changes) -> EncoderConfig:
    return EncoderConfig(**{**TINY, **changes})


def _pairs(seed: int = 0, batch: int = 2, p_len: int = 40):
    rng = np.random.default_rng(seed)
    q = rng.integers(5, 99, (batch, MAX_Q)).astype(np.int32)
    p = rng.integers(5, 99, (batch, p_len)).astype(np.int32)
    q_mask, p_mask = np.ones_like(q), np.ones_like(p)
    q_mask[0, 5:] = 0
    p_mask[-1, p_len - 9:] = 0
    return q, q_mask, p, p_mask


@pytest.fixture(scope="module")
def params():
    return DelayedInteractionModel(_config()).init(jax.random.key(0))


def _span_logits(model, params, pairs, **kwargs):
    out = model(params, *pairs, **kwargs)
    p_mask = pairs[3]
    return np.where(p_mask > 0, np.asarray(out.start_logits), 0), np.asarray(
        out.null_start_logits)


def _assert_gradients_close(got, want, relative: float) -> None:
    """Every gradient entry within `relative` x the largest entry of all (rounding in a sum is
    relative to the size of its terms, which the largest gradient bounds; a per-leaf scale
    would ask for relative accuracy of leaves whose true gradient is ~0)."""
    scale = max(float(np.abs(np.asarray(w)).max()) for w in jax.tree.leaves(want))
    wanted = dict(jax.tree_util.tree_leaves_with_path(want))
    for path, g in jax.tree_util.tree_leaves_with_path(got):
        np.testing.assert_allclose(np.asarray(g), np.asarray(wanted[path]),
                                   atol=relative * scale, err_msg=str(path))


# ----------------------------------------------------------------------------- configuration

def test_defaults_leave_saved_configs_unchanged_and_values_round_trip():
    assert not set(LONG_PASSAGE_DEFAULTS) & set(_config().to_dict())
    config = _config(ffn_chunk_size=16, lsh_attention_layers=(0, 1), lsh_num_hashes=4,
                     lsh_bucket_size=32, lsh_num_buckets=8, lsh_exclude_self=True, lsh_seed=3,
                     remat_policy="dots_saveable")
    values = json.loads(json.dumps(config.to_dict()))
    assert values["lsh_attention_layers"] == [0, 1]
    assert EncoderConfig.from_dict(values) == config
    hash(EncoderConfig.from_dict(values))  # a jit static argument


@pytest.mark.parametrize("changes,named", [
    (dict(ffn_chunk_size=-1), "ffn_chunk_size"),
    (dict(lsh_attention_layers=(4,)), "lsh_attention_layers"),
    (dict(lsh_attention_layers=(1, 1)), "lsh_attention_layers"),
    (dict(lsh_attention_layers=("0",)), "lsh_attention_layers"),
    (dict(lsh_num_hashes=0), "lsh_num_hashes"),
    (dict(lsh_bucket_size=0), "lsh_bucket_size"),
    (dict(lsh_num_buckets=3), "lsh_num_buckets"),
    (dict(remat_policy="everything"), "remat_policy"),
    (dict(reversible="yes"), "reversible"),
    (dict(reversible=True, remat_policy="full"), "remat_policy"),
])
def test_invalid_values_are_refused_by_name(changes, named):
    with pytest.raises(ConfigError, match=named):
        _config(**changes)


@pytest.mark.parametrize("changes", [dict(ffn_chunk_size=8), dict(lsh_attention_layers=(0,)),
                                     dict(remat_policy="full"), dict(reversible=True)])
def test_xlnet_refuses_the_long_passage_options(changes):
    """XLNet's blocks (model/xlnet.py) implement none of them: refused, not silently ignored."""
    xlnet = dict(architecture="xlnet", type_vocab_size=0)
    _config(**xlnet)
    with pytest.raises(ConfigError, match=f"{next(iter(changes))}.*xlnet"):
        _config(**xlnet, **changes)


def test_reversible_is_refused_for_pretrained_checkpoints():
    hf = tiny_hf_config("bert").to_dict()
    with pytest.raises(CheckpointError, match="reversible"):
        encoder_config_from_hf(hf, overrides=ReaderOverrides(reversible=True))
    with pytest.raises(CheckpointError, match="reversible"):
        hf_config_from_encoder_config(_config(reversible=True))
    # The other options keep a pretrained checkpoint's function (or approximate it): accepted.
    encoder_config_from_hf(hf,
                           overrides=ReaderOverrides(ffn_chunk_size=8, lsh_attention_layers=[0],
                                                     remat_policy="full"))


# ----------------------------------------------------------------------------- chunked FFN

# Chunking changes no arithmetic, only the shapes XLA multiplies: a [rows, 32] x [32, 37]
# product may be blocked differently, which re-associates sums of 32 (or 37) float32 products
# of size ~1: a few ulp, ~1e-6 on LayerNorm outputs of size ~1, and ~1e-5 on logits of size
# ~10 after four blocks. The bounds below leave an order of magnitude; a wrong chunk (a dropped
# or shifted row) changes values by ~1.
BLOCK_ATOL, LOGIT_ATOL = 1e-5, 1e-4


@pytest.mark.parametrize("chunk", [1, 5, 16, 40])
def test_chunked_ffn_equals_unchunked_block(chunk):
    x = np.random.default_rng(1).normal(size=(2, 40, 32)).astype(np.float32)
    mask = np.ones((2, 40), np.int32)
    mask[1, 31:] = 0
    bias = attention_bias(jnp.asarray(mask))
    block_params = Block(_config()).init(jax.random.key(2), x, bias)
    want = Block(_config()).apply(block_params, x, bias)
    got = Block(_config(ffn_chunk_size=chunk)).apply(block_params, x, bias)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=BLOCK_ATOL)


def test_chunked_ffn_reader_and_gradients_equal_unchunked(params):
    pairs = _pairs()
    plain, chunked = DelayedInteractionModel(_config()), DelayedInteractionModel(
        _config(ffn_chunk_size=7))
    for got, want in zip(_span_logits(chunked, params, pairs), _span_logits(plain, params,
                                                                            pairs)):
        np.testing.assert_allclose(got, want, atol=LOGIT_ATOL)

    def loss(model):
        return lambda p: jnp.sum(model(p, *pairs).null_start_logits ** 2)

    _assert_gradients_close(jax.grad(loss(chunked))(params), jax.grad(loss(plain))(params),
                            1e-5)


# ----------------------------------------------------------------------------- LSH layers

@pytest.mark.parametrize("k,layers", [(0, (0, 1, 2, 3)), (2, (0, 1))])
def test_lsh_layers_with_one_chunk_are_the_full_reader(params, k, layers):
    """bucket_size >= every segment: one chunk, i.e. full attention (tests/model/test_lsh.py); in
    the upper blocks at k = 0 (question padding in the middle of the pair) and in the
    passage's lower blocks at k = 2."""
    pairs = _pairs()
    full = DelayedInteractionModel(_config(num_lower_layers=k))
    lsh = DelayedInteractionModel(_config(num_lower_layers=k, lsh_attention_layers=layers,
                                          lsh_bucket_size=64, lsh_num_hashes=2))
    for got, want in zip(_span_logits(lsh, params, pairs), _span_logits(full, params, pairs)):
        np.testing.assert_allclose(got, want, atol=LOGIT_ATOL)


def test_lsh_lower_blocks_are_deterministic_and_reseeded_only_by_an_lsh_rng(params):
    config = _config(num_lower_layers=2, lsh_attention_layers=(0, 1), lsh_bucket_size=4)
    model = DelayedInteractionModel(config)
    _, _, p, p_mask = _pairs(p_len=48)
    first = np.asarray(model.encode_lower(params, p, p_mask, PASSAGE_SEGMENT))
    np.testing.assert_array_equal(
        np.asarray(model.encode_lower(params, p, p_mask, PASSAGE_SEGMENT)), first)
    # Training without an "lsh" rng keeps the fixed seed (dropout is 0 here).
    no_rng = model.encode_lower(params, p, p_mask, PASSAGE_SEGMENT, deterministic=False,
                                rngs={"dropout": jax.random.key(0)})
    np.testing.assert_array_equal(np.asarray(no_rng), first)
    reseeded = model.encode_lower(params, p, p_mask, PASSAGE_SEGMENT, deterministic=False,
                                  rngs={"dropout": jax.random.key(0), "lsh": jax.random.key(5)})
    assert np.abs(np.asarray(reseeded) - first).max() > 1e-3
    other_seed = DelayedInteractionModel(config.replace(lsh_seed=1))
    assert np.abs(np.asarray(other_seed.encode_lower(params, p, p_mask, PASSAGE_SEGMENT))
                  - first).max() > 1e-3
    # Lower-block LSH leaves the pair program's reuses on.
    assert PairGrid(model).plan.hoists_projections and PairGrid(model).plan.span_rows_only


def test_pair_reuses_are_off_with_lsh_upper_blocks(params):
    config = _config(num_lower_layers=2, lsh_attention_layers=(2,), lsh_bucket_size=4)
    model = DelayedInteractionModel(config)
    grid = PairGrid(model)
    assert not grid.plan.hoists_projections and not grid.plan.span_rows_only
    q, q_mask, p, p_mask = _pairs()
    q_lower = model.encode_lower(params, q, q_mask, 0)
    p_lower = model.encode_lower(params, p, p_mask, PASSAGE_SEGMENT)
    with pytest.raises(InputError, match="lsh_attention_layers"):
        read_upper(model, params, q_lower, q_mask, p_lower, p_mask, span_rows_only=True)
    with pytest.raises(InputError, match="lsh_attention_layers"):
        project_upper(model, params, p_lower)


# ----------------------------------------------------------------------------- remat

@pytest.mark.parametrize("policy", ["full", "dots_saveable", "dots_with_no_batch_dims_saveable"])
def test_remat_policies_keep_the_function_and_its_gradients(params, policy):
    """Remat recomputes the same operations: outputs and gradients equal the plain reader's
    (to float rounding: XLA may fuse the recomputation differently)."""
    pairs = _pairs()
    plain, remat = (DelayedInteractionModel(_config(hidden_dropout=0.1, remat_policy=name))
                    for name in ("none", policy))
    rngs = {"dropout": jax.random.key(3)}

    def loss(model):
        return lambda p: jnp.sum(model(p, *pairs, deterministic=False,
                                       rngs=rngs).start_logits[:, :5] ** 2)

    assert float(loss(remat)(params)) == pytest.approx(float(loss(plain)(params)), rel=1e-6)
    _assert_gradients_close(jax.grad(loss(remat))(params), jax.grad(loss(plain))(params),
                            1e-5)


# ----------------------------------------------------------------------------- reversible

def _plain_autodiff(monkeypatch):
    """The reader with its reversible stack differentiated by plain autodiff: the same
    forward functions (`reversible_forward`), jax's own backward pass."""
    monkeypatch.setattr(bert, "reversible_layers",
                        lambda f, g, *args: reversible_forward(f, g, *args))


# Without LSH: slow (not in CI), since the LSH case runs every other layer reversible without
# LSH too.
@pytest.mark.parametrize("lsh", [pytest.param(False, marks=pytest.mark.slow), True])
def test_reversible_gradients_equal_plain_autodiff(monkeypatch, lsh):
    """With dropout and (optionally) an LSH layer, so the recomputation must replay the same
    random masks and buckets. Tolerance: the backward pass recovers each layer's inputs as
    y - F(x), exact in real arithmetic; in float32 each recovery adds rounding of a few ulp of
    the activations (~1e-7 relative), which the remaining layers' Jacobians carry into the
    gradients: ~1e-6 of the largest gradient entry over 4 layers. 1e-4 of it leaves two orders
    of magnitude; a wrong recomputation (another dropout mask, a missing term) is O(1)."""
    config = _config(reversible=True, hidden_dropout=0.1, attention_dropout=0.1,
                     num_lower_layers=1, lsh_attention_layers=(2,) if lsh else (),
                     lsh_bucket_size=4)
    model = DelayedInteractionModel(config)
    params = model.init(jax.random.key(1))
    pairs = _pairs(2)
    rngs = {"dropout": jax.random.key(4), "lsh": jax.random.key(6)}

    def loss(p):
        out = model(p, *pairs, deterministic=False, rngs=rngs)
        return jnp.sum(out.start_logits[:, :7] ** 2) + jnp.sum(out.null_end_logits)

    value, got = jax.value_and_grad(loss)(params)
    with monkeypatch.context() as patch:
        _plain_autodiff(patch)
        want_value, want = jax.value_and_grad(loss)(params)
    assert float(value) == pytest.approx(float(want_value), rel=1e-6)  # the same forward
    _assert_gradients_close(got, want, 1e-4)


def _residual_bytes(fn, *args) -> int:
    """Bytes of the distinct arrays jax.vjp keeps for the backward pass of fn at args."""
    _, vjp_fn = jax.vjp(fn, *args)
    leaves = {id(leaf): leaf for leaf in jax.tree.leaves(vjp_fn)}
    return sum(leaf.size * leaf.dtype.itemsize for leaf in leaves.values())


def test_reversible_saved_residuals_do_not_grow_with_depth():
    """The same block (shared parameters, so they do not grow) applied 2 and 8 times: plain
    autodiff keeps every layer's activations (at least its [batch, heads, seq, seq] attention
    weights per layer), the reversible stack only its outputs."""
    config = _config()
    x = np.random.default_rng(0).normal(size=(1, 64, 32)).astype(np.float32)
    bias = attention_bias(jnp.ones((1, 64), jnp.int32))
    block_params = Block(config).init(jax.random.key(0), x, bias)["params"]
    f = lambda p, x, aux: bert.reversible_residual(config, True, "attention", p, x, aux)  # noqa: E731
    g = lambda p, x, aux: bert.reversible_residual(config, True, "feed_forward", p, x, aux)  # noqa: E731

    def stack(run, depth):
        aux = ((bias, None, None),) * depth
        return lambda p, x1: run(f, g, (p,) * depth, aux, x1, x1)

    sizes = {(name, depth): _residual_bytes(stack(run, depth), block_params, x)
             for name, run in (("reversible", reversible_layers), ("plain", reversible_forward))
             for depth in (2, 8)}
    assert sizes["reversible", 8] == sizes["reversible", 2], sizes
    attention_weights = 1 * 4 * 64 * 64 * 4  # bytes of one layer's [1, 4, 64, 64] weights
    assert sizes["plain", 8] - sizes["plain", 2] >= 6 * attention_weights, sizes


def _train_temp_bytes(depth: int, **changes) -> int:
    """XLA's temp bytes of the compiled gradient program of a reader `depth` blocks deep
    (compiled from shapes, never run)."""
    config = EncoderConfig(**{**TINY, "num_layers": depth, "hidden_size": 64,
                              "embedding_size": 64, "intermediate_size": 256,
                              "max_position_embeddings": 256, "attention_form": "batched",
                              **changes})
    model = DelayedInteractionModel(config)
    abstract = jax.eval_shape(lambda: model.init(jax.random.key(0)))
    q = jax.ShapeDtypeStruct((2, MAX_Q), jnp.int32)
    p = jax.ShapeDtypeStruct((2, 248), jnp.int32)

    def loss(params, q, p):
        out = model(params, q, jnp.ones_like(q), p, jnp.ones_like(p))
        return jnp.sum(out.start_logits) + jnp.sum(out.end_logits)

    return program_stats([jax.jit(jax.grad(loss)).lower(abstract, q, p)]).temp_bytes


def test_reversible_compiled_training_memory_grows_far_less_than_plain(monkeypatch):
    """On the compiled gradient program (XLA's memory analysis): from 2 to 8 blocks the plain
    autodiff program's temporaries grow by the six extra layers' activations; the reversible
    one's by less than half of that. Not zero on XLA:CPU: its buffer assignment of the
    unrolled backward pass grows (measured in docs/architecture.md), while the residuals it
    saves do not (test above)."""
    reversible = {depth: _train_temp_bytes(depth, reversible=True) for depth in (2, 8)}
    with monkeypatch.context() as patch:
        _plain_autodiff(patch)
        plain = {depth: _train_temp_bytes(depth, reversible=True) for depth in (2, 8)}
    assert reversible[8] - reversible[2] < 0.5 * (plain[8] - plain[2]), (reversible, plain)
    assert reversible[8] < plain[8] / 2, (reversible, plain)


def test_reversible_refuses_hidden_states_and_pair_reuses():
    model = DelayedInteractionModel(_config(reversible=True, num_lower_layers=2))
    params = model.init(jax.random.key(0))
    q, q_mask, p, p_mask = _pairs()
    with pytest.raises(InputError, match="reversible"):
        model(params, q, q_mask, p, p_mask, output_hidden_states=True)
    assert not PairGrid(model).plan.hoists_projections
    assert not PairGrid(model).plan.span_rows_only
    assert "reversible_norm" in params  # the pre-LN stack's final LayerNorm
    out = model(params, q, q_mask, p, p_mask)
    assert np.all(np.isfinite(np.asarray(out.start_logits)))


# ----------------------------------------------------------------------------- benchmark

def test_long_passages_benchmark_runs_end_to_end(tmp_path):
    """benchmarks/long_passages.py on the tiny size: one row per variant with both programs'
    memory and times, and the record, table and plot written."""
    import importlib.util

    from tests.helpers import load_script

    bench = load_script("benchmarks/long_passages.py")
    out = tmp_path / "lp"
    rows = bench.main(["--size", "tiny", "--lengths", "64", "--variants", "full", "lsh1",
                       "reversible", "--bucket-size", "16", "--time-max-len", "64",
                       "--repeats", "1", "--out", str(out)])
    assert [row["variant"] for row in rows] == ["full", "lsh1", "reversible"]
    for row in rows:
        for program in ("train", "inference"):
            assert row[program]["temp_bytes"] > 0 and row[program]["median_s"] > 0
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["rows"] == json.loads(json.dumps(rows))
    assert record["command"].startswith("python benchmarks/long_passages.py --size tiny")
    table = out.with_suffix(".md").read_text()
    assert table.count("\n| ") == 2 + len(rows) and "| lsh1 | 64 |" in table
    if importlib.util.find_spec("matplotlib") is not None:
        assert out.with_suffix(".png").stat().st_size > 0


# ----------------------------------------------------------------------------- predict flags

def test_predict_reads_with_lsh_in_the_lower_blocks(tmp_path, capsys):
    """`dil-jax predict --lsh-layers lower`: with one chunk per segment (bucket >= window) the
    answers are the plain reader's; with small buckets it still answers; flags are checked."""
    from tests.helpers import run_cli
    from tests.helpers.squad import one_question_squad

    squad = one_question_squad(tmp_path, "The Eiffel Tower is in Paris. It was built in 1889 for "
                               "the World's Fair and was the tallest structure in the world until "
                               "1930.")

    def predict(name, *flags):
        output = tmp_path / f"{name}.json"
        status, _, err = run_cli(["predict", "--checkpoint", "default", "--data", str(squad),
                                  "--output", str(output), "--k", "3", "--no-progress",
                                  "--allow-untrained-head",
                                  *flags], capsys)
        assert status == 0, err
        return json.loads(output.read_text()), err

    plain, _ = predict("plain")
    one_chunk, _ = predict("one_chunk", "--lsh-layers", "lower", "--lsh-bucket-size", "512")
    assert one_chunk == plain
    small, _ = predict("small", "--lsh-layers", "0,1,2", "--lsh-bucket-size", "4",
                       "--lsh-num-hashes", "2")
    assert set(small) == {"q1"}
    status, _, err = run_cli(["predict", "--data", str(squad), "--output",
                              str(tmp_path / "x.json"), "--lsh-num-hashes", "2"], capsys)
    assert status == 1 and "--lsh-num-hashes needs --lsh-layers" in err



def test_predict_lsh_flags_are_checked():
    import argparse

    from dil_jax.commands.predict import check_lsh_flags, lsh_layers, with_lsh_flags
    from dil_jax.errors import UsageError
    from dil_jax.readers import EncoderReader

    model = EncoderReader(DelayedInteractionModel(_config(num_lower_layers=2)), params={})

    def flags(layers=None, hashes=None, bucket=None):
        return argparse.Namespace(lsh_layers=None if layers is None else lsh_layers(layers),
                                  lsh_num_hashes=hashes, lsh_bucket_size=bucket)

    with pytest.raises(UsageError, match="--lsh-bucket-size needs --lsh-layers"):
        check_lsh_flags(flags(bucket=8))
    assert with_lsh_flags(model, flags(), "reader") is model
    config = with_lsh_flags(model, flags("lower", 4, 8), "reader").config
    assert (config.lsh_attention_layers, config.lsh_num_hashes, config.lsh_bucket_size) == (
        (0, 1), 4, 8)
    assert with_lsh_flags(model, flags("1,3"), "reader").config.lsh_attention_layers == (1, 3)
    with pytest.raises(ConfigError, match="lsh_attention_layers"):
        with_lsh_flags(model, flags("9"), "reader")
    with pytest.raises(UsageError, match="no lower blocks"):
        with_lsh_flags(EncoderReader(DelayedInteractionModel(_config()), params={}),
                       flags("lower"), "reader")
