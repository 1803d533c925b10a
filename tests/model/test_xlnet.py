"""XLNet: parity with Hugging Face PyTorch, delayed interaction against an independent reference.

Hugging Face's `XLNetForQuestionAnsweringSimple` (float32, CPU) reads `P [SEP] Q [SEP] [CLS]`
(segment ids 0 / 1 / 2), left-padded in one batch of mixed lengths, as XLNet's tokenizer pads;
our reader gets the same tokens as two segments (`[CLS] q [SEP]`, `p [SEP]`) and must give the
same start/end logits on every passage token, the same [CLS] (null) logits and the same hidden
state at every layer on every real token, within 1e-4.

Tolerance 1e-4, float32: each side rounds every op to float32 (relative 6e-8); a block's
LayerNorm output is O(1) and its attention sums a few dozen O(1) products, so each block adds
errors of order 1e-6 and a few blocks stay below 1e-5; the logits (a dot product of 32 O(1)
terms with O(0.3) weights) likewise. 1e-4 leaves a 10x margin, while a mis-mapped tensor, a
wrong relative distance or segment term moves outputs by O(0.1) (the weights are perturbed to
O(0.1) everywhere, see `tests.helpers.hf.build_xlnet`).
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import torch

from dil_jax.checkpoints import convert_state_dict, encoder_config_from_hf, load_hf_checkpoint
from dil_jax.errors import CheckpointError, DilJaxError
from dil_jax.model.delayed import DelayedInteractionModel
from dil_jax.model.encoder_config import ReaderOverrides
from dil_jax.model.span_reader import PASSAGE_SEGMENT, QUESTION_SEGMENT
from dil_jax.reading.upper import passage_attention_stats, project_upper, read_upper

from tests.helpers.hf import XLNET_MAX_Q as MAX_Q
from tests.helpers.hf import build_xlnet, state_dict_numpy, xlnet_order
from tests.helpers.training import distill_steps
from tests.helpers.xlnet_numpy_reference import xlnet_reference

TOLERANCE = 1e-4
CLS, SEP, PAD = 3, 4, 5  # XLNet's <cls>, <sep>, <pad> ids
PAD_SEGMENT = 3  # XLNetTokenizer's pad_token_type_id


@pytest.fixture(scope="module")
def xlnet_folder(tmp_path_factory):
    """(folder, torch model) per config overrides, saved as a real Hugging Face folder."""
    cache = {}

    def make(**overrides):
        key = tuple(sorted(overrides.items()))
        if key not in cache:
            model = build_xlnet(**overrides)
            folder = tmp_path_factory.mktemp("hf-xlnet")
            model.save_pretrained(str(folder), safe_serialization=True)
            cache[key] = (folder, model)
        return cache[key]

    return make


def _pairs(seed: int, q_lens=(3, 9, 6, 11), p_lens=(14, 5, 20, 9), vocab=99):
    """(question segment `[CLS] q [SEP]`, passage segment `p [SEP]`) id lists."""
    rng = np.random.default_rng(seed)
    return [([CLS, *rng.integers(9, vocab, nq - 2), SEP], [*rng.integers(9, vocab, npass - 1), SEP])
            for nq, npass in zip(q_lens, p_lens)]


def _segments(pairs, max_q=MAX_Q):
    """Our inputs: questions padded to max_q, passages to the longest (right padding)."""
    p_len = max(len(p) for _, p in pairs)
    q_ids = np.full((len(pairs), max_q), PAD, np.int32)
    p_ids = np.full((len(pairs), p_len), PAD, np.int32)
    q_mask, p_mask = np.zeros_like(q_ids), np.zeros_like(p_ids)
    for row, (q, p) in enumerate(pairs):
        q_ids[row, :len(q)], q_mask[row, :len(q)] = q, 1
        p_ids[row, :len(p)], p_mask[row, :len(p)] = p, 1
    return q_ids, q_mask, p_ids, p_mask


def _hf_batch(hf_model, pairs):
    """Hugging Face on a LEFT-padded batch of mixed lengths -> per pair (start, end, hidden
    states) over its real tokens, in XLNet order."""
    orders = [xlnet_order(q, p) for q, p in pairs]
    width = max(len(ids) for ids, _, _ in orders)
    ids = torch.full((len(pairs), width), PAD)
    types = torch.full((len(pairs), width), PAD_SEGMENT)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    for row, (seq, seg, _) in enumerate(orders):
        ids[row, width - len(seq):] = torch.tensor(seq)
        types[row, width - len(seq):] = torch.tensor(seg)
        mask[row, width - len(seq):] = 1
    with torch.no_grad():
        out = hf_model(input_ids=ids, token_type_ids=types, attention_mask=mask,
                       output_hidden_states=True, use_mems=False)
    results = []
    for row, (seq, _, _) in enumerate(orders):
        real = slice(width - len(seq), width)
        results.append((out.start_logits[row, real].numpy(), out.end_logits[row, real].numpy(),
                        [h[row, real].numpy() for h in out.hidden_states]))
    return results


def _assert_matches(ours, row, q, p, start, end, hidden=None, label=""):
    """Our outputs of batch row `row` equal (start, end, hidden) given in XLNet order."""
    _, _, rows = xlnet_order(q, p)
    npass = len(p)
    np.testing.assert_allclose(np.asarray(ours.start_logits[row, :npass]), start[:npass],
                               atol=TOLERANCE, rtol=0, err_msg=f"{label} start")
    np.testing.assert_allclose(np.asarray(ours.end_logits[row, :npass]), end[:npass],
                               atol=TOLERANCE, rtol=0, err_msg=f"{label} end")
    np.testing.assert_allclose(float(ours.null_start_logits[row]), start[-1], atol=TOLERANCE)
    np.testing.assert_allclose(float(ours.null_end_logits[row]), end[-1], atol=TOLERANCE)
    assert np.all(np.asarray(ours.start_logits[row, npass:]) < -1e8), "padding not masked"
    for layer, theirs in enumerate(hidden or []):
        mine = np.asarray(ours.hidden_states[layer][row])[rows]
        err = np.abs(mine - theirs).max()
        assert err < TOLERANCE, f"{label} layer {layer}: max abs error {err}"


@pytest.mark.parametrize("overrides", [
    {},
    {"n_layer": 4, "n_head": 2, "d_model": 24, "d_inner": 40, "ff_activation": "relu"},
])
def test_random_init_parity_with_hugging_face(xlnet_folder, overrides):
    folder, hf_model = xlnet_folder(**overrides)
    config, params, report = load_hf_checkpoint(folder, ReaderOverrides(max_question_len=MAX_Q))
    assert config.architecture == "xlnet" and config.num_layers == hf_model.config.n_layer
    assert not report.initialized
    assert report.ignored == ["transformer.mask_emb"]  # the query stream's, unused here
    pairs = _pairs(seed=len(overrides))
    ours = DelayedInteractionModel(config)(params, *_segments(pairs), output_hidden_states=True)
    assert len(ours.hidden_states) == config.num_layers + 1
    for row, ((q, p), (start, end, hidden)) in enumerate(zip(pairs, _hf_batch(hf_model, pairs))):
        _assert_matches(ours, row, q, p, start, end, hidden, f"row {row}")


def test_every_tensor_is_perturbed(xlnet_folder):
    """Guards the parity test: no tensor keeps a constant init (zero biases, unit scales)."""
    _, hf_model = xlnet_folder()
    for name, tensor in hf_model.named_parameters():
        values = tensor.detach().numpy()
        assert values.std() > 0.01, f"{name} is (nearly) constant"


def test_hugging_face_itself_is_layout_sensitive(xlnet_folder):
    """Guards the layout mapping: putting [CLS] first (BERT's layout) or giving it the question's
    segment id changes Hugging Face's logits, so matching it pins XLNet's layout down."""
    _, hf_model = xlnet_folder()
    q, p = _pairs(3)[0]
    ids, segments, _ = xlnet_order(q, p)

    def start(ids, segments):
        with torch.no_grad():
            return hf_model(input_ids=torch.tensor([ids]),
                            token_type_ids=torch.tensor([segments])).start_logits[0].numpy()

    reference = start(ids, segments)
    cls_first = start(ids[-1:] + ids[:-1], segments[-1:] + segments[:-1])
    assert np.abs(cls_first[1:len(p) + 1] - reference[:len(p)]).max() > 1e-2
    same_segment = start(ids, segments[:-1] + [1])
    assert np.abs(same_segment - reference).max() > 1e-3  # 10x the parity tolerance


def _model_and_state(xlnet_folder, k):
    _, hf_model = xlnet_folder()
    config = encoder_config_from_hf(hf_model.config.to_dict(),
                                    overrides=ReaderOverrides(num_lower_layers=k,
                                                              max_question_len=MAX_Q))
    state = state_dict_numpy(hf_model)
    params, _ = convert_state_dict(state, config)
    return DelayedInteractionModel(config), params, state


def _reference(state, config, q, p, k):
    """The NumPy reader on one pair in XLNet order, block-diagonal in blocks 1..k: the passage
    `P [SEP]` and the question `Q [SEP] [CLS]` each attend only themselves there."""
    ids, segments, _ = xlnet_order(q, p)
    is_passage = np.arange(len(ids)) < len(p)
    same_block = is_passage[:, None] == is_passage[None, :]
    allowed = [same_block if layer < k else np.ones_like(same_block)
               for layer in range(config.num_layers)]
    return xlnet_reference(state, config.num_layers, np.array(ids), np.array(segments), allowed,
                           config.hidden_act, config.layer_norm_eps)


def test_reference_equals_hugging_face_at_k0(xlnet_folder):
    """The NumPy reader is a valid reference: with k = 0 it is Hugging Face (float64 vs 32)."""
    model, _, state = _model_and_state(xlnet_folder, 0)
    _, hf_model = xlnet_folder()
    pairs = _pairs(4)
    for (q, p), (start, end, hidden) in zip(pairs, _hf_batch(hf_model, pairs)):
        ref_start, ref_end, ref_hidden = _reference(state, model.config, q, p, 0)
        np.testing.assert_allclose(ref_start, start, atol=TOLERANCE)
        np.testing.assert_allclose(ref_end, end, atol=TOLERANCE)
        for mine, theirs in zip(ref_hidden, hidden):
            np.testing.assert_allclose(mine, theirs, atol=TOLERANCE)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_split_equals_block_diagonal_reference(xlnet_folder, k):
    model, params, state = _model_and_state(xlnet_folder, k)
    pairs = _pairs(5 + k)
    q_ids, q_mask, p_ids, p_mask = _segments(pairs)
    q_lower = model.encode_lower(params, q_ids, q_mask, QUESTION_SEGMENT)
    p_lower = model.encode_lower(params, p_ids, p_mask, PASSAGE_SEGMENT)
    split = model.encode_upper(params, q_lower, q_mask, p_lower, p_mask)
    whole = model(params, q_ids, q_mask, p_ids, p_mask, output_hidden_states=True)
    for row, (q, p) in enumerate(pairs):
        start, end, hidden = _reference(state, model.config, q, p, k)
        _assert_matches(split, row, q, p, start, end, None, f"k={k} split row {row}")
        _assert_matches(whole, row, q, p, start, end, hidden, f"k={k} row {row}")


def test_reference_is_sensitive_to_k(xlnet_folder):
    """Guards the test above: the reference at a wrong k (or the full model) differs clearly."""
    model, params, state = _model_and_state(xlnet_folder, 2)
    pairs = _pairs(9)
    out = model(params, *_segments(pairs))
    q, p = pairs[0]
    for wrong_k in (0, 1, 3):
        start, _, _ = _reference(state, model.config, q, p, wrong_k)
        assert np.abs(np.asarray(out.start_logits[0, :len(p)]) - start[:len(p)]).max() > 1e-3


def test_passage_lower_state_is_question_independent(xlnet_folder):
    model, params, _ = _model_and_state(xlnet_folder, 2)
    q_ids, q_mask, p_ids, p_mask = _segments(_pairs(11))
    same_ids, same_mask = np.repeat(p_ids[2:3], 4, axis=0), np.repeat(p_mask[2:3], 4, axis=0)
    out = model(params, q_ids, q_mask, same_ids, same_mask, output_hidden_states=True)
    alone = model.encode_lower(params, same_ids, same_mask, PASSAGE_SEGMENT)
    for layer in range(model.config.num_lower_layers + 1):
        passage_states = np.asarray(out.hidden_states[layer][:, MAX_Q:])
        for row in (1, 2, 3):  # paired with four different questions: bit-identical
            np.testing.assert_array_equal(passage_states[row], passage_states[0])
    np.testing.assert_array_equal(np.asarray(out.hidden_states[2][:, MAX_Q:]), np.asarray(alone))
    upper = np.asarray(out.hidden_states[3][:, MAX_Q:])  # above k the question is seen
    assert np.abs(upper[1] - upper[0]).max() > 1e-3


def test_precomputed_first_upper_projections(xlnet_folder):
    """project_upper per segment (as PairGrid hoists it) gives the same logits."""
    model, params, _ = _model_and_state(xlnet_folder, 1)
    q_ids, q_mask, p_ids, p_mask = _segments(_pairs(13))
    q_lower = model.encode_lower(params, q_ids, q_mask, QUESTION_SEGMENT)
    p_lower = model.encode_lower(params, p_ids, p_mask, PASSAGE_SEGMENT)
    plain = model.encode_upper(params, q_lower, q_mask, p_lower, p_mask)
    hoisted = read_upper(model, params, q_lower, q_mask, p_lower, p_mask,
                         q_qkv=project_upper(model, params, q_lower),
                         p_qkv=project_upper(model, params, p_lower))
    np.testing.assert_allclose(np.asarray(hoisted.start_logits), np.asarray(plain.start_logits),
                               atol=1e-5)


@pytest.mark.parametrize("k", [0, 2])
def test_span_rows_only_equals_every_row(xlnet_folder, k):
    """The last block computing only [CLS] and the passage rows (PairGrid's inference reuse)
    gives the logits of the all-rows program, with and without hoisted q/k/v (k = 2 of 3: the
    hoisted block is the rows-only block). 1e-5: the same ops on fewer rows, float32."""
    model, params, _ = _model_and_state(xlnet_folder, k)
    q_ids, q_mask, p_ids, p_mask = _segments(_pairs(23))
    offset = q_mask.sum(axis=1) if k == 0 else None
    q_lower = model.encode_lower(params, q_ids, q_mask, QUESTION_SEGMENT)
    p_lower = model.encode_lower(params, p_ids, p_mask, PASSAGE_SEGMENT, offset)
    plain = model.encode_upper(params, q_lower, q_mask, p_lower, p_mask)
    variants = [{}]
    if k:
        variants.append({"q_qkv": project_upper(model, params, q_lower),
                         "p_qkv": project_upper(model, params, p_lower)})
    for given in variants:
        rows = read_upper(model, params, q_lower, q_mask, p_lower, p_mask, span_rows_only=True,
                          **given)
        for name in ("start_logits", "end_logits", "null_start_logits", "null_end_logits"):
            np.testing.assert_allclose(np.asarray(getattr(rows, name)),
                                       np.asarray(getattr(plain, name)), atol=1e-5,
                                       err_msg=f"{name} {sorted(given)}")


def test_export_loads_in_transformers(xlnet_folder, tmp_path):
    """export_hf_checkpoint writes a folder transformers loads, with the same logits."""
    import transformers

    from dil_jax.checkpoints import export_hf_checkpoint

    folder, hf_model = xlnet_folder()
    config, params, _ = load_hf_checkpoint(folder, ReaderOverrides(max_question_len=MAX_Q))
    exported = export_hf_checkpoint(tmp_path / "out", params, config)
    reloaded = transformers.XLNetForQuestionAnsweringSimple.from_pretrained(str(exported)).eval()
    pairs = _pairs(15)
    for (start, end, _), (again, again_end, _) in zip(_hf_batch(hf_model, pairs),
                                                       _hf_batch(reloaded, pairs)):
        np.testing.assert_allclose(again, start, atol=1e-6)
        np.testing.assert_allclose(again_end, end, atol=1e-6)
    config_again, params_again, _ = load_hf_checkpoint(exported)
    assert config_again == config
    jax.tree.map(np.testing.assert_array_equal, params_again, params)


@pytest.mark.parametrize("field,value,match", [
    ("attn_type", "uni", "attn_type 'uni'"),
    ("bi_data", True, "bi_data"),
    ("clamp_len", 8, "clamp_len 8"),
    ("architectures", ["XLNetForQuestionAnswering"], "XLNetForQuestionAnswering"),
])
def test_unsupported_config_fields_are_refused_by_name(xlnet_folder, tmp_path, field, value,
                                                       match):
    folder, _ = xlnet_folder()
    values = json.loads((folder / "config.json").read_text())
    values[field] = value
    with pytest.raises(CheckpointError, match=match):
        encoder_config_from_hf(values)


def test_beam_search_head_tensors_are_refused(xlnet_folder):
    _, hf_model = xlnet_folder()
    config = encoder_config_from_hf(hf_model.config.to_dict(),
                                    overrides=ReaderOverrides(max_question_len=MAX_Q))
    state = dict(state_dict_numpy(hf_model))
    state["start_logits.dense.weight"] = np.zeros((1, 32), np.float32)
    with pytest.raises(CheckpointError, match="start_logits.dense.weight.*beam-search"):
        convert_state_dict(state, config)


def test_transformer_prefix_is_stripped_for_xlnet_only():
    """`transformer.` is XLNet's backbone prefix, but also the start of a bare DistilBertModel's
    own tensor names: a DistilBERT reader built from bare DistilBertModel tensors must keep it
    (its name map starts with `transformer.layer.`), and an XLNet reader must strip it."""
    from dil_jax.checkpoints.hf_tensors import strip_backbone_prefix

    from tests.helpers.hf import build_hf_qa_model

    assert strip_backbone_prefix("transformer.layer.0.rel_attn.q", "xlnet") == "layer.0.rel_attn.q"
    assert strip_backbone_prefix("transformer.layer.0.ffn.lin1.weight", "distilbert") \
        == "transformer.layer.0.ffn.lin1.weight"
    assert strip_backbone_prefix("roberta.embeddings.x", "xlm-roberta") == "embeddings.x"
    bare = build_hf_qa_model("distilbert").distilbert  # DistilBertModel: `transformer.*` names
    config = encoder_config_from_hf(bare.config.to_dict(),
                                    overrides=ReaderOverrides(max_question_len=MAX_Q))
    _, report = convert_state_dict(state_dict_numpy(bare), config)
    assert any(name.startswith("transformer.layer.") for name in report.loaded)
    assert sorted(report.initialized) == ["qa_outputs.bias", "qa_outputs.weight"]


def test_memory_fields_change_nothing(xlnet_folder):
    """mem_len / reuse_len only say what to cache for a next call: accepted, same config."""
    _, hf_model = xlnet_folder()
    values = hf_model.config.to_dict()
    plain = encoder_config_from_hf(dict(values, mem_len=None, reuse_len=None))
    assert encoder_config_from_hf(dict(values, mem_len=512, reuse_len=64)) == plain


def test_unsupported_reuses_and_offsets_are_refused(xlnet_folder):
    model, params, _ = _model_and_state(xlnet_folder, 1)
    with pytest.raises(DilJaxError, match="passage_position_offset"):
        model.config.replace(passage_position_offset=3)
    with pytest.raises(DilJaxError, match="XLNet has no token-type embeddings"):
        model.config.replace(type_vocab_size=2)
    _, _, p_ids, p_mask = _segments(_pairs(17))
    p_lower = model.encode_lower(params, p_ids, p_mask, PASSAGE_SEGMENT)
    with pytest.raises(DilJaxError, match="p_stats.*xlnet"):
        passage_attention_stats(model, project_upper(model, params, p_lower), p_mask)


@pytest.mark.parametrize("k", [0, 1, 3])
@pytest.mark.parametrize("reuse", [True, False])
def test_pair_grid_equals_direct_pairs(xlnet_folder, k, reuse):
    """PairGrid on a 3 x 4 grid (every side read by >= 2 pairs: q/k/v hoisted at 0 < k < l)
    equals the model on each pair. float32 tolerance 1e-5: the same ops, in other batch shapes
    (and the hoisted projections computed outside the pair program)."""
    from dil_jax.reading.grid import PairGrid

    model, params, _ = _model_and_state(xlnet_folder, k)
    q_ids, q_mask, p_ids, p_mask = _segments(_pairs(19))
    q_ids, q_mask, p_ids, p_mask = q_ids[:3], q_mask[:3], p_ids, p_mask
    grid = PairGrid(model, batch_size=2, chunk_size=4, reuse=reuse)
    assert not grid.plan.passage_stats
    q_lower = grid.encode_questions(params, q_ids, q_mask)
    scores = grid.read_grid(params, q_lower, q_mask, grid.passage_side(params, p_ids, p_mask),
                            p_mask)
    qi, pi = (a.ravel() for a in np.meshgrid(np.arange(3), np.arange(4), indexing="ij"))
    direct = model(params, q_ids[qi], q_mask[qi], p_ids[pi], p_mask[pi])
    np.testing.assert_allclose(scores.start_logits.reshape(12, -1),
                               np.asarray(direct.start_logits), atol=1e-5)
    np.testing.assert_allclose(scores.null_end_logits.reshape(12),
                               np.asarray(direct.null_end_logits), atol=1e-5)
    if k == 1:
        from dil_jax.model.delayed import InputError
        from dil_jax.reading.pairs import kept_positions

        with pytest.raises(InputError, match="prescreening.*xlnet"):
            next(grid.iter_pair_chunks(params, q_lower, q_mask, grid.passage_side(
                params, p_ids, p_mask), p_mask, qi, pi, kept_positions(p_mask[pi] > 0)))


def test_train_step_with_kd_and_lrs_learns():
    """A tiny XLNet student (k = 1) with a frozen full teacher (k = 0), dropout on, CE + KD +
    LRS: every term is finite and positive and the loss falls on a fixed batch."""
    from dil_jax.model.encoder_config import EncoderConfig

    config = EncoderConfig(architecture="xlnet", vocab_size=128, hidden_size=32, num_layers=2,
                           num_heads=2, intermediate_size=64, embedding_size=32,
                           type_vocab_size=0, max_question_len=8, num_lower_layers=1,
                           hidden_dropout=0.1, attention_dropout=0.1)
    student = DelayedInteractionModel(config)
    teacher = DelayedInteractionModel(config.replace(num_lower_layers=0))
    params = student.init(jax.random.key(0))
    steps = distill_steps(student, teacher, params, 25, vocab_size=128)
    losses = [row["ce"] for row in steps]
    for row in steps:
        for term in ("kd", "lrs"):
            assert np.isfinite(row[term]) and row[term] >= 0
    assert steps[-1]["kd"] > 0 and steps[-1]["lrs"] > 0
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("k", [0, 1])
def test_bench_flop_formulas_match_xla_for_xlnet(k):
    """The analytical FLOPs of each phase (bench.flops, with XLNet's position terms and its
    pair program's rows-only last block) are within 2% of XLA's count of the compiled programs, as
    tests/bench/test_bench.py requires of BERT; leaving the position terms out is far outside."""
    from dil_jax import bench
    from dil_jax.mesh import data_mesh
    from dil_jax.model.encoder_config import EncoderConfig
    from dil_jax.reading.grid import PairGrid

    # The "tiny" bench suite's shape: at this width the elementwise work XLA also counts
    # (softmax, LayerNorm, bias adds) stays under 2% of the matmuls, as for BERT there.
    config = EncoderConfig(architecture="xlnet", vocab_size=1000, hidden_size=384, num_layers=3,
                           num_heads=6, intermediate_size=1536, embedding_size=384,
                           type_vocab_size=0, max_question_len=16, num_lower_layers=k)
    model = DelayedInteractionModel(config)
    params = model.init(jax.random.key(0))
    reader = PairGrid(model, data_mesh(jax.devices()[:1]), batch_size=2, chunk_size=2)
    for phase in ("ni_q", "pairs") if k else ("pairs",):
        flops = bench.program_stats(bench.lower_phase(reader, params, phase, 2, 2, 16, 48)).flops
        right = bench.phase_flops(config, phase, 2, 16, 48)
        assert abs(flops / right - 1) <= 0.02, (phase, flops / right)
        bert_formula = bench.phase_flops(config.replace(architecture="bert", type_vocab_size=2),
                                         phase, 2, 16, 48)
        assert abs(flops / bert_formula - 1) > 0.06, (phase, flops / bert_formula)


def test_bfloat16_compute_stays_close_to_float32(xlnet_folder):
    """dtype "bfloat16": params stay float32, scores and softmax run in float32, and the logits
    stay within bfloat16's reach of float32's. Bound: bfloat16 keeps 8 significant bits
    (relative 2^-8 = 0.4%) per op; through 3 blocks of O(1) LayerNorm outputs and a head of 32
    O(0.3)-weighted terms the logits (O(1)) move by a few 1e-2, so 0.25 catches a wrong cast
    (e.g. a float32-only table broadcast into the wrong dtype gives garbage, not a 1% shift)."""
    model, params, _ = _model_and_state(xlnet_folder, 1)
    segments = _segments(_pairs(21))
    full = model(params, *segments)
    half = DelayedInteractionModel(model.config.replace(dtype="bfloat16"))(params, *segments)
    assert half.start_logits.dtype == np.float32
    p_mask = segments[3] > 0
    diff = np.abs(np.asarray(half.start_logits) - np.asarray(full.start_logits))[p_mask]
    assert diff.max() < 0.25, diff.max()
