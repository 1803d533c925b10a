"""XLNet through the pipeline: its SentencePiece tokenizer (pair layout, SQuAD offsets round
trip), `check`, `predict` and the open-domain reader over a cached index.

The tokenizer is trained here (no download): a Unigram vocabulary learned with `tokenizers` on
the shared SQuAD v1.1 text, with XLNet's special tokens at XLNet's ids, wrapped in transformers'
own `XLNetTokenizer` (its normalizer, Metaspace pre-tokenizer, `A <sep> B <sep> <cls>`
post-processor, left padding) and saved as a folder that `load_tokenizer` reads.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from dil_jax.data.decoding import answers, decode_predictions
from dil_jax.data.features import featurize
from dil_jax.metrics.squad_metric import squad_scores
from dil_jax.tokenization import encode_passages, encode_questions, load_tokenizer

from tests.helpers import V11, squad_file

# XLNet's special tokens, in the order that gives them xlnet-base-cased's ids (<cls> 3, <sep> 4,
# <pad> 5).
XLNET_SPECIALS = ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>"]
VOCAB_SIZE = 4000


@pytest.fixture(scope="module")
def xlnet_tokenizer(v11, tmp_path_factory):
    from tokenizers import Tokenizer, models, trainers
    from transformers import XLNetTokenizer

    # XLNetTokenizer's own normalizer and pre-tokenizer, so the pieces are learned as it splits.
    shell = XLNetTokenizer()
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = shell.backend_tokenizer.normalizer
    tokenizer.pre_tokenizer = shell.backend_tokenizer.pre_tokenizer
    trainer = trainers.UnigramTrainer(vocab_size=VOCAB_SIZE, special_tokens=XLNET_SPECIALS,
                                      unk_token="<unk>", show_progress=False)
    texts = sorted({example.context for example in v11.examples})
    texts += [example.question for example in v11.examples]
    tokenizer.train_from_iterator(texts, trainer)
    vocab = [tuple(piece) for piece in json.loads(tokenizer.to_str())["model"]["vocab"]]
    assert [piece for piece, _ in vocab[:len(XLNET_SPECIALS)]] == XLNET_SPECIALS
    folder = tmp_path_factory.mktemp("xlnet-tokenizer")
    XLNetTokenizer(vocab=vocab).save_pretrained(str(folder))
    loaded = load_tokenizer(folder, vocab_size=len(vocab))
    assert type(loaded).__name__ == "XLNetTokenizer" and loaded.padding_side == "left"
    return loaded


def test_special_ids_are_xlnets(xlnet_tokenizer):
    assert (xlnet_tokenizer.cls_token_id, xlnet_tokenizer.sep_token_id,
            xlnet_tokenizer.pad_token_id) == (3, 4, 5)


def test_pair_layout_is_read_as_xlnets_and_refused_for_other_readers(xlnet_tokenizer):
    """XLNet's `a <sep> b <sep> <cls>` has nothing before the first text, which the layout rule
    refuses for every other tokenizer: it is read explicitly (`<cls>` stored first, placed last
    by the XLNet reader) and refused by name when the reader is not XLNet."""
    from dil_jax.tokenization import PairLayout, TokenizationError, check_tokenizer, pair_layout

    assert xlnet_tokenizer.convert_ids_to_tokens(xlnet_tokenizer("a", "b")["input_ids"])[-2:] \
        == ["<sep>", "<cls>"]
    assert pair_layout(xlnet_tokenizer) == PairLayout(3, (4,), 4, cls_last=True)
    check_tokenizer(xlnet_tokenizer, VOCAB_SIZE, "my-folder", architecture="xlnet")
    with pytest.raises(TokenizationError, match="my-folder: .*XLNet's pair layout.*'bert'"):
        check_tokenizer(xlnet_tokenizer, VOCAB_SIZE, "my-folder", architecture="bert")


def test_tokenizer_pair_layout_is_the_readers(xlnet_tokenizer, v11):
    """Our segments `[CLS] q [SEP]` / `p [SEP]`, put in XLNet order by the mapping the parity
    tests use (`tests.helpers.hf.xlnet_order`, which `model/xlnet.pair_layout` positions reproduce),
    are token for token XLNet's own pair encoding of (passage, question), segment ids too."""
    from tests.helpers.hf import xlnet_order

    examples = v11.examples[:40:4]
    questions = encode_questions(xlnet_tokenizer, [e.question for e in examples], 48)
    passages = encode_passages(xlnet_tokenizer, [e.context[:200] for e in examples], 96)
    for row, example in enumerate(examples):
        q = list(questions.ids[row, :questions.mask[row].sum()])
        p = list(passages.ids[row, :passages.mask[row].sum()])
        assert len(q) < 48 and len(p) < 96, "not truncated: the whole texts are compared"
        ids, segments, _ = xlnet_order(q, p)
        theirs = xlnet_tokenizer(example.context[:200], example.question,
                                 return_token_type_ids=True)
        assert ids == theirs["input_ids"]
        assert segments == theirs["token_type_ids"]


