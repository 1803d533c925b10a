"""The pair program's exact reuses equal the unoptimised pair program.

Two reuses (docs/architecture.md, "Exact reuse in the pair program"): (1) the last block computes
only `[CLS]` and the passage rows, the rows the span head reads; (2) the first upper block's
passage-query x passage-key attention comes from per-passage softmax statistics, merged per pair
with the passage's scores against the question by the log-sum-exp rule. Each, and both, must give
the span and null scores of the reference program (`PairGrid(reuse=False)`, plain
`encode_upper`), on BERT, ALBERT (2 groups over 4 layers, split inside the second) and
DistilBERT (and RoBERTa, ELECTRA: issue 16's backbones), at k = l - 1 (both reuses in the same
block) and k < l - 1, with padding in both segments. The merge itself is checked against a
softmax written here in NumPy, and the reused program against tests/helpers/numpy_reference.py
(float64, no code shared with dil_jax; segments and the reference call shared with
tests/model/test_delayed.py: `tests.helpers.hf.padded_segments`, `numpy_reference.pair_reference`).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from dil_jax.checkpoints import convert_state_dict, encoder_config_from_hf
from dil_jax.model.attention import (
    attend_with_passage_stats,
    attention_bias,
    passage_attention_stats,
)
from dil_jax.model.delayed import DelayedInteractionModel, InputError
from dil_jax.model.encoder_config import EncoderConfig, ReaderOverrides
from dil_jax.model.span_reader import PADDED_LOGIT, PASSAGE_SEGMENT, QUESTION_SEGMENT
from dil_jax.reading import grid as grid_module
from dil_jax.reading import upper
from dil_jax.reading.grid import PairGrid
from dil_jax.reading.pairs import chunk_width, kept_positions, real_lengths
from dil_jax.reading.upper import project_upper, read_upper

from tests.helpers.hf import SEGMENTS_MAX_Q as MAX_Q
from tests.helpers.hf import padded_segments, state_dict_numpy
from tests.helpers.numpy_reference import pair_reference

# Float32 rounding, justified: the logits here are at most ~3 in size (init range 0.2), where one
# float32 ulp is 2.4e-7. The reuses change only the order of float32 operations (a p x q and a
# p x p partial softmax, each against its own max, rescaled by exp(m_i - m) and summed, instead
# of one softmax over q + p keys; [CLS] and the passage rows computed without the other question
# rows, which changes no row's arithmetic): a few ulps per attention output, carried through at
# most 2 upper blocks (LayerNorm, 37-wide FFN, 32-wide W_o: sums of tens of terms). Measured:
# at most 1.2e-6 (5 ulps) over every case below. 1e-5 (~40 ulps) leaves room for other CPUs'
# summation orders and stays far below any real error: dropping the merge's max correction, a
# wrong mask or a wrong block moves logits by 1e-2 and more.
REUSE_ATOL = 1e-5
# Against the float64 NumPy reference the float32 program itself is ~1e-5 off (test_delayed).
REFERENCE_ATOL = 1e-4


def _model(hf_folder_factory, arch: str, k: int):
    """(model split at k, params, HF state dict) of a tiny random 4-layer checkpoint; ALBERT
    with 2 parameter groups, so k = 2 and k = 3 both split inside the second group."""
    overrides = {"num_hidden_groups": 2} if arch == "albert" else {}
    _, hf_model = hf_folder_factory(arch, **overrides)
    config = encoder_config_from_hf(hf_model.config.to_dict(),
                                    overrides=ReaderOverrides(num_lower_layers=k,
                                                              max_question_len=MAX_Q))
    state = state_dict_numpy(hf_model)
    params, _ = convert_state_dict(state, config)
    return DelayedInteractionModel(config), params, state


def _scores(out) -> list[np.ndarray]:
    return [np.asarray(a) for a in (out.start_logits, out.end_logits, out.null_start_logits,
                                    out.null_end_logits)]


def _assert_same_scores(got, want, p_mask: np.ndarray, label: str) -> None:
    """Span scores at real passage tokens and null scores agree within REUSE_ATOL (padded
    passage tokens carry PADDED_LOGIT in both)."""
    names = ("start", "end", "null start", "null end")
    for name, a, b in zip(names, _scores(got), _scores(want), strict=True):
        if a.shape == p_mask.shape:
            a, b = a[p_mask > 0], b[p_mask > 0]
        np.testing.assert_allclose(a, b, atol=REUSE_ATOL, rtol=0, err_msg=f"{label}: {name}")


def _numpy_reference(state, config: EncoderConfig, q: list[int], p: list[int]):
    """(start, end over the passage, null start, null end) of one pair by the float64 NumPy
    reader: block-diagonal attention in layers 1..k, full above, each backbone's positions."""
    return pair_reference(state, config, q, p, config.num_lower_layers)


