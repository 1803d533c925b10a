"""Parity of the full model (k = 0) with Hugging Face PyTorch question-answering models.

The reference is `transformers`' own `*ForQuestionAnswering` in float32 on CPU, fed the standard
input `[CLS] q [SEP] p [SEP]`. Our reader gets the same tokens as two segments (question padded to
max_question_len, passage padded) and must give the same start/end logits on every passage token,
the same [CLS] (null) logits, and the same hidden state at every layer, within 1e-4.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dil_jax.checkpoints import convert_state_dict, load_hf_checkpoint
from dil_jax.model.delayed import DelayedInteractionModel

from conftest import hf_token_types, pair_specials, state_dict_numpy

TOLERANCE = 1e-4
MAX_Q = 12


def _random_pairs(vocab: int, seed: int, q_lens=(3, 7, 10), p_lens=(9, 20, 14),
                  arch: str = "bert"):
    """Token ids of (question, passage) pairs in `arch`'s tokenizer layout: `[CLS] q [SEP]` and
    `p [SEP]` (CLS=2, SEP=3), or RoBERTa's `<s> q </s></s>` and `p </s>` (0, 2); q_lens count
    the words and the first two special tokens."""
    first, question_end, passage_end = pair_specials(arch)
    rng = np.random.default_rng(seed)
    pairs = []
    for q_len, p_len in zip(q_lens, p_lens):
        q = [first, *rng.integers(5, vocab, q_len - 2), *question_end]
        p = [*rng.integers(5, vocab, p_len - 1), passage_end]
        pairs.append((q, p))
    return pairs


def _pad(rows, length):
    ids = np.zeros((len(rows), length), np.int32)
    mask = np.zeros((len(rows), length), np.int32)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
        mask[i, :len(row)] = 1
    return ids, mask


def _hf_forward(hf_model, q, p, arch):
    ids = torch.tensor([q + p])
    kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True)
    token_types = hf_token_types(arch, len(q), len(p))
    if token_types is not None:
        kwargs["token_type_ids"] = torch.tensor([token_types])
    with torch.no_grad():
        out = hf_model(**kwargs)
    return (out.start_logits[0].numpy(), out.end_logits[0].numpy(),
            [h[0].numpy() for h in out.hidden_states])


def assert_parity(model, params, hf_model, arch, pairs, max_q=MAX_Q):
    q_ids, q_mask = _pad([q for q, _ in pairs], max_q)
    p_len = max(len(p) for _, p in pairs)
    p_ids, p_mask = _pad([p for _, p in pairs], p_len)
    ours = model(params, q_ids, q_mask, p_ids, p_mask, output_hidden_states=True)
    assert len(ours.hidden_states) == model.config.num_layers + 1
    for row, (q, p) in enumerate(pairs):
        start, end, hidden = _hf_forward(hf_model, q, p, arch)
        nq, npass = len(q), len(p)
        np.testing.assert_allclose(np.asarray(ours.start_logits[row, :npass]), start[nq:],
                                   atol=TOLERANCE, rtol=0)
        np.testing.assert_allclose(np.asarray(ours.end_logits[row, :npass]), end[nq:],
                                   atol=TOLERANCE, rtol=0)
        np.testing.assert_allclose(float(ours.null_start_logits[row]), start[0], atol=TOLERANCE)
        np.testing.assert_allclose(float(ours.null_end_logits[row]), end[0], atol=TOLERANCE)
        assert np.all(np.asarray(ours.start_logits[row, npass:]) < -1e8), "padding not masked"
        for layer, (mine, theirs) in enumerate(zip(ours.hidden_states, hidden)):
            mine = np.asarray(mine[row])
            real = np.concatenate([mine[:nq], mine[max_q:max_q + npass]])
            err = np.abs(real - theirs).max()
            assert err < TOLERANCE, f"{arch} layer {layer}: max abs error {err}"


@pytest.mark.parametrize("arch,overrides", [
    ("bert", {}),
    ("albert", {}),
    ("albert", {"num_hidden_groups": 2}),
    ("distilbert", {}),
    ("bert", {"hidden_act": "relu"}),
    # Issue 16's backbones, every tensor perturbed (conftest.build_hf_qa_model). RoBERTa and
    # XLM-RoBERTa: positions from padding_idx + 1 = 2, one token type, `<s> q </s></s> p </s>`;
    # ELECTRA with embedding 16 < hidden 32 (embeddings_project) and 32 == 32 (none).
    ("roberta", {}),
    ("xlm-roberta", {}),
    ("electra", {}),
    ("electra", {"embedding_size": 32}),
])
def test_random_init_parity(hf_folder_factory, arch, overrides):
    folder, hf_model = hf_folder_factory(arch, **overrides)
    config, params, report = load_hf_checkpoint(folder, max_question_len=MAX_Q)
    assert config.architecture == arch
    assert not report.initialized, "a *ForQuestionAnswering checkpoint carries its QA head"
    model = DelayedInteractionModel(config)
    assert_parity(model, params, hf_model, arch, _random_pairs(99, seed=1, arch=arch))


def test_roberta_positions_are_hugging_faces(hf_folder_factory):
    """Guards the RoBERTa parity above: numbering positions from 0 (BERT's rule) instead of
    padding_idx + 1 moves the logits far past the tolerance, so parity does pin the offset; and
    the pad id of the checkpoint is what sets the first position."""
    folder, hf_model = hf_folder_factory("roberta")
    config, params, _ = load_hf_checkpoint(folder, max_question_len=MAX_Q)
    assert (config.pad_token_id, config.first_position, config.num_positions) == (1, 2, 64)
    pairs = _random_pairs(99, seed=4, arch="roberta")
    q, p = pairs[0]
    start, _, _ = _hf_forward(hf_model, q, p, "roberta")
    shifted = {**params, "embeddings": {**params["embeddings"], "position_embeddings": {
        "embedding": np.roll(params["embeddings"]["position_embeddings"]["embedding"], 2, 0)}}}
    q_ids, q_mask = _pad([q], MAX_Q)
    p_ids, p_mask = _pad([p], len(p))
    wrong = DelayedInteractionModel(config)(shifted, q_ids, q_mask, p_ids, p_mask)
    assert np.abs(np.asarray(wrong.start_logits[0, :len(p)]) - start[len(q):]).max() > 1e-2


def test_minilm_parity(minilm_dir):
    """The embedded real checkpoint, with a seeded QA head shared by both sides."""
    from transformers import BertForQuestionAnswering

    from dil_jax.tokenization import encode_passages, encode_questions, load_tokenizer

    torch.manual_seed(0)
    hf_model = BertForQuestionAnswering.from_pretrained(str(minilm_dir)).eval()
    config, params_from_folder, report = load_hf_checkpoint(minilm_dir, max_question_len=24)
    assert report.initialized == ["qa_outputs.weight", "qa_outputs.bias"]
    assert "pooler.dense.weight" in report.ignored
    # Same backbone, and the QA head taken from the torch model so both sides share it.
    params, _ = convert_state_dict(state_dict_numpy(hf_model), config)
    np.testing.assert_array_equal(
        params["block_3"]["ffn_in"]["kernel"], params_from_folder["block_3"]["ffn_in"]["kernel"])

    tokenizer = load_tokenizer(minilm_dir)
    questions = ["Which NFL team represented the AFC at Super Bowl 50?",
                 "Where did the Normans settle?"]
    passages = ["The American Football Conference (AFC) champion Denver Broncos defeated the "
                "National Football Conference (NFC) champion Carolina Panthers 24-10.",
                "The Normans were the people who in the 10th and 11th centuries gave their name "
                "to Normandy, a region in France."]
    q = encode_questions(tokenizer, questions, 24)
    p = encode_passages(tokenizer, passages, 64)
    pairs = [(list(q.ids[i, :q.mask[i].sum()]), list(p.ids[i, :p.mask[i].sum()]))
             for i in range(2)]
    # The segments are exactly what the HF tokenizer builds for a pair.
    for i, (question, passage) in enumerate(zip(questions, passages)):
        assert pairs[i][0] + pairs[i][1] == tokenizer(question, passage)["input_ids"]
    assert_parity(DelayedInteractionModel(config), params, hf_model, "bert", pairs, max_q=24)
