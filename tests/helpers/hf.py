"""Tiny Hugging Face checkpoints and tokenizers, built locally (no download), and the
comparisons the model tests make against them.

Random-init checkpoints are built with `transformers` and saved as real Hugging Face folders
(conftest's `hf_folder_factory`), so tests exercise the same import path a user's checkpoint
takes. Beside them: parity with the PyTorch model (`assert_parity` on `random_pairs`), padded
segments in each family's layout (`padded_segments`, what the delayed split is checked on
against `numpy_reference.pair_reference`), and XLNet's random reader and pair order.
"""

from __future__ import annotations

import numpy as np


def tiny_hf_config(arch: str, **overrides):
    """The transformers config of a tiny `arch` model (hidden 32, 4 layers, vocabulary 99, 64
    positions, no dropout), with `overrides`."""
    import transformers

    # initializer_range 0.2 (not 0.02): with BERT's tiny default init a 32-wide model is nearly
    # linear and attention nearly uniform, so a wrong mask or split would hide under 1e-4.
    common = dict(vocab_size=99, max_position_embeddings=64, hidden_dropout_prob=0.0,
                  attention_probs_dropout_prob=0.0, initializer_range=0.2)
    if arch == "bert":
        values = dict(common, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                      intermediate_size=37)
        values.update(overrides)
        return transformers.BertConfig(**values)
    if arch == "albert":
        values = dict(common, embedding_size=16, hidden_size=32, num_hidden_layers=4,
                      num_attention_heads=4, intermediate_size=37)
        values.update(overrides)
        return transformers.AlbertConfig(**values)
    if arch in ("roberta", "xlm-roberta"):
        # type_vocab_size 1 and pad_token_id 1 as the released checkpoints; positions start at
        # pad_token_id + 1 = 2, so 66 rows leave 64 positions, as the other tiny configs have.
        values = dict(common, max_position_embeddings=66, hidden_size=32, num_hidden_layers=4,
                      num_attention_heads=4, intermediate_size=37, type_vocab_size=1,
                      pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)
        values.update(overrides)
        config_class = (transformers.RobertaConfig if arch == "roberta"
                        else transformers.XLMRobertaConfig)
        return config_class(**values)
    if arch == "electra":
        # embedding_size 16 < hidden 32 by default (ELECTRA-small's factorisation, 128 -> 256);
        # pass embedding_size=32 for the unfactorised form (no embeddings_project).
        values = dict(common, embedding_size=16, hidden_size=32, num_hidden_layers=4,
                      num_attention_heads=4, intermediate_size=37)
        values.update(overrides)
        return transformers.ElectraConfig(**values)
    if arch == "distilbert":
        values = dict(vocab_size=99, max_position_embeddings=64, dim=32, n_layers=4, n_heads=4,
                      hidden_dim=37, dropout=0.0, attention_dropout=0.0,
                      initializer_range=0.2)
        values.update(overrides)
        return transformers.DistilBertConfig(**values)
    raise ValueError(arch)


# Special-token ids of the tiny configs' pair layout, as each family's tokenizer builds it:
# (first token, tokens closing the question, token closing the passage). BERT-like:
# `[CLS] q [SEP]` + `p [SEP]`; RoBERTa-like: `<s> q </s></s>` + `p </s>` (<s> 0, </s> 2, the
# ids of RobertaTokenizer's vocabulary, <pad> 1 = pad_token_id).
BERT_PAIR_SPECIALS = (2, (3,), 3)
PAIR_SPECIALS = {"roberta": (0, (2, 2), 2), "xlm-roberta": (0, (2, 2), 2)}


def pair_specials(arch: str) -> tuple[int, tuple[int, ...], int]:
    """(first token, tokens closing the question, token closing the passage) of `arch`."""
    return PAIR_SPECIALS.get(arch, BERT_PAIR_SPECIALS)


def hf_token_types(arch: str, question_len: int, passage_len: int):
    """The token_type_ids Hugging Face's tokenizer gives a pair, or None where the model takes
    none (DistilBERT) or they are all 0 (RoBERTa's tokenizers: left to the model's zeros)."""
    if arch in ("distilbert", "roberta", "xlm-roberta"):
        return None
    return [0] * question_len + [1] * passage_len


