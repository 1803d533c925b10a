"""Reliability probes about checkpoints and tokenizers: each bad folder a user met ends in one
clear error naming the file and the problem (or, for a k other than the trained one, a warning),
never a traceback, a silent wrong answer or a written output."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from dil_jax.checkpoints import CheckpointError, load_hf_checkpoint, load_params
from dil_jax.errors import DilJaxError
from dil_jax.model.delayed import DelayedInteractionModel
from dil_jax.model.encoder_config import ReaderOverrides
from dil_jax.readers import load_reader

from tests.helpers import ASSETS
from tests.helpers.hf import PARITY_MAX_Q, assert_parity, random_pairs
from tests.helpers.squad import predict_one_question


def _predict(folder: Path, tmp_path: Path, capsys, *extra: str):
    """`dil-jax predict` of the tiny SQuAD file -> (status, stderr, output path)."""
    return predict_one_question(folder, tmp_path, capsys, *extra)


def _copy(folder: Path, tmp_path: Path, name: str = "ckpt") -> Path:
    target = tmp_path / name
    shutil.copytree(folder, target)
    return target


# ----------------------------------------------------------------- 1. tokenizer vs the model


@pytest.mark.parametrize("damage", ["tokenizer.json removed", "tiny vocab.txt"])
def test_predict_refuses_a_tokenizer_that_is_not_the_models(tmp_path, capsys, damage):
    """Without tokenizer.json transformers builds a 5-token tokenizer and every question got
    "The"; a vocabulary far smaller than the embedding table is refused the same way."""
    folder = _copy(ASSETS / "minilm-squad-full", tmp_path)
    (folder / "tokenizer.json").unlink()
    if damage == "tiny vocab.txt":
        (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n")
    status, err, output = _predict(folder, tmp_path, capsys)
    assert status == 1, err
    assert f"dil-jax predict: error: {folder}" in err
    assert ("no tokenizer files" if damage == "tokenizer.json removed"
            else "only 6 tokens for a vocabulary of 30522") in err
    assert "tokenizer.json" in err and "Traceback" not in err
    assert not output.exists(), "predictions written with a broken tokenizer"


def test_tokenizer_larger_than_the_embedding_table(hf_folder_factory, minilm_dir):
    folder, _ = hf_folder_factory("bert")  # vocab_size 99
    with pytest.raises(DilJaxError, match=r"tokenizer has 30522 tokens but the checkpoint's "
                                          r"vocabulary is 99") as error:
        load_reader(str(folder), None, 8, str(minilm_dir))
    assert str(minilm_dir) in str(error.value)


# ----------------------------------------------------------------- 2. ALBERT with E == H


def test_albert_with_embedding_size_equal_to_hidden_size_matches_transformers(hf_folder_factory):
    """transformers applies embedding_hidden_mapping_in even when E == H; so must we."""
    folder, hf_model = hf_folder_factory("albert", embedding_size=32)
    config, params, report = load_hf_checkpoint(folder,
                                                ReaderOverrides(max_question_len=PARITY_MAX_Q))
    assert config.embedding_size == config.hidden_size == 32
    assert "albert.encoder.embedding_hidden_mapping_in.weight" in report.loaded
    assert_parity(DelayedInteractionModel(config), params, hf_model, "albert",
                  random_pairs(config.vocab_size, seed=5))


# ----------------------------------------------------------------- 3. damaged weights


@pytest.mark.parametrize("damage", ["cut to half", "garbage bytes"])
def test_damaged_safetensors_is_named(hf_folder_factory, tmp_path, capsys, damage):
    folder = _copy(hf_folder_factory("bert")[0], tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:len(data) // 2] if damage == "cut to half"
                        else np.random.default_rng(0).bytes(len(data)))
    status, err, output = _predict(folder, tmp_path, capsys)
    assert status == 1, err
    assert f"dil-jax predict: error: {weights}: cannot read the weights" in err
    assert "damaged" in err and "re-download" in err and "Traceback" not in err
    assert not output.exists()


# ----------------------------------------------------------------- 4. malformed manifest


@pytest.mark.parametrize("text,problem", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"reader": {"num_lower_layers": "four"}}',
     "'reader.num_lower_layers' must be a non-negative integer"),
    ('{"reader": [4]}', "'reader' must be an object"),
    ('{"from_base": ["bert.embeddings.word_embeddings.weight"]}', "'base_checkpoint'"),
])
def test_malformed_manifest_is_named(hf_folder_factory, tmp_path, capsys, text, problem):
    folder = _copy(hf_folder_factory("bert")[0], tmp_path)
    manifest = folder / "dil_jax_manifest.json"
    manifest.write_text(text)
    status, err, output = _predict(folder, tmp_path, capsys)
    assert status == 1, err
    assert f"dil-jax predict: error: {manifest}: " in err and problem in err, err
    assert "Traceback" not in err and not output.exists()
    assert manifest.read_text() == text  # an input is never rewritten


# ----------------------------------------------------------------- 5. k other than trained


def test_k_other_than_the_trained_one_warns(caplog):
    folder = str(ASSETS / "minilm-squad-k2")
    with caplog.at_level(logging.WARNING, logger="dil_jax.checkpoints"):
        model = load_reader(folder, 4, 32)
    assert model.config.num_lower_layers == 4  # a warning, not an error
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                and "trained with" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert "--k 4" in warnings[0] and "k=2" in warnings[0] and folder in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dil_jax.checkpoints"):
        load_reader(folder, 2, 32)
        load_reader(folder, None, 32)
    assert "trained with" not in caplog.text


# ----------------------------------------------------------------- 6. no bare Python errors


def test_bad_encoder_config_json_is_named(tmp_path):
    (tmp_path / "params").mkdir()
    path = tmp_path / "encoder_config.json"
    for text, problem in (("{oops", "not valid JSON"), ("[1]", "expected a JSON object"),
                          ('{"vocab_size": "big"}', "vocab_size must be an integer, got 'big'")):
        path.write_text(text)
        with pytest.raises(CheckpointError, match=problem) as error:
            load_params(tmp_path)
        assert str(path) in str(error.value)


def test_dil_jax_checkpoint_without_tokenizer_and_bad_export_dtype(tmp_path, monkeypatch):
    import dil_jax.checkpoints as checkpoints
    from dil_jax.model.encoder_config import EncoderConfig
    from dil_jax.readers import encoder as readers

    config = EncoderConfig(vocab_size=20, hidden_size=8, num_layers=1, num_heads=2,
                           intermediate_size=8, embedding_size=8, max_position_embeddings=32,
                           max_question_len=4)
    (tmp_path / "encoder_config.json").write_text(json.dumps(config.to_dict()))
    # No orbax files needed: the refusal is about the tokenizer, after the params are read.
    monkeypatch.setattr(readers, "load_params", lambda directory, overrides: (config, {}))
    with pytest.raises(DilJaxError, match="without tokenizer files.*pass --tokenizer"):
        load_reader(str(tmp_path), None, 4)
    with pytest.raises(DilJaxError, match="export dtype must be float32 or bfloat16"):
        checkpoints.export_hf_checkpoint(tmp_path / "out", {}, config, dtype="float16")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("text,problem", [
    ("nope", "not valid JSON"),
    ('{"format": "dil_jax.prescreener/1"}', "field 'config' must be a dict"),
    ('{"format": "dil_jax.prescreener/1", "config": {"widht": 3}, "encoder": "default", '
     '"encoder_fingerprint": "x", "max_sentence_len": 8}', "not a prescreener config"),
])
def test_malformed_prescreener_manifest_is_named(tmp_path, text, problem):
    from dil_jax.prescreening.prescreener import PrescreenerError, SentencePrescreener

    (tmp_path / "prescreener.json").write_text(text)
    with pytest.raises(PrescreenerError, match=problem) as error:
        SentencePrescreener.load(tmp_path)
    assert str(tmp_path / "prescreener.json") in str(error.value)


def _tiny_config():
    from dil_jax.model.encoder_config import EncoderConfig

    return EncoderConfig(vocab_size=20, hidden_size=8, num_layers=1, num_heads=2,
                         intermediate_size=8, embedding_size=8, max_position_embeddings=32,
                         max_question_len=4)


def test_damaged_orbax_params_are_named(tmp_path):
    import jax

    from dil_jax.checkpoints import save_params

    config = _tiny_config()
    folder = save_params(tmp_path / "reader", DelayedInteractionModel(config).init(
        jax.random.key(0)), config)
    for path in (folder / "params").rglob("*"):
        if path.is_file() and path.parent.name == "d":  # the array data files
            path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="cannot restore the params.*damaged") as error:
        load_params(folder)
    assert str(folder / "params") in str(error.value)



def _pair_logits(config, params, seed: int = 0):
    """Start logits of one random question x passage pair: [1, passage]."""
    rng = np.random.default_rng(seed)
    q_ids = rng.integers(5, config.vocab_size, (1, config.max_question_len), dtype=np.int32)
    p_ids = rng.integers(5, config.vocab_size, (1, 12), dtype=np.int32)
    output = DelayedInteractionModel(config)(params, q_ids, np.ones_like(q_ids), p_ids,
                                             np.ones_like(p_ids))
    return np.asarray(output.start_logits)


def test_export_keeps_the_passage_position_offset(hf_folder_factory, tmp_path):
    """A delayed reader trained with passages from position N must be read from N after an
    export: the manifest records it and loading applies it (the reader's answers are the same
    before and after); an older export that recorded it only in its training config is read
    from there; a bad value is refused naming the field."""
    from dil_jax.checkpoints import MANIFEST_FILE, export_hf_checkpoint

    folder, _ = hf_folder_factory("bert")
    config, params, _ = load_hf_checkpoint(folder,
                                           ReaderOverrides(max_question_len=4, num_lower_layers=1,
                                                           passage_position_offset=5))
    expected = _pair_logits(config, params)
    # The offset changes the answers, so a loader that dropped it would fail below.
    assert not np.allclose(expected, _pair_logits(config.replace(passage_position_offset=0),
                                                  params), atol=1e-3)
    exported = export_hf_checkpoint(tmp_path / "export", params, config)
    config_back, params_back, _ = load_hf_checkpoint(exported)
    assert config_back.passage_position_offset == 5 and config_back.num_lower_layers == 1
    np.testing.assert_array_equal(_pair_logits(config_back, params_back), expected)

    manifest_path = exported / MANIFEST_FILE
    manifest = json.loads(manifest_path.read_text())
    del manifest["reader"]["passage_position_offset"]
    manifest["training_config"] = {"model": {"num_lower_layers": 1,
                                             "passage_position_offset": 5}}
    manifest_path.write_text(json.dumps(manifest))
    assert load_hf_checkpoint(exported)[0].passage_position_offset == 5

    manifest["reader"]["passage_position_offset"] = -1
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="reader.passage_position_offset"):
        load_hf_checkpoint(exported)


def test_export_records_the_passage_offset_once_and_old_manifests_still_give_it(
        hf_folder_factory, tmp_path):
    """An export records the passage offset once, in the manifest's "reader" (its training
    config's model.passage_position_offset, the same value, is left out and derived on load);
    a manifest written before, with the offset in both, reads as it did. A training offset
    that differs from the exported one stays, and the reader's own (0 too) is then written."""
    from dil_jax.checkpoints import MANIFEST_FILE, ExportManifest, export_hf_checkpoint

    folder, _ = hf_folder_factory("bert")
    config, params, _ = load_hf_checkpoint(folder,
                                           ReaderOverrides(max_question_len=4, num_lower_layers=1,
                                                           passage_position_offset=5))
    expected = _pair_logits(config, params)
    trained = {"model": {"num_lower_layers": 1, "max_question_len": 4,
                         "passage_position_offset": 5}}
    exported = export_hf_checkpoint(tmp_path / "export", params, config,
                                    manifest={"training_config": trained})
    written = json.loads((exported / MANIFEST_FILE).read_text())
    assert written["reader"] == {"num_lower_layers": 1, "max_question_len": 4,
                                 "passage_position_offset": 5}
    assert written["training_config"] == {"model": {}}  # max_question_len: recorded once too
    config_back, params_back, _ = load_hf_checkpoint(exported)
    assert config_back.passage_position_offset == 5
    np.testing.assert_array_equal(_pair_logits(config_back, params_back), expected)

    # As exports wrote it before: the offset in "reader" and in the training config.
    written["training_config"] = trained
    (exported / MANIFEST_FILE).write_text(json.dumps(written))
    assert ExportManifest.read(exported).reader_defaults.passage_position_offset == 5
    assert load_hf_checkpoint(exported)[0].passage_position_offset == 5

    offset_zero = ExportManifest(training_config={"model": {"passage_position_offset": 0}})
    assert offset_zero.with_reader({"num_lower_layers": 0}).to_json() == {
        "training_config": {"model": {}}, "reader": {"num_lower_layers": 0}}
    other = ExportManifest(training_config={"model": {"passage_position_offset": 14}}
                           ).with_reader({"num_lower_layers": 1})
    assert other.training_config == {"model": {"passage_position_offset": 14}}
    assert other.reader_defaults == ReaderOverrides(num_lower_layers=1, passage_position_offset=0)