def _softmax_parts_numpy(scores: np.ndarray, values: np.ndarray):
    """Hand-written float64 row max, row sum of exp and unnormalised context."""
    row_max = scores.max(-1)
    weights = np.exp(scores - row_max[..., None])
    return row_max, weights.sum(-1), weights @ values


def test_merge_equals_one_softmax_over_question_and_passage_keys():
    """passage_attention_stats + attend_with_passage_stats == softmax over all keys, by a
    float64 NumPy softmax written here, with padded keys on both sides. The passage part's and
    the question part's maxima differ by several units, so a merge without the max correction
    is far off (checked below with a hand-made wrong merge)."""
    config = EncoderConfig(hidden_size=16, embedding_size=16, num_heads=2, intermediate_size=8,
                           num_layers=2, num_lower_layers=1, attention_form="batched")
    rng = np.random.default_rng(0)
    batch, heads, q_len, p_len, d = 2, 2, 5, 7, 8
    q_mask = (np.arange(q_len)[None] < np.array([[5], [3]])).astype(np.int32)
    p_mask = (np.arange(p_len)[None] < np.array([[4], [7]])).astype(np.int32)
    p_query = rng.normal(size=(batch, heads, p_len, d)).astype(np.float32)
    p_key = rng.normal(size=(batch, heads, p_len, d)).astype(np.float32)
    p_value = rng.normal(size=(batch, heads, p_len, d)).astype(np.float32)
    # Question keys shifted so that the question part's maxima sit well above the passage's.
    q_key = (rng.normal(size=(batch, heads, q_len, d)) + 1.5).astype(np.float32)
    q_value = rng.normal(size=(batch, heads, q_len, d)).astype(np.float32)
    p_query = p_query + 1.0

    stats = passage_attention_stats(config, (p_query, p_key, p_value), p_mask)
    got = np.asarray(attend_with_passage_stats(
        config, p_query, q_key, q_value, attention_bias(q_mask), stats.row_max, stats.row_sum,
        stats.weighted_values))

    # NumPy: one softmax over [question ; passage] keys, masked keys excluded.
    keys = np.concatenate([q_key, p_key], axis=2).astype(np.float64)
    values = np.concatenate([q_value, p_value], axis=2).astype(np.float64)
    allowed = np.concatenate([q_mask, p_mask], axis=1)[:, None, None, :] > 0
    scores = np.where(allowed, p_query.astype(np.float64) @ keys.transpose(0, 1, 3, 2), -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    want = (probs / probs.sum(-1, keepdims=True)) @ values
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)

    # The statistics themselves, by hand over the passage's own unmasked keys.
    p_scores = np.where(p_mask[:, None, None, :] > 0,
                        p_query.astype(np.float64) @ p_key.transpose(0, 1, 3, 2), -np.inf)
    m_p, l_p, o_p = _softmax_parts_numpy(p_scores, p_value.astype(np.float64))
    np.testing.assert_allclose(np.asarray(stats.row_max), m_p, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(stats.row_sum), l_p, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(stats.weighted_values), o_p, atol=1e-5, rtol=1e-5)

    # Guard: adding the two parts without rescaling to the common max is clearly wrong here,
    # so the tolerance above can tell a correct merge from that mutation.
    q_scores = np.where(q_mask[:, None, None, :] > 0,
                        p_query.astype(np.float64) @ q_key.transpose(0, 1, 3, 2), -np.inf)
    _, l_q, o_q = _softmax_parts_numpy(q_scores, q_value.astype(np.float64))
    unscaled = (o_p + o_q) / (l_p + l_q)[..., None]
    assert np.abs(unscaled - want).max() > 1e-2


