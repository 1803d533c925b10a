"""Delayed interaction is exactly what it claims.

`encode_upper(encode_lower(q), encode_lower(p))` must equal an independently written reader (NumPy,
tests/helpers/numpy_reference.py) that runs all l blocks over the concatenation `[q ; p]` with a
block-diagonal attention mask in blocks 1..k (each segment sees only itself), passage positions
restarting at 0 and token types 0/1 — for random k, for BERT, for ALBERT (one block shared by all
layers, so the split must fall inside repeated applications of the same weights) and DistilBERT;
and for issue 16's backbones with their own position schemes: RoBERTa and XLM-RoBERTa (each
segment numbered by Hugging Face's rule as if it were a sequence of its own, from padding_idx + 1;
token type 0 for both, so the segments differ by the position restart alone) and ELECTRA
(embedding < hidden: the projection runs before block 1, inside the lower part).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from dil_jax.checkpoints import convert_state_dict, encoder_config_from_hf
from dil_jax.model.delayed import DelayedInteractionModel
from dil_jax.model.encoder_config import ReaderOverrides
from dil_jax.model.span_reader import PASSAGE_SEGMENT, QUESTION_SEGMENT
from dil_jax.reading.upper import project_upper, read_upper

from tests.helpers.hf import SEGMENTS_MAX_Q as MAX_Q
from tests.helpers.hf import padded_segments, state_dict_numpy
from tests.helpers.numpy_reference import pair_reference

NEW_BACKBONES = ("roberta", "xlm-roberta", "electra")


def _model_and_state(hf_folder_factory, arch, k, **overrides):
    _, hf_model = hf_folder_factory(arch, **overrides)
    hf_config = hf_model.config.to_dict()
    config = encoder_config_from_hf(hf_config,
                                    overrides=ReaderOverrides(num_lower_layers=k,
                                                              max_question_len=MAX_Q))
    state = state_dict_numpy(hf_model)
    params, _ = convert_state_dict(state, config)
    return DelayedInteractionModel(config), params, state


def _assert_reference_logits(out, state, config, segments, k: int, label: str,
                             passage_offset: int = 0) -> None:
    """Every row's span and null logits equal the NumPy reference's (1e-4)."""
    q_ids, q_mask, p_ids, p_mask = segments
    for row in range(len(q_ids)):
        q = list(q_ids[row, :q_mask[row].sum()])
        p = list(p_ids[row, :p_mask[row].sum()])
        start, end, null_start, null_end = pair_reference(state, config, q, p, k, passage_offset)
        np.testing.assert_allclose(np.asarray(out.start_logits[row, :len(p)]), start,
                                   atol=1e-4, err_msg=f"{label} row {row}")
        np.testing.assert_allclose(np.asarray(out.end_logits[row, :len(p)]), end, atol=1e-4)
        np.testing.assert_allclose(float(out.null_start_logits[row]), null_start, atol=1e-4)
        np.testing.assert_allclose(float(out.null_end_logits[row]), null_end, atol=1e-4)


@pytest.mark.parametrize("arch,seed", [("bert", 0), ("bert", 1), ("albert", 2),
                                       ("distilbert", 3), ("roberta", 4), ("xlm-roberta", 5),
                                       ("electra", 6)])
def test_split_equals_block_diagonal_reference(hf_folder_factory, arch, seed):
    k = int(np.random.default_rng(seed).integers(1, 5))  # random k in 1..l (l = 4)
    model, params, state = _model_and_state(hf_folder_factory, arch, k)
    q_ids, q_mask, p_ids, p_mask = padded_segments(seed, arch=arch)
    q_lower = model.encode_lower(params, q_ids, q_mask, QUESTION_SEGMENT)
    p_lower = model.encode_lower(params, p_ids, p_mask, PASSAGE_SEGMENT)
    out = model.encode_upper(params, q_lower, q_mask, p_lower, p_mask)
    _assert_reference_logits(out, state, model.config, (q_ids, q_mask, p_ids, p_mask), k,
                             f"{arch} k={k}")


def test_passage_position_offset_numbers_the_passage_from_the_offset(hf_folder_factory):
    """passage_position_offset = 7: the passage's positions are 7, 8, ... for every pair (the
    reference numbers them so), and the outputs differ from offset 0 (else the test is void)."""
    model, params, state = _model_and_state(hf_folder_factory, "bert", 2)
    shifted = DelayedInteractionModel(model.config.replace(passage_position_offset=7))
    segments = padded_segments(6)
    out = shifted(params, *segments)
    _assert_reference_logits(out, state, shifted.config, segments, 2, "offset 7", 7)
    plain = model(params, *segments)
    assert np.abs(np.asarray(out.start_logits) - np.asarray(plain.start_logits)).max() > 1e-3
    # The length rule counts the offset: 7 + 15 tokens fit 22 positions, not 21.
    from dil_jax.model.delayed import InputError, check_segment_lengths
    check_segment_lengths(shifted.config.replace(max_position_embeddings=22), MAX_Q, 15)
    with pytest.raises(InputError, match="passage_position_offset 7"):
        check_segment_lengths(shifted.config.replace(max_position_embeddings=21), MAX_Q, 15)


def test_reference_is_sensitive_to_k(hf_folder_factory):
    """Guards the test above: different k give clearly different outputs, so passing means
    the split point really is k."""
    model, params, state = _model_and_state(hf_folder_factory, "bert", 2)
    q_ids, q_mask, p_ids, p_mask = padded_segments(5)
    out = model(params, q_ids, q_mask, p_ids, p_mask)
    q = list(q_ids[0, :q_mask[0].sum()])
    p = list(p_ids[0, :p_mask[0].sum()])
    wrong_k, _, _, _ = pair_reference(state, model.config, q, p, k=3)
    assert np.abs(np.asarray(out.start_logits[0, :len(p)]) - wrong_k).max() > 1e-3


@pytest.mark.parametrize("arch,k,groups", [("bert", 3, None), ("albert", 2, 2),
                                            ("distilbert", 1, None), ("roberta", 2, None),
                                            ("electra", 3, None)])
def test_precomputed_first_upper_projections_equal_reference(hf_folder_factory, arch, k, groups):
    """q/k/v of the first upper block computed per segment (as PairGrid does) give the
    reference logits, whichever side is precomputed. ALBERT with 2 groups over 4 layers and
    k = 2: the first upper layer uses the second group, so projecting with the wrong block
    would fail."""
    overrides = {"num_hidden_groups": groups} if groups else {}
    model, params, state = _model_and_state(hf_folder_factory, arch, k, **overrides)
    q_ids, q_mask, p_ids, p_mask = padded_segments(23, arch=arch)
    q_lower = model.encode_lower(params, q_ids, q_mask, QUESTION_SEGMENT)
    p_lower = model.encode_lower(params, p_ids, p_mask, PASSAGE_SEGMENT)
    q_qkv, p_qkv = project_upper(model, params, q_lower), project_upper(model, params, p_lower)
    assert q_qkv[0].shape == (3, model.config.num_heads, MAX_Q, model.config.head_dim)
    for given in ({"q_qkv": q_qkv}, {"p_qkv": p_qkv}, {"q_qkv": q_qkv, "p_qkv": p_qkv}):
        out = read_upper(model, params, q_lower, q_mask, p_lower, p_mask, **given)
        _assert_reference_logits(out, state, model.config, (q_ids, q_mask, p_ids, p_mask), k,
                                 f"{arch} {sorted(given)}")


def test_albert_shared_block_split(hf_folder_factory):
    """ALBERT with two parameter groups over 4 layers: the split inside a group is exact."""
    model, params, state = _model_and_state(hf_folder_factory, "albert", 1, num_hidden_groups=2)
    assert len([name for name in params if name.startswith("block_")]) == 2
    q_ids, q_mask, p_ids, p_mask = padded_segments(7)
    out = model(params, q_ids, q_mask, p_ids, p_mask)
    q = list(q_ids[1, :q_mask[1].sum()])
    p = list(p_ids[1, :p_mask[1].sum()])
    start, _, _, _ = pair_reference(state, model.config, q, p, k=1)
    np.testing.assert_allclose(np.asarray(out.start_logits[1, :len(p)]), start, atol=1e-4)


@pytest.mark.parametrize("arch", ["bert", *NEW_BACKBONES])
def test_passage_lower_state_is_question_independent(hf_folder_factory, arch):
    """RoBERTa and XLM-RoBERTa give both segments token type 0: the passage is told apart from
    the question by its positions restarting (at padding_idx + 1) alone, and its lower state
    must still be bit-identical whatever question it is paired with."""
    model, params, _ = _model_and_state(hf_folder_factory, arch, 2)
    q_ids, q_mask, p_ids, p_mask = padded_segments(11, arch=arch)
    same_passage_ids = np.repeat(p_ids[:1], 3, axis=0)
    same_passage_mask = np.repeat(p_mask[:1], 3, axis=0)
    out = model(params, q_ids, q_mask, same_passage_ids, same_passage_mask,
                output_hidden_states=True)
    alone = model.encode_lower(params, same_passage_ids, same_passage_mask, PASSAGE_SEGMENT)
    for layer in range(model.config.num_lower_layers + 1):
        passage_states = np.asarray(out.hidden_states[layer][:, MAX_Q:])
        for row in (1, 2):  # paired with three different questions: bit-identical
            np.testing.assert_array_equal(passage_states[row], passage_states[0])
    np.testing.assert_array_equal(np.asarray(out.hidden_states[2][:, MAX_Q:]),
                                  np.asarray(alone))
    # Above k the passage does see the question.
    upper = np.asarray(out.hidden_states[3][:, MAX_Q:])
    assert np.abs(upper[1] - upper[0]).max() > 1e-4


@pytest.mark.parametrize("arch", ["bert", "albert", "distilbert"])
def test_no_interaction_logits_ignore_the_question(hf_folder_factory, arch):
    model, params, _ = _model_and_state(hf_folder_factory, arch, 4)  # k = l
    q_ids, q_mask, p_ids, p_mask = padded_segments(13)
    same_p = np.repeat(p_ids[2:3], 3, axis=0)
    same_mask = np.repeat(p_mask[2:3], 3, axis=0)
    out = model(params, q_ids, q_mask, same_p, same_mask)
    for row in (1, 2):
        np.testing.assert_array_equal(np.asarray(out.start_logits[row]),
                                      np.asarray(out.start_logits[0]))
        np.testing.assert_array_equal(np.asarray(out.end_logits[row]),
                                      np.asarray(out.end_logits[0]))


def test_encode_lower_vmaps_over_segments(hf_folder_factory):
    """vmapping the one-segment function over a stack of batches equals the batched call."""
    model, params, _ = _model_and_state(hf_folder_factory, "bert", 3)
    _, _, p_ids, p_mask = padded_segments(17)
    stacked_ids, stacked_mask = p_ids.reshape(3, 1, -1), p_mask.reshape(3, 1, -1)
    vmapped = jax.vmap(lambda ids, mask: model.encode_lower(params, ids, mask, PASSAGE_SEGMENT))
    np.testing.assert_allclose(
        np.asarray(vmapped(stacked_ids, stacked_mask)).reshape(3, p_ids.shape[1], -1),
        np.asarray(model.encode_lower(params, p_ids, p_mask, PASSAGE_SEGMENT)), atol=1e-6)


def test_full_model_equals_k0_split_path(hf_folder_factory):
    """k = 0 is the same code path: embeddings as 'lower', all blocks as 'upper'."""
    model, params, _ = _model_and_state(hf_folder_factory, "bert", 0)
    q_ids, q_mask, p_ids, p_mask = padded_segments(19)
    offset = q_mask.sum(axis=1)
    q_lower = model.encode_lower(params, q_ids, q_mask, QUESTION_SEGMENT)
    p_lower = model.encode_lower(params, p_ids, p_mask, PASSAGE_SEGMENT, offset)
    split = model.encode_upper(params, q_lower, q_mask, p_lower, p_mask)
    whole = model(params, q_ids, q_mask, p_ids, p_mask)
    np.testing.assert_array_equal(np.asarray(split.start_logits), np.asarray(whole.start_logits))


@pytest.mark.parametrize("arch,overrides", [("electra", {"embedding_size": 32}),
                                            ("roberta", {})])
def test_new_backbones_at_every_k(hf_folder_factory, arch, overrides):
    """Every split k = 1..l of ELECTRA without a projection (E == H) and of RoBERTa equals the
    block-diagonal reference; RoBERTa also with passage_position_offset 5 (its passage then
    numbered from padding_idx + 1 + 5)."""
    for k in range(1, 5):
        model, params, state = _model_and_state(hf_folder_factory, arch, k, **overrides)
        segments = padded_segments(40 + k, arch=arch)
        _assert_reference_logits(model(params, *segments), state, model.config, segments, k,
                                 f"{arch} k={k}")
    if arch == "roberta":
        shifted = DelayedInteractionModel(model.config.replace(passage_position_offset=5))
        _assert_reference_logits(shifted(params, *segments), state, shifted.config, segments,
                                 4, "roberta offset 5", 5)


def test_roberta_lengths_count_the_first_position(hf_folder_factory):
    """RoBERTa's 66-row table holds 64 positions (rows 0 and 1 are below padding_idx + 1):
    the length rule says so by name instead of reading past the table."""
    from dil_jax.model.delayed import InputError, check_segment_lengths

    model, _, _ = _model_and_state(hf_folder_factory, "roberta", 0)
    check_segment_lengths(model.config, MAX_Q, 64 - MAX_Q)
    with pytest.raises(InputError, match=r"exceeds 64 positions \(max_position_embeddings 66 "
                                         r"less pad_token_id \+ 1 = 2\)"):
        check_segment_lengths(model.config, MAX_Q, 65 - MAX_Q)
