"""QANet / BiDAF exports through the prediction path: `predict_squad` and `dil-jax predict`.

The reference is the whole reader run window by window (`QANetModel.__call__` on each window's
question and passage, characters from `data.characters`), decoded by the same decoder; the path
under test encodes questions in padded blocks and each distinct passage window once
(`CharPairGrid`), as a cache would hold it.
"""

from __future__ import annotations

import json
import logging

import jax
import numpy as np
import pytest

from dil_jax.checkpoints.char_readers import save_char_reader
from dil_jax.data.characters import squad_characters
from dil_jax.data.decoding import answers, decode_predictions
from dil_jax.data.features import featurize
from dil_jax.data.squad import load_squad
from dil_jax.errors import CheckpointError
from dil_jax.model.char_reader import CharModel, char_model
from dil_jax.model.qanet_inputs import QANetSegment, fit_chars
from dil_jax.predict import window_logits
from dil_jax.readers import CharReader, load_reader

from tests.helpers import V11, V20, run_cli, squad_file
from tests.helpers.qanet import TINY, tiny_variables
from tests.helpers.qanet import tiny_config as tiny_qanet_config

Q_LEN, P_LEN, STRIDE = 16, 40, 16
# A whole tiny reader against the same reader compiled at other batch shapes: float32 rounding
# over a few hundred O(1) ops, far below this share of the largest logit.
RTOL = 1e-4


def tiny_config(tokenizer):
    """The tiny QANet of the model tests over the real MiniLM vocabulary (a narrow table)."""
    return tiny_qanet_config(vocab_size=tokenizer.vocab_size, word_dim=8,
                             max_chars=TINY["max_chars"], max_question_len=Q_LEN)


def reference_logits(model: CharModel, variables, examples, features, tokenizer):
    """Every window through the whole reader, with its own question: start, end [n_windows,
    P_LEN]."""
    characters = squad_characters(examples, features, tokenizer)
    q = features.example_index
    slots = model.config.max_chars
    question = QANetSegment(features.q_ids[q], fit_chars(characters.q_chars[q], slots),
                            features.q_mask[q])
    passage = QANetSegment(features.p_ids,
                           fit_chars(characters.p_chars[characters.p_source], slots),
                           features.p_mask)
    out = model(variables, question, passage)
    return np.asarray(out.start_logits), np.asarray(out.end_logits)


def test_window_logits_of_a_qanet_equal_the_whole_reader_on_each_window(tokenizer):
    model = char_model(tiny_config(tokenizer))
    variables = tiny_variables(model.config)
    examples = load_squad(squad_file(V11)).examples[:7]  # two paragraphs, several windows each
    f = featurize(examples, tokenizer, max_question_len=Q_LEN, max_passage_len=P_LEN,
                  doc_stride=STRIDE)
    assert len(np.unique(f.window_passage_index)) < f.num_windows  # windows are shared
    characters = squad_characters(examples, f, tokenizer)
    got = window_logits(CharReader(model, variables), f, characters, batch_size=4,
                        question_block=3, progress=False)
    start, end = reference_logits(model, variables, examples, f, tokenizer)
    real = f.p_mask > 0
    scale = np.abs(start[real]).max()
    np.testing.assert_allclose(got.start_logits[real], start[real], rtol=0, atol=RTOL * scale)
    np.testing.assert_allclose(got.end_logits[real], end[real], rtol=0, atol=RTOL * scale)
    assert (got.start_logits[~real] < -1e8).all()


@pytest.fixture(scope="module")
def qanet_export(tmp_path_factory, tokenizer):
    """A tiny QANet saved as `dil-jax train` exports one (orbax variables + manifest)."""
    config = tiny_config(tokenizer)
    folder = tmp_path_factory.mktemp("qanet") / "params"
    save_char_reader(folder, tiny_variables(config), config)
    return folder