CASES = [(arch, k) for arch in ("bert", "albert", "distilbert") for k in (3, 2)] + [
    ("roberta", 3), ("electra", 2)]


@pytest.mark.parametrize("arch,k", CASES)
def test_each_reuse_equals_the_reference_encode_upper(hf_folder_factory, arch, k):
    """read_upper with span_rows_only, with p_stats, and with both (q/k/v precomputed, as
    PairGrid reads them) equals the reference encode_upper and the NumPy reference; k = 3 of
    4: both reuses in the one upper block; k = 2: the statistics in the first upper block, the
    rows in the second (ALBERT: both layers use the second parameter group)."""
    model, params, state = _model(hf_folder_factory, arch, k)
    q_ids, q_mask, p_ids, p_mask = padded_segments(k, arch=arch)
    q_lower = model.encode_lower(params, q_ids, q_mask, QUESTION_SEGMENT)
    p_lower = model.encode_lower(params, p_ids, p_mask, PASSAGE_SEGMENT)
    q_qkv, p_qkv = project_upper(model, params, q_lower), project_upper(model, params, p_lower)
    stats = upper.passage_attention_stats(model, p_qkv, p_mask)
    reference = model.encode_upper(params, q_lower, q_mask, p_lower, p_mask)
    variants = {"rows": dict(span_rows_only=True),
                "stats": dict(q_qkv=q_qkv, p_qkv=p_qkv, p_stats=stats),
                "stats, q/k/v projected in the pair": dict(p_stats=stats),
                "both": dict(q_qkv=q_qkv, p_qkv=p_qkv, p_stats=stats, span_rows_only=True)}
    for name, reuse in variants.items():
        out = read_upper(model, params, q_lower, q_mask, p_lower, p_mask, **reuse)
        _assert_same_scores(out, reference, p_mask, f"{arch} k={k} {name}")
        if name == "both":
            for row in range(len(q_ids)):
                q = list(q_ids[row, :q_mask[row].sum()])
                p = list(p_ids[row, :p_mask[row].sum()])
                want = _numpy_reference(state, model.config, q, p)
                got = [s[row, :len(p)] if s.ndim == 2 else s[row] for s in _scores(out)]
                for g, w in zip(got, want, strict=True):
                    np.testing.assert_allclose(g, w, atol=REFERENCE_ATOL, rtol=0,
                                               err_msg=f"{arch} k={k} row {row}")


@pytest.mark.parametrize("arch,k", CASES + [("bert", 0), ("roberta", 0)])
def test_grid_with_reuse_equals_the_reference_grid(hf_folder_factory, arch, k, monkeypatch):
    """PairGrid picks the reuses itself (every passage read by 3 questions: statistics on for
    0 < k < l; the last block's rows always) and reads the grid of the reference PairGrid
    (reuse=False). k = 0: the full model, the rows reuse alone."""
    model, params, _ = _model(hf_folder_factory, arch, k)
    q_ids, q_mask, p_ids, p_mask = padded_segments(10 + k, arch=arch)
    optimised = PairGrid(model, batch_size=2, chunk_size=4)
    reference = PairGrid(model, batch_size=2, chunk_size=4, reuse=False)
    computed = []
    stats_of = optimised.passage_attention_stats
    monkeypatch.setattr(optimised, "passage_attention_stats",
                        lambda qkv, mask: computed.append(mask.shape) or stats_of(qkv, mask))
    grids = []
    for reader in (optimised, reference):
        q_lower = reader.encode_questions(params, q_ids, q_mask)
        p_source = reader.passage_side(params, p_ids, p_mask)
        grids.append(reader.read_grid(params, q_lower, q_mask, p_source, p_mask))
    assert computed == ([p_mask.shape] if k > 0 else [])
    assert optimised.plan.span_rows_only and not reference.plan.span_rows_only
    grid_mask = np.broadcast_to(p_mask[None], (len(q_ids),) + p_mask.shape)
    _assert_same_scores(grids[0], grids[1], grid_mask, f"{arch} k={k} grid")


