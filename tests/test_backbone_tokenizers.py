"""Tokenizers of issue 16's backbones: byte-level BPE (RoBERTa), SentencePiece Unigram
(XLM-RoBERTa) and WordPiece (ELECTRA), through `transformers` fast tokenizers with offsets.

No tokenizer can be downloaded here, so each is trained locally with the `tokenizers` library on
the shared SQuAD v1.1 contexts (every 6th paragraph, 202 of 1,211, and a 1,000-token vocabulary:
Unigram training grows with the text, ~3 s on this subset against ~19 s on all of it; a smaller
vocabulary only cuts words into more pieces, which the round trip must survive anyway), wrapped
as the architecture's fast tokenizer class, saved as a Hugging Face folder and read back with
`load_tokenizer`, the path a user's checkpoint takes. Then:

- the SQuAD round trip over the WHOLE shared v1.1 file (6,013 questions, most of them on
  paragraphs the tokenizer never saw): gold labels -> token spans -> logits -> decoded answers
  through the character offsets, EM >= 99.5 against gold (as tests/data/test_squad_features.py does
  for BERT's WordPiece);
- the two segments `encode_questions` / `encode_passages` build are exactly the tokenizer's own
  pair (`<s> q </s></s> p </s>` for RoBERTa and XLM-R), and the full reader (k = 0) on them
  matches the Hugging Face model on that pair (tests.helpers.hf.assert_parity, 1e-4).
"""

from __future__ import annotations

import pytest

from dil_jax.checkpoints import convert_state_dict, encoder_config_from_hf
from dil_jax.data.decoding import answers, decode_predictions
from dil_jax.data.features import featurize
from dil_jax.metrics.squad_metric import squad_scores
from dil_jax.model.delayed import DelayedInteractionModel
from dil_jax.model.encoder_config import ReaderOverrides
from dil_jax.tokenization import encode_passages, encode_questions, load_tokenizer, pair_layout

from tests.helpers.hf import assert_parity, build_hf_qa_model, save_fast_tokenizer, state_dict_numpy
from tests.helpers.squad import P_LEN, Q_LEN, STRIDE, explain_failures, gold_logits

VOCAB = 1000
TRAIN_EVERY = 6  # every 6th distinct context trains the tokenizer


@pytest.fixture(scope="module", params=["roberta", "xlm-roberta", "electra"])
def arch_tokenizer(request, v11, tmp_path_factory):
    contexts = sorted({example.context for example in v11.examples})
    folder = tmp_path_factory.mktemp(f"tokenizer-{request.param}")
    save_fast_tokenizer(request.param, contexts[::TRAIN_EVERY], VOCAB, folder)
    return request.param, load_tokenizer(folder, vocab_size=VOCAB)


def test_squad_round_trip_through_offsets(arch_tokenizer, v11):
    arch, tokenizer = arch_tokenizer
    features = featurize(v11.examples, tokenizer, max_question_len=Q_LEN,
                         max_passage_len=P_LEN, doc_stride=STRIDE)
    layout = pair_layout(tokenizer)
    assert (features.q_ids[:, 0] == layout.first).all()
    start, end = gold_logits(features)
    predicted = answers(decode_predictions(v11.examples, features, start, end,
                                           max_answer_length=64))
    scores = squad_scores(v11.gold_answers, predicted, v11.version)
    print(f"\n{arch} round trip: {scores}")
    print(f"  failures by reason: {dict(explain_failures(v11.examples, features, predicted))}")
    assert scores["exact"] >= 99.5 and scores["total"] == 6013


def test_segments_are_the_tokenizers_pair_and_the_full_reader_matches_hf(arch_tokenizer, v11):
    arch, tokenizer = arch_tokenizer
    examples = [e for e in v11.examples if len(e.question) < 100][::1500][:4]
    questions = [example.question for example in examples]
    passages = [example.context[:300] for example in examples]
    q = encode_questions(tokenizer, questions, 64)
    p = encode_passages(tokenizer, passages, 184)
    assert not q.truncated and not p.truncated
    pairs = [(list(q.ids[i, :q.mask[i].sum()]), list(p.ids[i, :p.mask[i].sum()]))
             for i in range(len(examples))]
    for (q_ids, p_ids), question, passage in zip(pairs, questions, passages):
        assert q_ids + p_ids == tokenizer(question, passage)["input_ids"]
    expected_question_end = {"roberta": ["</s>", "</s>"], "xlm-roberta": ["</s>", "</s>"],
                             "electra": ["[SEP]"]}[arch]
    assert tokenizer.convert_ids_to_tokens(pair_layout(tokenizer).question_end) == \
        expected_question_end
    first_position = 2 if arch in ("roberta", "xlm-roberta") else 0  # padding_idx + 1
    hf_model = build_hf_qa_model(arch, vocab_size=VOCAB,
                                 max_position_embeddings=248 + first_position)
    config = encoder_config_from_hf(hf_model.config.to_dict(),
                                    overrides=ReaderOverrides(max_question_len=64))
    params, _ = convert_state_dict(state_dict_numpy(hf_model), config)
    assert_parity(DelayedInteractionModel(config), params, hf_model, arch, pairs, max_q=64)


def test_pair_layout_is_refused_when_it_does_not_fit():
    """A tokenizer with no pair template (no special tokens) is refused by name."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    from dil_jax.tokenization import TokenizationError

    vocab = {"[UNK]": 0, "[SEP]": 1, "[CLS]": 2, "[PAD]": 3, "a": 4, "b": 5}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    bare = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, sep_token="[SEP]",
                                                cls_token="[CLS]", pad_token="[PAD]",
                                                unk_token="[UNK]")
    with pytest.raises(TokenizationError, match="unsupported pair layout"):
        pair_layout(bare)
    # Loading checks it up front, naming the tokenizer's source.
    from dil_jax.tokenization import check_tokenizer

    with pytest.raises(TokenizationError, match="my-folder: unsupported pair layout"):
        check_tokenizer(bare, 6, "my-folder")