def test_the_public_load_reader_loads_a_qanet_export(qanet_export, tokenizer):
    """`dil_jax.load_reader`, the one loader, reads a QANet export as it reads any checkpoint:
    the family its manifest's model kind names, with that family's capabilities."""
    import dil_jax

    reader = dil_jax.load_reader(qanet_export)
    assert isinstance(reader, CharReader) and isinstance(reader, dil_jax.Reader)
    assert (reader.kind, reader.label, reader.split) == ("qanet", "qanet", 1)
    assert reader.config == tiny_config(tokenizer)
    assert not reader.capabilities.null_score and reader.capabilities.reads_characters
    assert reader.cacheable_passage_side and reader.tokenizer.vocab_size == tokenizer.vocab_size
    saved = tiny_variables(tiny_config(tokenizer))
    for got, want in zip(jax.tree.leaves(reader.params), jax.tree.leaves(saved), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    with pytest.raises(CheckpointError, match="split is fixed.*k = 1"):
        dil_jax.load_reader(qanet_export, k=2)


def test_predict_cli_reads_a_qanet_export(qanet_export, tmp_path, tokenizer, capsys):
    """`dil-jax predict --checkpoint QANET_EXPORT`: every question answered with the span the
    whole reader, window by window, scores best."""
    output = tmp_path / "predictions.json"
    status, _, err = run_cli(["predict", "--checkpoint", str(qanet_export), "--data",
                              str(squad_file(V11)), "--output", str(output), "--limit", "5",
                              "--max-question-len", str(Q_LEN), "--max-passage-len", str(P_LEN),
                              "--doc-stride", str(STRIDE), "--batch-size", "4",
                              "--no-progress"], capsys)
    assert status == 0, err
    predictions = json.loads(output.read_text())
    examples = load_squad(squad_file(V11)).examples[:5]
    assert list(predictions) == [example.qid for example in examples]
    reader = load_reader(qanet_export)
    assert reader.config.max_question_len == Q_LEN  # recorded in the export
    f = featurize(examples, tokenizer, max_question_len=Q_LEN, max_passage_len=P_LEN,
                  doc_stride=STRIDE)
    start, end = reference_logits(reader.model, reader.params, examples, f, tokenizer)
    want = answers(decode_predictions(examples, f, start, end, n_best=20, max_answer_length=30))
    assert predictions == want
    for example in examples:
        assert predictions[example.qid] and predictions[example.qid] in example.context


@pytest.mark.parametrize("flags, named", [
    (["--k", "2"], "--k: "),
    (["--null-threshold", "0"], "--null-threshold: "),
    (["--lsh-layers", "0"], "--lsh-layers 0: "),
    (["--data-v2"], "a SQuAD 2.0 file"),
])
def test_predict_refuses_what_a_qanet_cannot_do(qanet_export, tmp_path, capsys, flags, named):
    data = squad_file(V20) if flags == ["--data-v2"] else squad_file(V11)
    flags = [] if flags == ["--data-v2"] else flags
    output = tmp_path / "predictions.json"
    status, _, err = run_cli(["predict", "--checkpoint", str(qanet_export), "--data", str(data),
                              "--output", str(output), "--limit", "2", "--no-progress", *flags],
                             capsys)
    assert status != 0 and named in err and "qanet reader" in err
    assert "Traceback" not in err and not output.exists()


def test_predict_reads_a_qanet_with_lsh_attention_in_its_encoders(qanet_export, tmp_path,
                                                                  capsys, caplog):
    """`--lsh-layers embedding,model` swaps LSH attention into a QANet's encoders (the same
    params). With buckets of 64 >= every segment (16 + 40 tokens) one chunk holds every token:
    exactly full attention (model/lsh.py, rule 3), so the answers are the plain reader's; the
    log names the encoders. A BERT-family layer list is refused by name."""
    caplog.set_level(logging.INFO)
    runs = {}
    for name, flags in (("plain", []), ("lsh", ["--lsh-layers", "embedding,model",
                                                 "--lsh-bucket-size", "64"])):
        output = tmp_path / f"{name}.json"
        status, _, err = run_cli(["predict", "--checkpoint", str(qanet_export), "--data",
                                  str(squad_file(V11)), "--output", str(output), "--limit", "5",
                                  "--max-question-len", str(Q_LEN), "--max-passage-len",
                                  str(P_LEN), "--doc-stride", str(STRIDE), "--no-progress",
                                  *flags], capsys)
        assert status == 0, err
        runs[name] = json.loads(output.read_text())
    assert runs["lsh"] == runs["plain"]
    assert "LSH attention in the embedding and model encoder(s)" in caplog.text


def test_predict_refuses_lsh_for_a_bidaf_and_encoder_names_for_a_bert(tmp_path, capsys,
                                                                      tokenizer):
    from tests.helpers.qanet import tiny_bidaf_config, tiny_bidaf_variables

    config = tiny_bidaf_config(tokenizer, Q_LEN)
    bidaf = save_char_reader(tmp_path / "bidaf", tiny_bidaf_variables(config), config)
    for checkpoint, named, more in ((bidaf, "no self-attention", []),
                                    ("default", "encoder names are", ["--allow-untrained-head"])):
        status, _, err = run_cli(["predict", "--checkpoint", str(checkpoint), "--data",
                                  str(squad_file(V11)), "--output", str(tmp_path / "p.json"),
                                  "--limit", "2", "--no-progress", "--lsh-layers", "model",
                                  *more], capsys)
        assert status != 0 and "--lsh-layers" in err and named in err, err
        assert "Traceback" not in err and not (tmp_path / "p.json").exists()