def test_statistics_are_left_out_where_they_do_not_pay_or_do_not_apply(hf_folder_factory):
    """Pairs that read each passage once (SQuAD windows, open-domain hits) and pairs that read
    kept tokens (prescreening) get no statistics: computing them would cost what the pairs
    save, and kept tokens attend only the kept keys. Outputs still equal the reference's;
    statistics handed in with kept positions, or to a reader without reuse, are refused."""
    model, params, _ = _model(hf_folder_factory, "bert", 3)
    q_ids, q_mask, p_ids, p_mask = padded_segments(21)
    optimised = PairGrid(model, batch_size=2, chunk_size=4)
    reference = PairGrid(model, batch_size=2, chunk_size=4, reuse=False)
    computed = []
    stats_of = optimised.passage_attention_stats
    optimised.passage_attention_stats = (
        lambda qkv, mask: computed.append(mask.shape) or stats_of(qkv, mask))
    q_lower = optimised.encode_questions(params, q_ids, q_mask)
    p_lower = optimised.encode_passages(params, p_ids, p_mask)
    q_index, p_index = np.array([0, 1, 2]), np.array([2, 0, 1])
    keep = np.random.default_rng(3).random((3, p_ids.shape[1])) < 0.6
    keep[:, 0] = True
    positions = kept_positions(keep, bucket=4)
    for kept in (None, positions):
        got, want = (reader.read_pairs(params, q_lower, q_mask, p_lower, p_mask, q_index,
                                       p_index, kept) for reader in (optimised, reference))
        mask = p_mask[p_index] * (keep if kept is not None else 1)
        _assert_same_scores(got, want, mask, f"positions={kept is not None}")
    assert computed == []
    # The same grid of every pair computes them once.
    grid_q, grid_p = (a.ravel() for a in np.meshgrid(np.arange(3), np.arange(3), indexing="ij"))
    optimised.read_pairs(params, q_lower, q_mask, p_lower, p_mask, grid_q, grid_p)
    assert computed == [p_mask.shape]
    p_qkv = optimised.project_segments(params, p_lower)
    stats = stats_of(p_qkv, p_mask)
    with pytest.raises(InputError, match="positions"):
        next(optimised.iter_pair_chunks(params, q_lower, q_mask, p_lower, p_mask, q_index,
                                        p_index, positions, p_stats=stats))
    with pytest.raises(InputError, match="does not use them"):
        next(reference.iter_pair_chunks(params, q_lower, q_mask, p_lower, p_mask, q_index,
                                        p_index, p_stats=stats))
    # The reuses are inference-only: read_upper, their one entry, takes no training switches.
    with pytest.raises(TypeError, match="output_hidden_states"):
        read_upper(model, params, q_lower, q_mask, p_lower, p_mask, span_rows_only=True,
                   output_hidden_states=True)


def test_statistics_are_question_independent_and_per_passage(hf_folder_factory):
    """The statistics a passage gets are the same whichever batch computes it (a cache can
    store them per passage), and shaped as PassageAttentionStats documents."""
    model, params, _ = _model(hf_folder_factory, "albert", 2)
    _, _, p_ids, p_mask = padded_segments(31)
    reader = PairGrid(model, batch_size=2, chunk_size=4)
    p_qkv = reader.project_segments(params, reader.encode_passages(params, p_ids, p_mask))
    together = reader.passage_attention_stats(p_qkv, p_mask)
    cfg = model.config
    assert together.row_max.shape == (3, cfg.num_heads, p_ids.shape[1])
    assert together.weighted_values.shape == (3, cfg.num_heads, p_ids.shape[1], cfg.head_dim)
    alone = reader.passage_attention_stats(tuple(a[1:2] for a in p_qkv), p_mask[1:2])
    for name in ("row_max", "row_sum", "weighted_values"):
        np.testing.assert_allclose(np.asarray(getattr(alone, name))[0],
                                   np.asarray(getattr(together, name))[1], rtol=1e-6,
                                   atol=1e-6)
    with pytest.raises(InputError, match="0 < k < l"):
        PairGrid(DelayedInteractionModel(cfg.replace(num_lower_layers=0))
                 ).passage_attention_stats(p_qkv, p_mask)
    assert jax.tree.leaves(together)  # a pytree: gathered and sharded like q/k/v