def build_hf_qa_model(arch: str, seed: int = 0, **overrides):
    """A random-init `*ForQuestionAnswering` torch model in eval mode."""
    import torch
    import transformers

    classes = {"bert": transformers.BertForQuestionAnswering,
               "albert": transformers.AlbertForQuestionAnswering,
               "distilbert": transformers.DistilBertForQuestionAnswering,
               "roberta": transformers.RobertaForQuestionAnswering,
               "xlm-roberta": transformers.XLMRobertaForQuestionAnswering,
               "electra": transformers.ElectraForQuestionAnswering}
    torch.manual_seed(seed)
    model = classes[arch](tiny_hf_config(arch, **overrides)).eval()
    # Default init leaves LayerNorm at scale 1 / bias 0 and every Linear bias at 0; perturb so
    # a mapping mix-up can't hide. The backbones added with issue 16 perturb EVERY tensor
    # (biases, the padding row of the embeddings, the type table included).
    perturb_all = arch in ("roberta", "xlm-roberta", "electra")
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if perturb_all or "LayerNorm" in name or "layer_norm" in name:
                tensor.add_(0.1 * torch.randn_like(tensor))
    return model


def train_tokenizer(arch: str, texts: list[str], vocab_size: int):
    """A `tokenizers.Tokenizer` of the family `arch` belongs to, trained on `texts`, with the
    pair template of that family's released tokenizers."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    if arch == "roberta":  # GPT-2 byte-level BPE, as roberta-base's tokenizer.json
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                      show_progress=False)
        tokenizer.train_from_iterator(texts, trainer)
        tokenizer.post_processor = processors.RobertaProcessing(
            ("</s>", 2), ("<s>", 0), trim_offsets=True, add_prefix_space=False)
        return tokenizer
    if arch == "xlm-roberta":  # SentencePiece Unigram with the metaspace, as xlm-roberta-base's
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials,
                                          unk_token="<unk>", show_progress=False)
        tokenizer.train_from_iterator(texts, trainer)
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", 0), ("</s>", 2)])
        return tokenizer
    # ELECTRA: BERT's uncased WordPiece
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials,
                                        show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tokenizer


def save_fast_tokenizer(arch: str, texts: list[str], vocab_size: int, folder) -> None:
    """`train_tokenizer` wrapped as the architecture's transformers fast class, saved to
    `folder` as a Hugging Face tokenizer (tokenizer.json, tokenizer_config.json)."""
    import transformers

    classes = {"roberta": transformers.RobertaTokenizerFast,
               "xlm-roberta": transformers.XLMRobertaTokenizerFast,
               "electra": transformers.ElectraTokenizerFast}
    wrapped = classes[arch](tokenizer_object=train_tokenizer(arch, texts, vocab_size))
    wrapped.save_pretrained(str(folder))


def state_dict_numpy(model) -> dict[str, np.ndarray]:
    """A torch model's state dict as numpy arrays (copies)."""
    return {name: tensor.detach().numpy().copy() for name, tensor in model.state_dict().items()}



# --------------------------------------------------------------------- parity with the HF model

PARITY_TOLERANCE = 1e-4
PARITY_MAX_Q = 12  # the question segment's padded length in the parity tests