def test_max_question_len_is_recorded_once_and_old_manifests_still_give_it(
        hf_folder_factory, tmp_path):
    """An export records max_question_len once, in the manifest's "reader" (the training
    config's equal model.max_question_len is left out) and loads with it; a manifest written
    before, with it in both, reads as it did. A training length other than the exported one
    stays beside it."""
    from dil_jax.checkpoints import MANIFEST_FILE, ExportManifest, export_hf_checkpoint
    from dil_jax.defaults import bundled_reader

    folder, _ = hf_folder_factory("bert")
    config, params, _ = load_hf_checkpoint(folder, ReaderOverrides(max_question_len=6))
    trained = {"model": {"max_question_len": 6, "dtype": "float32"}}
    exported = export_hf_checkpoint(tmp_path / "export", params, config,
                                    manifest={"training_config": trained})
    written = json.loads((exported / MANIFEST_FILE).read_text())
    assert written["reader"] == {"num_lower_layers": 0, "max_question_len": 6}
    assert written["training_config"] == {"model": {"dtype": "float32"}}
    assert load_hf_checkpoint(exported)[0].max_question_len == 6

    # As exports wrote it before: the length in "reader" and in the training config.
    written["training_config"] = trained
    (exported / MANIFEST_FILE).write_text(json.dumps(written))
    old = ExportManifest.read(exported)
    assert old.training_config == trained and old.reader_defaults.max_question_len == 6
    assert load_hf_checkpoint(exported)[0].max_question_len == 6
    bundled = ExportManifest.read(bundled_reader("full"))  # bundled before: 32 in both
    assert bundled.training_config["model"]["max_question_len"] == 32
    assert bundled.reader_defaults.max_question_len == 32

    other = ExportManifest(training_config=trained).with_reader(
        {"num_lower_layers": 0, "max_question_len": 8})
    assert other.training_config == trained and other.reader["max_question_len"] == 8