def test_real_lengths_by_hand():
    """One past the last real token, padding between real tokens included; 0 when empty."""
    mask = np.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1]])
    assert real_lengths(mask).tolist() == [2, 0, 3, 4]
    assert chunk_width(np.array([3, 5]), 4, 10) == 8
    assert chunk_width(np.array([9]), 4, 10) == 10  # capped at the side's length
    assert chunk_width(np.array([0]), 4, 10) == 4   # an empty segment still reads one bucket


@pytest.mark.parametrize("arch,k", [("bert", 2), ("bert", 0), ("albert", 3), ("distilbert", 3)])
def test_trimmed_chunks_equal_the_reference(hf_folder_factory, arch, k, monkeypatch):
    """Chunks that read only their longest real question and passage (`trims_padding`; the
    buckets shrunk to 4 tokens so that the tiny segments are cut) give the reference reader's
    span and null scores at every real token, and padding's PADDED_LOGIT at every padded one
    (cut or not, as the reference gives it); the chunks did read
    fewer tokens than the segments hold (the reader's own calls, spied on)."""
    monkeypatch.setattr(grid_module, "KEPT_BUCKET", 4)
    monkeypatch.setattr(grid_module, "QUESTION_BUCKET", 4)
    model, params, _ = _model(hf_folder_factory, arch, k)
    # Real lengths spread over several buckets on both sides; chunks whose longest passage is
    # one past a bucket (9, 13), so that a width one token short would cut a real token.
    q_ids, q_mask, p_ids, p_mask = padded_segments(40 + k, q_lens=(4, 10, 6, 5),
                                             p_lens=(13, 5, 19, 9), arch=arch)
    optimised = PairGrid(model, batch_size=2, chunk_size=2)
    reference = PairGrid(model, batch_size=2, chunk_size=2, reuse=False)
    assert optimised.plan.trims_padding and not reference.plan.trims_padding
    widths = []
    pair_fn = optimised._pair_fn
    optimised.__dict__["_pair_fn"] = lambda *args: widths.append(args[11:13]) or pair_fn(*args)
    q_index, p_index = np.array([0, 1, 2, 3, 1, 2]), np.array([2, 0, 1, 3, 3, 2])
    got, want = [], []
    for reader, out in ((optimised, got), (reference, want)):
        q_lower = reader.encode_questions(params, q_ids, q_mask)
        p_source = reader.passage_side(params, p_ids, p_mask)
        out.append(reader.read_pairs(params, q_lower, q_mask, p_source, p_mask, q_index,
                                     p_index))
    pair_mask = p_mask[p_index]
    _assert_same_scores(got[0], want[0], pair_mask, f"{arch} k={k} trimmed")
    for name in ("start_logits", "end_logits"):
        assert np.all(getattr(got[0], name)[pair_mask == 0] == PADDED_LOGIT)
        assert np.all(getattr(want[0], name)[pair_mask == 0] == PADDED_LOGIT)
    q_widths, p_widths = zip(*widths, strict=True)
    assert min(p_widths) < p_mask.shape[1] and min(q_widths) < q_mask.shape[1], widths


def test_padding_is_kept_where_trimming_is_not_exact(hf_folder_factory):
    """LSH upper blocks hash over the whole sequence, XLNet counts a question's padding in
    its relative distances: neither trims."""
    model, _, _ = _model(hf_folder_factory, "bert", 2)
    lsh = model.config.replace(lsh_attention_layers=(3,), lsh_bucket_size=4)
    assert not PairGrid(DelayedInteractionModel(lsh)).plan.trims_padding
    xlnet = model.config.replace(architecture="xlnet", type_vocab_size=0)
    assert not PairGrid(DelayedInteractionModel(xlnet)).plan.trims_padding
