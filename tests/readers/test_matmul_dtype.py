"""`--matmul-dtype`: bfloat16 matmul operands, float32 accumulation (`EncoderConfig.matmul_dtype`).

The reference of a dense layer is numpy in float64 over the operands rounded to bfloat16 (by
ml_dtypes, independent of XLA); the tolerance is float32 accumulation's: each output sums `n`
products exactly representable in float32 (two 8-bit significands), so its error is at most
gamma_n = n u / (1 - n u) times the sum of the products' magnitudes, u = 2^-24 (Higham, Accuracy
and Stability of Numerical Algorithms, (3.5)), plus the bias add's rounding, u |y|.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from dil_jax.errors import CheckpointError, UsageError
from dil_jax.model.attention import dense, matmul_params
from dil_jax.model.encoder_config import ConfigError, EncoderConfig
from dil_jax.readers.loading import load_reader
from dil_jax.readers.matmul import choose_matmul_dtype, resolve_matmul_dtype

U = 2.0 ** -24


def _rounded(x: np.ndarray) -> np.ndarray:
    return x.astype(ml_dtypes.bfloat16).astype(np.float64)


def _dense_output(matmul_dtype: str, x: np.ndarray, kernel: np.ndarray, bias: np.ndarray,
                  kernel_dtype=np.float32) -> np.ndarray:
    config = EncoderConfig(hidden_size=kernel.shape[0], num_heads=1, intermediate_size=8,
                           embedding_size=kernel.shape[0], matmul_dtype=matmul_dtype)
    layer = dense(config, kernel.shape[1])
    params = {"params": {"kernel": jnp.asarray(kernel.astype(kernel_dtype)),
                         "bias": jnp.asarray(bias)}}
    return np.asarray(layer.apply(params, jnp.asarray(x)), np.float64)


@pytest.mark.parametrize("kernel_dtype", [np.float32, ml_dtypes.bfloat16])
def test_a_dense_layer_reads_bfloat16_operands_and_accumulates_in_float32(kernel_dtype):
    rng = np.random.default_rng(0)
    n = 384
    x = rng.standard_normal((16, n)).astype(np.float32)
    kernel = rng.standard_normal((n, 64)).astype(np.float32)
    bias = rng.standard_normal(64).astype(np.float32)
    reference = _rounded(x) @ _rounded(kernel) + bias
    magnitude = np.abs(_rounded(x)) @ np.abs(_rounded(kernel)) + np.abs(bias)
    bound = (n * U / (1 - n * U)) * magnitude + U * np.abs(reference)
    ours = _dense_output("bfloat16", x, kernel, bias, kernel_dtype)
    assert ours.dtype == np.float64 and np.all(np.abs(ours - reference) <= bound)
    # The float32 layer does not round its operands: it misses the same bound (the test can
    # fail), by about bfloat16's relative error, 2^-9, of the magnitudes.
    exact = _dense_output("float32", x, kernel, bias)
    assert np.any(np.abs(exact - reference) > bound)
    np.testing.assert_allclose(exact, x.astype(np.float64) @ kernel + bias,
                               atol=float(np.max(bound)) * 4)


def test_matmul_params_round_the_dense_kernels_only():
    params = {"embeddings": {"word_embeddings": {"embedding": np.ones((5, 4), np.float32)},
                             "LayerNorm": {"scale": np.ones(4, np.float32)}},
              "layer_0": {"ffn_in": {"kernel": np.full((4, 8), 1 / 3, np.float32),
                                     "bias": np.zeros(8, np.float32)}}}
    config = EncoderConfig(hidden_size=4, num_heads=1, intermediate_size=8, embedding_size=4)
    assert matmul_params(params, config) is params
    rounded = matmul_params(params, config.replace(matmul_dtype="bfloat16"))
    assert rounded["layer_0"]["ffn_in"]["kernel"].dtype == ml_dtypes.bfloat16
    for path in (("embeddings", "word_embeddings", "embedding"), ("embeddings", "LayerNorm",
                                                                   "scale"),
                 ("layer_0", "ffn_in", "bias")):
        leaf = rounded
        for key in path:
            leaf = leaf[key]
        assert leaf.dtype == np.float32, path


def test_a_reader_at_bfloat16_keeps_its_cache_key_and_refuses_to_save(hf_folder_factory,
                                                                      tmp_path):
    folder, _ = hf_folder_factory("bert")
    exact = load_reader(folder, k=1, with_tokenizer=False)
    rounded = exact.with_matmul_dtype("bfloat16")
    assert rounded.config.matmul_dtype == "bfloat16"
    kernels = [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(rounded.params)[0]
               if getattr(path[-1], "key", None) == "kernel"]
    assert kernels and all(k.dtype == jnp.bfloat16 for k in kernels)
    # Caches are keyed by the weights, not by their rounding for reading.
    assert rounded.weights_fingerprint() == exact.weights_fingerprint()
    assert rounded.with_placed_params(rounded.params).weights_fingerprint() == \
        exact.weights_fingerprint()
    with pytest.raises(CheckpointError, match="matmul_dtype 'bfloat16'.*load it at float32"):
        rounded.save(tmp_path / "saved")
    with pytest.raises(CheckpointError, match="rounded for matmul_dtype 'bfloat16'"):
        rounded.with_matmul_dtype("float32")
    assert exact.with_matmul_dtype("float32") is exact
    # The same answers, up to the rounding: the logits of one pair.
    q = jnp.ones((1, 8), jnp.int32)
    p = jnp.ones((1, 16), jnp.int32)
    batch = {"q_ids": q * 5, "q_mask": q, "p_ids": p * 7, "p_mask": p}
    a, b = exact.outputs(exact.params, batch), rounded.outputs(rounded.params, batch)
    start_a, start_b = np.asarray(a.start_logits), np.asarray(b.start_logits)
    assert not np.array_equal(start_a, start_b)
    # To first order each dense matmul on the path (6 a block: q, k, v, output, two
    # feed-forward; and the head) moves its output by at most 2 * 2^-9 of its operands'
    # magnitude (each operand rounded once), and LayerNorm keeps the magnitudes at the logits'
    # scale: a bound of matmuls * 2^-8 of that scale, doubled for second-order terms.
    matmuls = 6 * exact.config.num_layers + 1
    np.testing.assert_allclose(start_b, start_a,
                               atol=2 * matmuls * 2.0 ** -8 * float(np.abs(start_a).max()))


def test_the_choice_and_its_refusals():
    assert choose_matmul_dtype(1.0, 0.8) == "bfloat16"   # x1.25
    assert choose_matmul_dtype(1.0, 0.9) == "float32"    # x1.11: below the x1.2 margin
    assert choose_matmul_dtype(1.0, 2.0) == "float32"    # no native bfloat16 products
    assert resolve_matmul_dtype("bfloat16", False) == "bfloat16"
    assert resolve_matmul_dtype("auto", False) == "float32"  # a family without bfloat16
    with pytest.raises(ValueError, match="'half'"):
        resolve_matmul_dtype("half", True)
    with pytest.raises(ConfigError, match="matmul_dtype 'float16'"):
        EncoderConfig(matmul_dtype="float16")
    assert "matmul_dtype" not in EncoderConfig().to_dict()  # saved configs unchanged


def test_a_char_reader_reads_float32_only():
    from dil_jax.readers.char import CharReader

    class Fake(CharReader):
        def __init__(self):  # no model needed for the refusal
            pass

        label = "QANet"
        kind = "qanet"

    with pytest.raises(UsageError, match="matmul dtype 'bfloat16' is for BERT-family"):
        Fake().with_matmul_dtype("bfloat16")


def test_the_flag_is_checked(capsys):
    from dil_jax.cli import main

    with pytest.raises(SystemExit) as error:
        main(["predict", "--data", "x.json", "--output", "y.json", "--matmul-dtype", "half"])
    assert error.value.code == 2
    assert "--matmul-dtype: invalid choice: 'half'" in capsys.readouterr().err