def test_a_disk_that_refuses_a_checkpoint_is_named_in_one_line(tmp_path, monkeypatch):
    """ENOSPC / EROFS while saving (raised by orbax as an OSError, or by tensorstore as its own
    error carrying the message) becomes a CheckpointError naming the folder, the step and the
    last complete checkpoint; any other error is left as it is."""
    import errno

    import jax.numpy as jnp

    from dil_jax.checkpoints import CheckpointError
    from dil_jax.train.checkpointing import TrainCheckpointer

    checkpointer = TrainCheckpointer(tmp_path / "checkpoints", every_steps=1, keep=2,
                                     best_metric=None, async_save=False)
    state = {"w": jnp.ones(3)}
    assert checkpointer.save(1, state, {"step": 1}, force=True)

    def full_disk(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x"))

    monkeypatch.setattr(checkpointer.manager, "save", full_disk)
    with pytest.raises(CheckpointError) as caught:
        checkpointer.save(2, state, {"step": 2}, force=True)
    message = str(caught.value)
    assert "\n" not in message
    assert "cannot write the checkpoint of step 2" in message
    assert "No space left on device (ENOSPC)" in message and "(step 1)" in message

    def read_only(*_args, **_kwargs):
        raise ValueError("INTERNAL: Error writing file: Read-only file system [OS error: 30]")

    monkeypatch.setattr(checkpointer.manager, "save", read_only)
    with pytest.raises(CheckpointError, match=r"Read-only file system \(EROFS\)"):
        checkpointer.save(3, state, {"step": 3}, force=True)

    def other(*_args, **_kwargs):
        raise KeyError("not a disk problem")

    monkeypatch.setattr(checkpointer.manager, "save", other)
    with pytest.raises(KeyError):
        checkpointer.save(4, state, {"step": 4}, force=True)
    monkeypatch.undo()
    checkpointer.close()
