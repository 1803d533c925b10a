"""QANet (dil_jax.model.qanet*) against the independent float64 NumPy reference
(tests/helpers/qanet_numpy_reference.py), and its delayed-interaction split.

Tolerances, from float32 rounding: each layer's outputs are sums of at most a few hundred
products of values of size ~1 (inputs ~1, perturbed weights ~0.3-1), each rounded to ~6e-8
relative, so one layer is within ~1e-6 of float64; 1e-5 leaves an order of magnitude. The whole
reader stacks ~40 residual sublayers (1 embedding block of 6, 2 model blocks of 4 applied 3
times) whose residual stream grows with depth; with the perturbed weights its logits reach
~100-300, and they are within 2.2e-6 of float64 relative to the largest logit (measured on these
inputs); 1e-4 relative leaves a margin of ~50. A wrong mask, a
mis-read parameter or a shifted convolution changes values by >= 1e-2 (checked where the test
could otherwise pass by accident).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dil_jax.model.delayed import InputError
from dil_jax.model.encoder_config import ConfigError
from dil_jax.model.qanet import QANetModel
from dil_jax.model.qanet_config import QANetConfig
from dil_jax.model.qanet_inputs import (
    CHAR_EMPTY,
    CHAR_SPECIAL,
    QANetSegment,
    char_id,
    minilm_word_table,
    qanet_segment,
    token_characters,
)
from dil_jax.model.qanet_layers import (
    CharacterCNN,
    ContextQueryAttention,
    DepthwiseSeparableConv,
    Highway,
    MultiHeadAttention,
)
from dil_jax.model.span_reader import PADDED_LOGIT

import tests.helpers.qanet_numpy_reference as ref
from tests.helpers.qanet import perturb, segment, tiny_config, tiny_variables

LAYER_ATOL = 1e-5  # one layer in float32 vs float64 (module docstring)
MODEL_RTOL = 1e-4  # the whole reader, relative to its largest logit (module docstring)


def _init(module, *args, seed=0):
    params = module.init(jax.random.key(seed), *args)["params"]
    return perturb(params, seed + 50)


def _prefix_mask(batch, length, pads):
    mask = np.ones((batch, length), np.int32)
    for row, pad in enumerate(pads):
        if pad:
            mask[row, length - pad:] = 0
    return mask


# ----------------------------------------------------------------------------- layers

@pytest.mark.parametrize("kernel", [3, 7])
def test_depthwise_separable_conv_matches_reference_and_ignores_padding(kernel):
    rng = np.random.default_rng(kernel)
    x = rng.normal(size=(2, 11, 5)).astype(np.float32)
    mask = _prefix_mask(2, 11, (0, 4))
    x[1, 7:] = 1e3  # padding holding garbage must not reach a real token
    module = DepthwiseSeparableConv(features=7, kernel=kernel)
    params = _init(module, x, mask)
    got = np.asarray(module.apply({"params": params}, x, mask))
    p64 = ref.as64(params)
    for row in range(2):
        real = mask[row] > 0
        want = ref.depthwise_separable(x[row][real].astype(np.float64), p64, kernel)
        np.testing.assert_allclose(got[row][real], want, atol=LAYER_ATOL)
    # The reference is not blind to the taps: a kernel read flipped (a convolution instead of
    # a correlation) gives other values.
    flipped = {**p64, "depthwise": {"kernel": p64["depthwise"]["kernel"][::-1]}}
    assert np.abs(ref.depthwise_separable(x[0].astype(np.float64), flipped, kernel)
                  - got[0]).max() > 1e-2


def test_highway_matches_reference():
    x = np.random.default_rng(1).normal(size=(3, 4, 9)).astype(np.float32)
    module = Highway(layers=2, dropout=0.0)
    params = _init(module, x)
    got = np.asarray(module.apply({"params": params}, x))
    np.testing.assert_allclose(got, ref.highway(x.astype(np.float64), ref.as64(params)),
                               atol=LAYER_ATOL)


def test_char_cnn_max_pools_over_real_characters_only():
    config = tiny_config()
    rng = np.random.default_rng(2)
    counts = np.array([[6, 1, 3, 0, 2], [4, 5, 0, 0, 1]])  # 0 = a padding token
    chars = np.zeros((2, 5, config.max_chars), np.int32)
    for b in range(2):
        for t in range(5):
            chars[b, t, :counts[b, t]] = rng.integers(4, 512, counts[b, t])
    module = CharacterCNN(config)
    params = _init(module, chars)
    got = np.asarray(module.apply({"params": params}, chars))
    p64 = ref.as64(params)
    want = np.stack([np.stack([ref.char_cnn(ref.real_characters(c), p64) for c in row])
                     for row in chars])
    np.testing.assert_allclose(got, want, atol=LAYER_ATOL)
    assert np.all(got[counts == 0] == 0)
    # More padding slots change nothing (max_chars is storage, not part of the function).
    wider = np.concatenate([chars, np.zeros((2, 5, 4), np.int32)], axis=-1)
    np.testing.assert_allclose(
        np.asarray(CharacterCNN(config.replace(max_chars=10)).apply({"params": params}, wider)),
        got, atol=LAYER_ATOL)
    # Pooling over the padded slots too would give other values: the test can tell.
    pooled_with_pads = ref.char_cnn(list(chars[0, 1]), {
        **p64, "embed": {"embedding": np.where(np.arange(512)[:, None] == 0, 0.0,
                                               p64["embed"]["embedding"])}})
    assert np.abs(pooled_with_pads - got[0, 1]).max() > 1e-2


def test_self_attention_gives_padded_keys_no_weight():
    config = tiny_config()
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 9, config.d_model)).astype(np.float32)
    mask = _prefix_mask(2, 9, (0, 3))
    x[1, 6:] = 50.0  # would dominate the softmax if padded keys were seen
    module = MultiHeadAttention(config)
    params = _init(module, x, mask)
    got = np.asarray(module.apply({"params": params}, x, mask))
    for row in range(2):
        real = mask[row] > 0
        want = ref.attention(x[row][real].astype(np.float64), ref.as64(params),
                             config.num_heads)
        np.testing.assert_allclose(got[row][real], want, atol=LAYER_ATOL)


def test_context_query_attention_is_trilinear_with_masked_softmaxes():
    config = tiny_config()
    rng = np.random.default_rng(4)
    d = config.d_model
    c = rng.normal(size=(2, 9, d)).astype(np.float32)
    q = rng.normal(size=(2, 5, d)).astype(np.float32)
    c_mask, q_mask = _prefix_mask(2, 9, (3, 0)), _prefix_mask(2, 5, (0, 2))
    c[0, 6:] = 30.0  # padding that would win both softmaxes if it were not masked
    q[1, 3:] = 30.0
    module = ContextQueryAttention(config)
    params = _init(module, c, c_mask, q, q_mask)
    got = np.asarray(module.apply({"params": params}, c, c_mask, q, q_mask))
    assert got.shape == (2, 9, 4 * d)
    for row in range(2):
        real_c, real_q = c_mask[row] > 0, q_mask[row] > 0
        want = ref.context_query(c[row][real_c].astype(np.float64),
                                 q[row][real_q].astype(np.float64), ref.as64(params))
        np.testing.assert_allclose(got[row][real_c], want, atol=LAYER_ATOL)


# ----------------------------------------------------------------------------- the reader

def _pairs(config, q_len=7, p_len=20):
    return (segment(10, 2, q_len, (0, 3), config), segment(11, 2, p_len, (5, 0), config))


def _assert_logits_match_reference(out, variables, question, passage, config):
    for row in range(2):
        real = np.asarray(passage.mask[row]) > 0
        want_start, want_end = ref.qanet_forward(variables, question, passage, row, config)
        scale = max(np.abs(want_start).max(), np.abs(want_end).max())
        for got, want in ((out.start_logits, want_start), (out.end_logits, want_end)):
            got = np.asarray(got[row])
            np.testing.assert_allclose(got[real], want, atol=MODEL_RTOL * scale, rtol=0)
            assert np.all(got[~real] == PADDED_LOGIT)


def test_jitted_reader_matches_numpy_reference():
    config = tiny_config()
    variables = tiny_variables(config)
    question, passage = _pairs(config)
    model = QANetModel(config)
    out = jax.jit(lambda v, q, p: model(v, q, p))(variables, question, passage)
    _assert_logits_match_reference(out, variables, question, passage, config)
    np.testing.assert_array_equal(np.asarray(out.null_start_logits), PADDED_LOGIT)


def test_passage_state_is_bit_identical_whatever_question_it_meets():
    """Inside the whole reader (one apply, both segments), the passage's embedding-encoder
    output is captured for three question batches of other tokens and another width: it must
    not change by one bit, and the pair's logits must equal the split path's."""
    config = tiny_config()
    variables = tiny_variables(config)
    model = QANetModel(config)
    _, passage = _pairs(config)
    states, outputs = [], []
    for seed, q_len in ((20, 7), (21, 7), (22, 12)):
        question = segment(seed, 2, q_len, (1, 4), config)
        out, captured = model.module.apply(
            variables, question.ids, question.chars, question.mask, passage.ids, passage.chars,
            passage.mask, capture_intermediates=True, mutable=["intermediates"])
        calls = captured["intermediates"]["embedding_encoder"]["__call__"]
        assert len(calls) == 2  # the question's, then the passage's
        states.append(np.asarray(calls[1]))
        outputs.append(out)
        # The reader reads the passage only through encode_lower: the split path is the same
        # computation, op for op.
        split = model.encode_upper(variables, model.encode_lower(variables, question),
                                   question.mask, model.encode_lower(variables, passage),
                                   passage.mask)
        np.testing.assert_array_equal(np.asarray(split.start_logits),
                                      np.asarray(out.start_logits))
        np.testing.assert_array_equal(np.asarray(split.end_logits), np.asarray(out.end_logits))
    np.testing.assert_array_equal(states[0], states[1])
    np.testing.assert_array_equal(states[0], states[2])
    np.testing.assert_array_equal(states[0], np.asarray(model.encode_lower(variables, passage)))
    assert np.abs(np.asarray(outputs[0].start_logits) - np.asarray(outputs[1].start_logits)
                  ).max() > 1e-3  # the questions do matter upstairs


def test_segment_states_do_not_depend_on_padding_width():
    """A passage cached at one width is read at another: its real tokens' states and the pair's
    logits are the same (up to float32 rounding of differently shaped programs)."""
    config = tiny_config()
    variables = tiny_variables(config)
    model = QANetModel(config)
    question, passage = _pairs(config)
    extra = 13

    def widen(seg: QANetSegment) -> QANetSegment:
        return QANetSegment(ids=np.pad(seg.ids, [(0, 0), (0, extra)]),
                            chars=np.pad(seg.chars, [(0, 0), (0, extra), (0, 0)]),
                            mask=np.pad(seg.mask, [(0, 0), (0, extra)]))

    narrow_state = np.asarray(model.encode_lower(variables, passage))
    wide_state = np.asarray(model.encode_lower(variables, widen(passage)))
    for row in range(2):
        real = np.asarray(passage.mask[row]) > 0
        np.testing.assert_allclose(wide_state[row, :20][real], narrow_state[row][real],
                                   atol=LAYER_ATOL * 10)
    narrow, wide = model(variables, question, passage), model(variables, widen(question),
                                                               widen(passage))
    scale = np.abs(np.asarray(narrow.start_logits)[np.asarray(passage.mask) > 0]).max()
    for got, want in ((wide.start_logits, narrow.start_logits),
                      (wide.end_logits, narrow.end_logits)):
        got, want = np.asarray(got)[:, :20], np.asarray(want)
        real = np.asarray(passage.mask) > 0
        np.testing.assert_allclose(got[real], want[real], atol=MODEL_RTOL * scale)


def test_word_table_is_frozen_and_checked():
    config = tiny_config()
    model = QANetModel(config)
    table = np.random.default_rng(5).normal(size=(config.vocab_size, config.word_dim))
    variables = model.init(jax.random.key(0), word_table=table)
    np.testing.assert_array_equal(np.asarray(variables["frozen"]["word_table"]),
                                  table.astype(np.float32))
    question, passage = _pairs(config)

    def loss(v):
        return jnp.sum(model(v, question, passage).start_logits[:, :4])

    grads = jax.grad(loss)(variables)
    assert np.all(np.asarray(grads["frozen"]["word_table"]) == 0)
    assert any(np.abs(np.asarray(g)).max() > 0 for g in jax.tree.leaves(grads["params"]))
    with pytest.raises(InputError, match="word_table shape"):
        model.init(jax.random.key(0), word_table=table[:, :5])


@pytest.mark.parametrize("kind", ["qanet", "bidaf"])
def test_word_scale_reads_the_table_times_the_scale(kind):
    """A reader with word_scale s reads what the same reader with s = 1 reads over the table
    multiplied by s (the independent reference: the scaled table itself); the stored table stays
    as given, and gets no gradient."""
    from dil_jax.model.bidaf import BiDAFModel
    from dil_jax.model.bidaf_config import BiDAFConfig

    if kind == "qanet":
        config, model_type = tiny_config(), QANetModel
    else:
        config, model_type = BiDAFConfig(vocab_size=40, word_dim=12, max_chars=6, char_dim=4,
                                         char_filters=6, char_kernel=3, hidden=8, dropout=0.0,
                                         char_dropout=0.0), BiDAFModel
    table = np.random.default_rng(6).normal(scale=0.05, size=(config.vocab_size,
                                                              config.word_dim))
    scale = 16.0  # a power of two: table * scale is exact, so the two paths compute the same
    scaled = model_type(config.replace(word_scale=scale))
    variables = scaled.init(jax.random.key(0), word_table=table)
    np.testing.assert_array_equal(np.asarray(variables["frozen"]["word_table"]),
                                  table.astype(np.float32))
    reference_variables = {**variables, "frozen": {"word_table": table.astype(np.float32)
                                                   * np.float32(scale)}}
    question, passage = _pairs(config)
    got = scaled(variables, question, passage)
    want = model_type(config)(reference_variables, question, passage)
    np.testing.assert_array_equal(np.asarray(got.start_logits), np.asarray(want.start_logits))
    np.testing.assert_array_equal(np.asarray(got.end_logits), np.asarray(want.end_logits))
    unscaled = model_type(config)(variables, question, passage)
    assert not np.array_equal(np.asarray(unscaled.start_logits), np.asarray(got.start_logits))
    grads = jax.grad(lambda v: jnp.sum(scaled(v, question, passage).start_logits[:, :4]))(
        variables)
    assert np.all(np.asarray(grads["frozen"]["word_table"]) == 0)
    with pytest.raises(ConfigError, match="word_scale must be a positive number, got -1.0"):
        config.replace(word_scale=-1.0)


def test_inputs_are_checked_by_name():
    config = tiny_config()
    model = QANetModel(config)
    variables = tiny_variables(config)
    question, passage = _pairs(config)
    bad_chars = QANetSegment(passage.ids, passage.chars[..., :3], passage.mask)
    with pytest.raises(InputError, match="chars must be"):
        model(variables, question, bad_chars)
    q_state = model.encode_lower(variables, question)
    with pytest.raises(InputError, match="batch"):
        model.encode_upper(variables, q_state[:1], question.mask[:1],
                           model.encode_lower(variables, passage), passage.mask)


@pytest.mark.parametrize("changes,named", [
    (dict(d_model=30, num_heads=4), "num_heads"),
    (dict(embedding_kernel=6), "embedding_kernel"),
    (dict(lsh_encoders=("passage",)), "lsh_encoders"),
    (dict(lsh_num_buckets=3), "lsh_num_buckets"),
    (dict(reversible=True, model_convs=3), "model_convs"),
    (dict(dropout=1.0), "dropout"),
    (dict(model_blocks=0), "model_blocks"),
    (dict(word_scale=0.0), "word_scale"),
    (dict(word_scale=float("nan")), "word_scale"),
    (dict(word_scale=True), "word_scale"),
])
def test_invalid_configs_are_refused_by_name(changes, named):
    with pytest.raises(ConfigError, match=named):
        tiny_config(**changes)


def test_paper_defaults_and_dict_round_trip():
    config = QANetConfig()
    assert (config.d_model, config.num_heads, config.embedding_kernel, config.embedding_convs,
            config.embedding_blocks, config.model_convs, config.model_blocks,
            config.max_chars) == (128, 8, 7, 4, 1, 2, 7, 16)
    assert not config.lsh_encoders and not config.reversible and not config.ffn_chunk_size
    changed = config.replace(lsh_encoders=("model",), reversible=True)
    assert QANetConfig.from_dict(changed.to_dict()) == changed
    with pytest.raises(ConfigError, match="unknown"):
        QANetConfig.from_dict({"d_model": 64, "hidden_size": 64})


# ----------------------------------------------------------------------------- inputs

def test_token_characters_come_from_the_text_through_offsets():
    texts = ["Ünïcode Zürich", "ab"]
    # [CLS] Ünïcode Zürich [SEP] pad / [CLS] ab <a token of an empty span> pad pad; words are
    # cut at 4 characters; padding's offsets are not read.
    offsets = np.array([[[-1, -1], [0, 7], [8, 14], [-1, -1], [-1, -1]],
                        [[-1, -1], [0, 2], [2, 2], [-1, -1], [0, 2]]])
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    chars = token_characters(texts, offsets, mask, max_chars=4)
    assert chars.shape == (2, 5, 4)
    assert list(chars[0, 0]) == [CHAR_SPECIAL, 0, 0, 0]
    assert list(chars[0, 1]) == [char_id(c) for c in "Ünïc"]
    assert list(chars[0, 2]) == [char_id(c) for c in "Züri"]
    assert list(chars[0, 4]) == [0, 0, 0, 0]  # padding
    assert list(chars[1, 1]) == [char_id("a"), char_id("b"), 0, 0]
    assert list(chars[1, 2]) == [CHAR_EMPTY, 0, 0, 0]
    assert list(chars[1, 4]) == [0, 0, 0, 0]
    assert char_id("Z") != char_id("z")  # the case the uncased vocabulary loses
    assert 260 <= char_id("字") < 512


def test_qanet_segment_of_the_repo_tokenizer(minilm_dir):
    from dil_jax.tokenization import encode_passages, load_tokenizer

    tokenizer = load_tokenizer(minilm_dir)
    text = "Tokenization of Zürich's passages"
    segments = encode_passages(tokenizer, [text], max_passage_len=16)
    seg = qanet_segment(segments, [text])
    assert seg.chars.shape == (1, 16, 16)
    np.testing.assert_array_equal(seg.ids, segments.ids)
    for t in range(16):
        start, end = segments.offsets[0, t]
        if segments.mask[0, t] and start >= 0:
            piece = text[start:end]
            assert ref.real_characters(seg.chars[0, t]) == [char_id(c) for c in piece[:16]]
    # The word pieces of "Tokenization" carry their own characters, not "##".
    pieces = [text[s:e] for s, e in segments.offsets[0] if s >= 0]
    assert "".join(pieces[:3]).startswith("Token")


def test_minilm_word_table_is_the_checkpoints_input_embedding(minilm_dir):
    from dil_jax.checkpoints.files import read_state_dict

    table = minilm_word_table(minilm_dir)
    state = read_state_dict(minilm_dir)
    name = next(n for n in state if n.endswith("embeddings.word_embeddings.weight"))
    assert table.shape == (30522, 384) and table.dtype == np.float32
    np.testing.assert_array_equal(table, state[name])
