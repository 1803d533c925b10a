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
from dil_jax.model.encoder_config import ReaderOverrides

from tests.helpers.hf import PARITY_MAX_Q as MAX_Q
from tests.helpers.hf import assert_parity, hf_forward, pad_rows, random_pairs, state_dict_numpy


@pytest.mark.parametrize("arch,overrides", [
    ("bert", {}),
    ("albert", {}),
    ("albert", {"num_hidden_groups": 2}),
    ("distilbert", {}),
    ("bert", {"hidden_act": "relu"}),
    # Issue 16's backbones, every tensor perturbed (tests.helpers.hf.build_hf_qa_model). RoBERTa and
    # XLM-RoBERTa: positions from padding_idx + 1 = 2, one token type, `<s> q </s></s> p </s>`;
    # ELECTRA with embedding 16 < hidden 32 (embeddings_project) and 32 == 32 (none).
    ("roberta", {}),
    ("xlm-roberta", {}),
    ("electra", {}),
    ("electra", {"embedding_size": 32}),
])
def test_random_init_parity(hf_folder_factory, arch, overrides):
    folder, hf_model = hf_folder_factory(arch, **overrides)
    config, params, report = load_hf_checkpoint(folder, ReaderOverrides(max_question_len=MAX_Q))
    assert config.architecture == arch
    assert not report.initialized, "a *ForQuestionAnswering checkpoint carries its QA head"
    model = DelayedInteractionModel(config)
    assert_parity(model, params, hf_model, arch, random_pairs(99, seed=1, arch=arch))


def test_roberta_positions_are_hugging_faces(hf_folder_factory):
    """Guards the RoBERTa parity above: numbering positions from 0 (BERT's rule) instead of
    padding_idx + 1 moves the logits far past the tolerance, so parity does pin the offset; and
    the pad id of the checkpoint is what sets the first position."""
    folder, hf_model = hf_folder_factory("roberta")
    config, params, _ = load_hf_checkpoint(folder, ReaderOverrides(max_question_len=MAX_Q))
    assert (config.pad_token_id, config.first_position, config.num_positions) == (1, 2, 64)
    pairs = random_pairs(99, seed=4, arch="roberta")
    q, p = pairs[0]
    start, _, _ = hf_forward(hf_model, q, p, "roberta")
    shifted = {**params, "embeddings": {**params["embeddings"], "position_embeddings": {
        "embedding": np.roll(params["embeddings"]["position_embeddings"]["embedding"], 2, 0)}}}
    q_ids, q_mask = pad_rows([q], MAX_Q)
    p_ids, p_mask = pad_rows([p], len(p))
    wrong = DelayedInteractionModel(config)(shifted, q_ids, q_mask, p_ids, p_mask)
    assert np.abs(np.asarray(wrong.start_logits[0, :len(p)]) - start[len(q):]).max() > 1e-2


def test_minilm_parity(minilm_dir):
    """The embedded real checkpoint, with a seeded QA head shared by both sides."""
    from transformers import BertForQuestionAnswering

    from dil_jax.tokenization import encode_passages, encode_questions, load_tokenizer

    torch.manual_seed(0)
    hf_model = BertForQuestionAnswering.from_pretrained(str(minilm_dir)).eval()
    config, params_from_folder, report = load_hf_checkpoint(minilm_dir,
                                                            ReaderOverrides(max_question_len=24))
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