def random_pairs(vocab: int, seed: int, q_lens=(3, 7, 10), p_lens=(9, 20, 14),
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


def pad_rows(rows, length):
    """(ids, mask) [len(rows), length] of rows of token ids, padded with 0."""
    ids = np.zeros((len(rows), length), np.int32)
    mask = np.zeros((len(rows), length), np.int32)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
        mask[i, :len(row)] = 1
    return ids, mask


def hf_forward(hf_model, q, p, arch):
    """(start logits, end logits, hidden states) of the HF model on the unpadded pair q + p."""
    import torch

    ids = torch.tensor([q + p])
    kwargs = dict(input_ids=ids, attention_mask=torch.ones_like(ids), output_hidden_states=True)
    token_types = hf_token_types(arch, len(q), len(p))
    if token_types is not None:
        kwargs["token_type_ids"] = torch.tensor([token_types])
    with torch.no_grad():
        out = hf_model(**kwargs)
    return (out.start_logits[0].numpy(), out.end_logits[0].numpy(),
            [h[0].numpy() for h in out.hidden_states])


def assert_parity(model, params, hf_model, arch, pairs, max_q=PARITY_MAX_Q):
    """Our reader on the pairs as two padded segments gives the HF model's start/end logits on
    every passage token, its [CLS] (null) logits and its hidden state at every layer on every
    real token, within PARITY_TOLERANCE; padding is masked."""
    q_ids, q_mask = pad_rows([q for q, _ in pairs], max_q)
    p_len = max(len(p) for _, p in pairs)
    p_ids, p_mask = pad_rows([p for _, p in pairs], p_len)
    ours = model(params, q_ids, q_mask, p_ids, p_mask, output_hidden_states=True)
    assert len(ours.hidden_states) == model.config.num_layers + 1
    for row, (q, p) in enumerate(pairs):
        start, end, hidden = hf_forward(hf_model, q, p, arch)
        nq, npass = len(q), len(p)
        np.testing.assert_allclose(np.asarray(ours.start_logits[row, :npass]), start[nq:],
                                   atol=PARITY_TOLERANCE, rtol=0)
        np.testing.assert_allclose(np.asarray(ours.end_logits[row, :npass]), end[nq:],
                                   atol=PARITY_TOLERANCE, rtol=0)
        np.testing.assert_allclose(float(ours.null_start_logits[row]), start[0],
                                   atol=PARITY_TOLERANCE)
        np.testing.assert_allclose(float(ours.null_end_logits[row]), end[0],
                                   atol=PARITY_TOLERANCE)
        assert np.all(np.asarray(ours.start_logits[row, npass:]) < -1e8), "padding not masked"
        for layer, (mine, theirs) in enumerate(zip(ours.hidden_states, hidden)):
            mine = np.asarray(mine[row])
            real = np.concatenate([mine[:nq], mine[max_q:max_q + npass]])
            err = np.abs(real - theirs).max()
            assert err < PARITY_TOLERANCE, f"{arch} layer {layer}: max abs error {err}"


# ------------------------------------------------ segments of the delayed split's reference tests

SEGMENTS_MAX_Q = 10  # the question segment's padded length of `padded_segments`


def padded_segments(seed: int, q_lens=(4, 10, 6), p_lens=(12, 7, 15), vocab=99, arch="bert"):
    """Padded question and passage segments in `arch`'s layout (`pair_specials`), the question
    padded to SEGMENTS_MAX_Q, padded with the architecture's pad id (RoBERTa: 1); masks from the
    lengths."""
    first, question_end, passage_end = pair_specials(arch)
    pad = 1 if arch in ("roberta", "xlm-roberta") else 0
    rng = np.random.default_rng(seed)
    p_len = max(p_lens)
    q_ids = np.full((len(q_lens), SEGMENTS_MAX_Q), pad, np.int32)
    p_ids = np.full((len(p_lens), p_len), pad, np.int32)
    for i, (nq, npass) in enumerate(zip(q_lens, p_lens)):
        words = nq - 1 - len(question_end)
        q_ids[i, :nq] = [first, *rng.integers(5, vocab, words), *question_end]
        p_ids[i, :npass] = [*rng.integers(5, vocab, npass - 1), passage_end]
    q_mask = (np.arange(SEGMENTS_MAX_Q)[None] < np.array(q_lens)[:, None]).astype(np.int32)
    p_mask = (np.arange(p_len)[None] < np.array(p_lens)[:, None]).astype(np.int32)
    return q_ids, q_mask, p_ids, p_mask


# ----------------------------------------------------------------------------------- XLNet

XLNET_MAX_Q = 11  # the question segment's padded length in the XLNet tests


def build_xlnet(seed: int = 0, **overrides):
    """A random-init XLNetForQuestionAnsweringSimple with EVERY tensor perturbed.

    transformers initialises LayerNorms to 1 / 0 and Linear biases to 0, and the relative
    attention biases to N(0, initializer_range): adding N(0, 0.1) to every tensor makes a
    mis-mapped or dropped tensor (a bias included) show in the outputs.
    """
    import torch
    import transformers

    values = dict(vocab_size=99, d_model=32, n_layer=3, n_head=4, d_inner=37, dropout=0.0,
                  initializer_range=0.2, mem_len=None)
    values.update(overrides)
    torch.manual_seed(seed)
    model = transformers.XLNetForQuestionAnsweringSimple(transformers.XLNetConfig(**values))
    with torch.no_grad():
        for tensor in model.parameters():
            tensor.add_(0.1 * torch.randn_like(tensor))
    return model.eval()


def xlnet_order(q, p):
    """Our segments -> XLNet's `P [SEP] Q [SEP] [CLS]` ids and segment ids, and for each XLNet
    index the row of our concatenated [question (XLNET_MAX_Q rows) ; passage] it is."""
    ids = p + q[1:] + q[:1]
    segments = [0] * len(p) + [1] * (len(q) - 1) + [2]
    rows = ([XLNET_MAX_Q + t for t in range(len(p))] + list(range(1, len(q))) + [0])
    return ids, segments, rows
