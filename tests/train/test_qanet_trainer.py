"""QANet through the project's trainer (`dil-jax train`, config.model.kind = "qanet").

- the characters the trainer feeds a known text, against values written by hand;
- the trainer's batches carry the characters of their own question and window;
- KD / LRS and the MiniLM featurizer with kind qanet: one-line errors naming the key;
- a tiny QANet learns a pointing task through `train` (the loss falls from chance, held-out
  starts are found), its frozen word table never moves, and the exported reader reads back
  (`load_reader`, its manifest naming the kind) to the same outputs as the trained state.

The pointing task (`tests.helpers.qanet.pointing_features`): the answer starts at the passage token
that equals the question's key; the question's other tokens are nowhere in the passage. So only
context-query attention can find it. Chance is one in the n + 1 real passage tokens (n in 8..15
and [SEP]): loss (CE_start + CE_end) / 2 = E[log(n + 1)] ~ 2.5 at the start; a reader that
found the match puts its start and end (the next token) right: loss -> 0, start accuracy -> 1.
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from dil_jax.checkpoints import resolve_reader_checkpoint
from dil_jax.data.characters import squad_characters
from dil_jax.data.features import featurize
from dil_jax.data.squad import SquadExample
from dil_jax.errors import CheckpointError, UsageError
from dil_jax.readers import load_reader
from dil_jax.tokenization import load_tokenizer
from dil_jax.train.char_data import char_windows
from dil_jax.train.config_files import load_config_file
from dil_jax.train.config_rules import validate_config
from dil_jax.train.loop import train
from dil_jax.train.setup import load_run_models
from dil_jax.train.train_config import TrainConfig

from tests.helpers import REPO, run_cli
from tests.helpers.qanet import learnt_pointing, pointing_features, trainer_config


def test_characters_of_a_known_text_written_by_hand():
    # Ids by hand: 4 + the Latin-1 code point ('W' 87 -> 91, 'é' 233 -> 237); '€' U+20AC = 8364
    # is hashed to 260 + 8364 mod 252 = 308; [CLS] / [SEP] are 1; padding 0. The uncased
    # WordPiece tokens are "who", "cafe": the characters keep the text's case and accent.
    example = SquadExample("q0", "t", "Café costs €5.", "Who?", ("Café",), (0,))
    tokenizer = load_tokenizer("default")
    features = featurize([example], tokenizer, max_question_len=6, max_passage_len=8,
                         doc_stride=4)
    characters = squad_characters([example], features, tokenizer)
    q_chars, p_chars, p_source = characters.q_chars, characters.p_chars, characters.p_source
    assert q_chars.shape == (1, 6, 16) and p_chars.shape == (1, 8, 16)
    question = [[1], [91, 108, 115], [67], [1], [], []]  # [CLS] Who ? [SEP] pad pad
    passage = [[71, 101, 106, 237], [103, 115, 119, 120, 119], [308], [57], [50], [1], [],
               []]  # Café costs € 5 . [SEP] pad pad
    for row, expected in ((q_chars[0], question), (p_chars[0], passage)):
        for token, chars in zip(row, expected, strict=True):
            assert token.tolist() == chars + [0] * (16 - len(chars))
    assert p_source.tolist() == [0]


def test_batches_carry_their_own_question_and_window_characters():
    features = pointing_features(3, 6)
    windows = char_windows(features)
    batch = windows.batch(np.array([[4, 1]]), valid=np.array([[True, False]]))
    np.testing.assert_array_equal(batch["q_chars"][0, 0], features.q_chars[4])
    np.testing.assert_array_equal(batch["p_chars"][0, 0], features.p_chars[4])
    assert not batch["p_chars"][0, 1].any() and not batch["p_ids"][0, 1].any()  # a padding row
    assert batch["q_chars"].shape == (1, 2, 8, 16) and batch["p_chars"].shape == (1, 2, 16, 16)


@pytest.mark.parametrize("override, key", [
    ("--config.loss.kd_weight=1.0", "config.loss.kd_weight"),
    ("--config.loss.lrs_weight=1.0", "config.loss.lrs_weight"),
    ("--config.data.featurizer=dil_jax.train.data:synthetic", "config.data.featurizer"),
    ("--config.model.reader.d_model=15", "config.model.reader"),  # not a multiple of heads
])
def test_what_qanet_cannot_honour_is_refused_by_its_key(override, key, capsys, tmp_path):
    status, _, err = run_cli(["train", "--config", f"{REPO}/configs/tiny.py:qanet",
                              f"--config.workdir={tmp_path / 'run'}", override], capsys)
    assert status != 0
    assert key in err and "Traceback" not in err, err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_the_squad_config_refuses_kd_and_the_minilm_checkpoint():
    config = load_config_file(f"{REPO}/configs/qanet_squad.py:qanet_lsh")
    validate_config(config)  # the config as written is valid
    config.loss.kd_weight = 1.0
    config.model.checkpoint = "default"
    with pytest.raises(UsageError, match="config.loss.kd_weight.*teacher") as error:
        validate_config(config)
    assert "config.model.checkpoint = 'default'" in str(error.value)


def test_the_squad_configs_word_scale_is_one_over_the_tables_spread():
    """configs/qanet_squad.py's QANets read the frozen MiniLM rows times 1 / their standard
    deviation (docs/results/qanet_log.md, "The word table's scale"), computed here from the table
    itself; the table trained from N(0, 1) rows and BiDAF keep 1."""
    from dil_jax.model.qanet_inputs import minilm_word_table

    spread = float(np.std(minilm_word_table(None).astype(np.float64)))
    for variant in ("qanet", "qanet_lsh", "qanet_reversible", "qanet_sd", "qanet_ema"):
        reader = load_config_file(f"{REPO}/configs/qanet_squad.py:{variant}").model.reader
        assert abs(reader.word_scale * spread - 1) < 0.02, (variant, reader.word_scale, spread)
    for variant in ("qanet_scratch", "bidaf"):
        config = load_config_file(f"{REPO}/configs/qanet_squad.py:{variant}")
        assert config.model.reader.word_scale == 1.0


def test_tiny_qanet_learns_through_the_trainer_and_its_export_reads_back(tmp_path):
    # 200 steps at lr 1e-2 (warm-up 10, linear decay), dropout off. With the tiny config's
    # dropout (0.05) the loss sat near chance until a step that moves with the CPU's rounding
    # (140-200: the symmetry is broken by noise), and 300 steps ended mid-fall, at a validation
    # loss anywhere from 0.75 to 1.35 (AMD EPYC, Intel Xeon under each --xla_cpu_max_isa):
    # around the threshold. Without dropout the fall starts at step ~50 on every ISA and ends
    # far below it (0.18 under the default ISA, AVX2 and SSE4_2 on an Intel Xeon). Training with
    # dropout still runs through the trainer below (the word-table test, the tiny config's 0.05)
    # and is checked to learn at model level (tests/model/test_qanet_training.py).
    config = trainer_config("qanet", tmp_path / "run", steps=200, **{
        "model.reader.dropout": 0, "model.reader.char_dropout": 0,
        "model.reader.word_dropout": 0})
    initial = load_run_models(TrainConfig.of(config), None).student.params
    validation = pointing_features(1, 256)
    result = train(config, train_features=pointing_features(0, 4096), val_features=validation)
    batch = learnt_pointing(tmp_path / "run", validation)

    # The frozen table is the initial one to the bit (AdamW's decay of 0.01 would shrink it);
    # every trainable tensor moved.
    trained = result.state.params
    np.testing.assert_array_equal(trained["frozen"]["word_table"],
                                  initial["frozen"]["word_table"])
    moved = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != b)), trained["params"],
                         initial["params"])
    assert all(jax.tree.leaves(moved))

    # The export (its manifest names the kind) reads back to the trained state's outputs.
    reader = load_reader(tmp_path / "run" / "params", kind="qanet", with_tokenizer=False)
    assert reader.config == result.student.config

    out = result.student.outputs(jax.device_get(trained), batch)
    again = reader.outputs(reader.params, batch)
    np.testing.assert_array_equal(np.asarray(out.start_logits), np.asarray(again.start_logits))
    np.testing.assert_array_equal(np.asarray(out.end_logits), np.asarray(again.end_logits))
    assert resolve_reader_checkpoint(tmp_path / "run" / "params").model_kind == "qanet"
    # The one loader reads it as it reads every family (its manifest's kind picks it).
    assert load_reader(tmp_path / "run" / "params", with_tokenizer=False).kind == "qanet"
    with pytest.raises(CheckpointError, match="a qanet reader, not a bidaf one"):
        load_reader(tmp_path / "run" / "params", kind="bidaf")


# BiDAF's case slow (not in CI): the trainer's word-table path is the same code for both char
# readers (QANet's case runs it), and BiDAF's trainer run and export are CI's in
# tests/train/test_bidaf_trainer.py.
@pytest.mark.parametrize("kind", ["qanet", pytest.param("bidaf", marks=pytest.mark.slow)])
def test_a_trained_word_table_moves_and_its_export_reads_back(tmp_path, kind):
    """`model.reader.train_word_table`: the table is a parameter (no "frozen" collection), the
    looked-up rows get gradients and AdamW moves them, rows no batch looks up stay; the export
    (a table among the params) reads back to the same outputs."""
    config = trainer_config(kind, tmp_path / "run", steps=20,
                            **{"model.reader.train_word_table": "true"})
    initial = load_run_models(TrainConfig.of(config), None).student.params
    assert set(initial) == {"params"} and "word_table" in initial["params"]
    train_features = pointing_features(0, 256)
    result = train(config, train_features=train_features, val_features=pointing_features(1, 64))
    before, after = (np.asarray(p["params"]["word_table"])
                     for p in (initial, result.state.params))
    seen = np.unique(np.concatenate([train_features.q_ids.ravel(),
                                     train_features.p_ids.ravel()]))
    unseen = np.setdiff1d(np.arange(len(before)), seen)
    assert len(unseen) and np.any(after[seen] != before[seen])
    # Weight decay (tiny config: 0.01) shrinks every row a little; the unseen rows get no
    # gradient, so only that: a uniform factor of the initial row.
    ratio = after[unseen] / before[unseen]
    np.testing.assert_allclose(ratio, ratio.flat[0], rtol=1e-5)
    reader = load_reader(tmp_path / "run" / "params", kind=kind, with_tokenizer=False)
    assert reader.config.train_word_table and set(reader.params) == {"params"}
    batch = char_windows(pointing_features(1, 8)).batch(np.arange(8))
    outputs = [np.asarray(student.outputs(variables, batch).start_logits)
               for student, variables in ((result.student, jax.device_get(result.state.params)),
                                          (reader, reader.params))]
    np.testing.assert_array_equal(*outputs)


def test_the_evaluator_maps_windows_to_answer_text_with_the_official_metric(tmp_path):
    # Two paragraphs in windows of 11 tokens + [SEP], stride 6: a paragraph spans several
    # windows. A read that peaks (start and end) at the answer's token gives the gold text for
    # both questions (EM 100, F1 100); the same peak one token later gives other text (EM 0).
    from dil_jax.train.char_eval import scores, validation_set

    from tests.helpers.qanet import trainer_config

    paragraphs = [("Paris is the capital of France and also its largest city by far.",
                   "What is the capital of France?", "Paris"),
                  ("The longest river that flows north through Egypt is the Nile, they say.",
                   "Which river flows north?", "Nile")]
    squad = {"version": "1.1", "data": [{"title": f"t{i}", "paragraphs": [{
        "context": context, "qas": [{"id": f"q{i}", "question": question, "answers": [
            {"text": answer, "answer_start": context.index(answer)}]}]}]}
        for i, (context, question, answer) in enumerate(paragraphs)]}
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(squad))
    config = trainer_config("qanet", tmp_path / "run", steps=1, **{
        "data.validation_file": path, "data.validation_articles": ":",
        "data.tokenizer": "default", "model.max_question_len": 16, "data.max_passage_len": 12,
        "data.doc_stride": 6})
    data = validation_set(config)
    assert data.features.num_windows > 2  # more windows than paragraphs
    tokenizer = load_tokenizer("default")
    answer_ids = np.asarray(tokenizer.convert_tokens_to_ids(["paris", "nile"]))

    def peaked(shift: int) -> np.ndarray:
        hit = np.isin(data.features.p_ids, answer_ids)
        return np.roll(np.where(hit, 10.0, 0.0), shift, axis=1)

    assert scores(peaked(0), peaked(0), data) == {"exact": 100.0, "f1": 100.0}
    assert scores(peaked(1), peaked(1), data)["exact"] == 0.0