def test_gold_labels_round_trip_through_the_decoder(xlnet_tokenizer, v11):
    """SQuAD v1.1 (shared file): gold spans through features, offsets and the decoder give
    EM >= 99.5 against gold, as the BERT tokenizer must (tests/data/test_squad_features.py)."""
    features = featurize(v11.examples, xlnet_tokenizer, max_question_len=64,
                         max_passage_len=384, doc_stride=128)
    column = np.arange(features.p_ids.shape[1])[None, :]
    start = np.where(column == features.start_positions[:, None], 10.0, -10.0)
    end = np.where(column == features.end_positions[:, None], 10.0, -10.0)
    predicted = answers(decode_predictions(v11.examples, features, start, end,
                                           max_answer_length=64))
    scores = squad_scores(v11.gold_answers, predicted, v11.version)
    print(f"\nXLNet SentencePiece round trip: {scores}")
    assert scores["exact"] >= 99.5 and scores["f1"] >= 99.8


@pytest.fixture(scope="module")
def xlnet_reader_folder(xlnet_tokenizer, tmp_path_factory):
    """A random-init XLNetForQuestionAnsweringSimple (every tensor perturbed) with the trained
    tokenizer, saved as a Hugging Face folder: what a user's XLNet SQuAD checkpoint looks like."""
    from tests.helpers.hf import build_xlnet

    model = build_xlnet(vocab_size=VOCAB_SIZE, n_layer=2)
    folder = tmp_path_factory.mktemp("xlnet-reader")
    model.save_pretrained(str(folder), safe_serialization=True)
    xlnet_tokenizer.save_pretrained(str(folder))
    return folder


def test_check_cli_on_an_xlnet_folder(xlnet_reader_folder, capsys):
    """`dil-jax check`: parity with Hugging Face on XLNet's own layout, and the grid at k = 1
    equal to the direct per-pair forward (exit status 0 only if both hold)."""
    from tests.helpers import run_cli

    status, out, err = run_cli(["check", "--checkpoint", str(xlnet_reader_folder), "--k", "1",
                                "--repeats", "1"], capsys)
    assert status == 0, out + err
    assert "XLNetForQuestionAnsweringSimple" in out and "[OK]" in out, out


def test_predict_cli_on_an_xlnet_folder(xlnet_reader_folder, v11, tmp_path):
    """`dil-jax predict` at k = 1 over 3 v1.1 questions: every answer is a span of its context
    (the QA head is random, so which span is arbitrary)."""
    from dil_jax import cli

    output = tmp_path / "preds.json"
    code = cli.main(["predict", "--checkpoint", str(xlnet_reader_folder), "--data",
                     str(squad_file(V11)), "--output", str(output), "--limit", "3", "--k", "1",
                     "--max-question-len", "24", "--max-passage-len", "48", "--doc-stride", "24",
                     "--batch-size", "4", "--no-progress"])
    assert code == 0
    predictions = json.loads(output.read_text())
    for example in v11.examples[:3]:
        assert predictions[example.qid] in example.context


def test_open_domain_reader_equals_squad_predict_path(xlnet_reader_folder, tmp_path):
    """An index over the sample passages with cached XLNet lower states (k = 1): each retrieved
    passage's answer is the one the SQuAD predict path gives for that passage and question.
    The cache's first-upper-block reuse arrays (--cache-reuse) are refused by name."""
    from dil_jax.data.squad import SquadExample
    from dil_jax.model.xlnet import XLNetUnsupportedError
    from dil_jax.open_domain.cache.reuse import reuse_encoder
    from dil_jax.open_domain.index.corpus import Document, split_documents
    from dil_jax.open_domain.index.folder import build_index, build_reader_cache
    from dil_jax.open_domain.reader import OpenDomainReader
    from dil_jax.predict import predict_squad
    from dil_jax.readers import load_reader
    from dil_jax.samples import SAMPLE_PASSAGES

    loaded = load_reader(str(xlnet_reader_folder), 1, 16)
    config = loaded.config
    documents = [Document(f"d{i}", f"T{i}", text) for i, text in enumerate(SAMPLE_PASSAGES)]
    index = build_index(tmp_path / "index", split_documents(documents, "paragraphs"),
                        loaded.tokenizer, max_passage_len=32, doc_stride=16,
                        split={"strategy": "paragraphs"})
    cache = build_reader_cache(index, loaded, encode=loaded.passage_encoder(batch_size=4))
    reader = OpenDomainReader(index, loaded, cache, top_p=len(index.passages), batch_size=4,
                              chunk_size=8)
    questions = ["Who wrote Pride and Prejudice?", "When did Apollo 11 land on the Moon?"]
    result = reader.read(questions)
    for question, candidates in zip(questions, result.candidates):
        assert candidates
        examples = [SquadExample(f"q{c.passage_index}", "", index.passages[c.passage_index].text,
                                 question) for c in candidates]
        expected = predict_squad(loaded, examples, max_passage_len=32, doc_stride=16,
                                 batch_size=4, progress=False)
        for candidate in candidates:
            assert candidate.text == expected[f"q{candidate.passage_index}"]
    encode = reuse_encoder(loaded, batch_size=4)
    states = np.zeros((2, 32, config.hidden_size), np.float32)
    with pytest.raises(XLNetUnsupportedError, match="p_stats.*xlnet"):
        encode(states, np.ones((2, 32), np.int32))
