"""Reliability probes about the integrity of what a reader loads: weights whose bytes changed
after export, tokenizers that are not the reader's, a checkpoint without a QA head where answers
must mean something, text that is not Unicode, and outputs that are not regular files. Each ends
in one error naming the file, flag or field, never a silent wrong answer, a traceback or a
written output."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dil_jax.checkpoints import (
    PARTIAL_SAFETENSORS_FILE,
    SAFETENSORS_FILE,
    CheckpointError,
    load_hf_checkpoint,
)
from dil_jax.errors import DilJaxError
from dil_jax.model.encoder_config import ReaderOverrides
from dil_jax.readers import load_reader
from dil_jax.tokenization import TokenizationError, encode_questions, load_tokenizer

from tests.helpers import ASSETS, run_cli
from tests.helpers.hf import save_fast_tokenizer
from tests.helpers.squad import one_question_squad, predict_one_question

FULL = ASSETS / "minilm-squad-full"
MANIFEST = "dil_jax_manifest.json"


def _predict(checkpoint: str | Path, tmp_path: Path, capsys, *extra: str,
             squad: Path | None = None):
    """`dil-jax predict` of a one-question file -> (status, stderr, output path)."""
    return predict_one_question(checkpoint, tmp_path, capsys, "--max-question-len", "16",
                                "--max-passage-len", "32", "--doc-stride", "16", *extra,
                                squad=squad)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    """Overwrites len(data) bytes of `path` at `offset` (the file keeps its size)."""
    with path.open("r+b") as stream:
        stream.seek(offset)
        stream.write(data)


def _safetensors_header_end(path: Path) -> int:
    """Where a safetensors file's tensor bytes start (8-byte length, then the JSON header)."""
    return 8 + int.from_bytes(path.read_bytes()[:8], "little")


# ----------------------------------------------------------------- 1. weights: digest, finite


def test_a_bundled_reader_with_4_kib_of_flipped_weights_is_refused(tmp_path, capsys):
    """The issue's probe: 4 KiB of the weights overwritten, header intact, predicted with
    exit 0 and F1 9 instead of 92. Now the digest the manifest records refuses it."""
    folder = tmp_path / "reader"
    shutil.copytree(FULL, folder)
    weights = folder / PARTIAL_SAFETENSORS_FILE  # a bundled reader's: its base fills the rest
    expected = _sha256(FULL / PARTIAL_SAFETENSORS_FILE)  # the committed file's, computed here
    middle = weights.stat().st_size // 2
    assert middle > _safetensors_header_end(weights)  # the header stays intact
    _overwrite(weights, middle, np.random.default_rng(0).bytes(4096))
    actual = _sha256(weights)
    status, err, output = _predict(folder, tmp_path, capsys)
    assert status == 1, err
    assert f"dil-jax predict: error: {weights}: sha256 {actual}, but " in err, err
    assert f"{folder / MANIFEST} records {expected}" in err and "re-download" in err, err
    assert "Traceback" not in err and not output.exists()


def test_bundled_manifests_record_the_digests_of_their_weights():
    """The digests were computed from the committed files; a re-bundle must keep them true."""
    for name in ("minilm-squad-full", "minilm-squad-k2", "minilm-squad-k4"):
        weights = ASSETS / name / PARTIAL_SAFETENSORS_FILE
        recorded = json.loads((ASSETS / name / MANIFEST).read_text())["weights"]
        assert recorded == {PARTIAL_SAFETENSORS_FILE: {"bytes": weights.stat().st_size,
                                                       "sha256": _sha256(weights)}}


def _with_tensor_value(folder: Path, name: str, value: float) -> None:
    """Rewrites the folder's model.safetensors with one element of tensor `name` set."""
    from safetensors.numpy import load_file, save_file

    weights = folder / SAFETENSORS_FILE
    state = dict(load_file(str(weights)))
    tensor = state[name].copy()
    tensor.flat[3] = value
    state[name] = tensor
    save_file(state, str(weights), metadata={"format": "pt"})


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_plain_checkpoint_with_a_non_finite_weight_is_refused_by_tensor(
        hf_folder_factory, tmp_path, value):
    """Without a recorded digest (a plain Hugging Face folder) every tensor must be finite."""
    folder = tmp_path / "plain"
    shutil.copytree(hf_folder_factory("bert")[0], folder)
    name = "bert.encoder.layer.1.attention.self.query.weight"
    _with_tensor_value(folder, name, value)
    with pytest.raises(CheckpointError, match=rf"tensor '{name}' has 1 NaN or infinite value"):
        load_hf_checkpoint(folder, ReaderOverrides(max_question_len=8))


def test_an_older_export_without_a_digest_gets_the_finite_scan(tmp_path):
    """A bundled reader exported before manifests recorded digests, with 4 KiB of 0xFF (every
    bfloat16 0xFFFF is a NaN) in its weights: refused by the finite scan, naming a tensor."""
    folder = tmp_path / "older"
    shutil.copytree(FULL, folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest.pop("weights", None)  # as exported before manifests recorded digests
    (folder / MANIFEST).write_text(json.dumps(manifest))
    weights = folder / PARTIAL_SAFETENSORS_FILE
    _overwrite(weights, weights.stat().st_size // 2, b"\xff" * 4096)
    with pytest.raises(CheckpointError, match=r"tensor '[^']+' has 2048 NaN or infinite "):
        load_reader(str(folder), None, 16)


# ----------------------------------------------------------------- 2. export records, tokenizer


def _exported_reader(hf_folder_factory, tmp_path: Path) -> Path:
    """A tiny BERT reader exported with a WordPiece tokenizer of its 99-token vocabulary."""
    from dil_jax.checkpoints import export_hf_checkpoint

    config, params, _ = load_hf_checkpoint(hf_folder_factory("bert")[0],
                                           ReaderOverrides(max_question_len=8))
    texts = ["the tower was built in paris in 1889", "who built the tower and when"] * 20
    save_fast_tokenizer("electra", texts, 99, tmp_path / "tok")
    tokenizer = load_tokenizer(tmp_path / "tok")
    return export_hf_checkpoint(tmp_path / "export", params, config, tokenizer=tokenizer)


def test_export_records_its_weights_digest_and_tokenizer(hf_folder_factory, tmp_path):
    from dil_jax.open_domain.cache.check import tokenizer_fingerprint

    folder = _exported_reader(hf_folder_factory, tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())
    weights = folder / SAFETENSORS_FILE
    assert manifest["weights"] == {SAFETENSORS_FILE: {"bytes": weights.stat().st_size,
                                                      "sha256": _sha256(weights)}}
    tokenizer = load_tokenizer(folder)
    recorded = manifest["tokenizer"]
    # The WordPiece trainer numbers its special tokens first, in the order given.
    assert recorded["special_tokens"] == {"cls_token": ["[CLS]", 2], "sep_token": ["[SEP]", 3],
                                          "pad_token": ["[PAD]", 0], "unk_token": ["[UNK]", 1]}
    assert recorded["pair_layout"] == [2, [3], 3] and recorded["size"] == len(tokenizer)
    # The open-domain caches' fingerprint of the same tokenizer, after its class-name prefix.
    assert tokenizer_fingerprint(tokenizer).endswith(":" + recorded["vocabulary"])
    assert recorded["files"] == {name: _sha256(folder / name) for name in
                                 ("tokenizer.json", "tokenizer_config.json")
                                 if (folder / name).is_file()}
    assert "tokenizer.json" in recorded["files"]
    load_reader(str(folder), None, 8)  # its own files pass their own record


def test_the_same_vocabulary_from_other_files_is_accepted():
    """The bundled readers were trained with the embedded MiniLM's tokenizer ("default", other
    file bytes): the same vocabulary and special tokens, so it is this reader's."""
    tokenizer = load_reader(str(FULL), None, 16, "default").tokenizer
    assert tokenizer.sep_token_id == 102


def _permuted_tokenizer(source: Path, target: Path, a: str = "the", b: str = "of") -> Path:
    """A copy of source's tokenizer with the ids of tokens a and b swapped: same size, same
    special tokens, another vocabulary."""
    target.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, target / name)
    definition = json.loads((target / "tokenizer.json").read_text())
    vocab = definition["model"]["vocab"]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (target / "tokenizer.json").write_text(json.dumps(definition))
    return target


def test_predict_refuses_a_permuted_tokenizer_given_with_the_flag(tmp_path, capsys):
    tokenizer = _permuted_tokenizer(FULL, tmp_path / "permuted")
    status, err, output = _predict(FULL, tmp_path, capsys, "--tokenizer", str(tokenizer))
    assert status == 1, err
    assert f"dil-jax predict: error: {tokenizer}: not the tokenizer the reader was exported " \
           "with (vocabulary " in err, err
    assert f"recorded in {FULL / MANIFEST}" in err and "leave out --tokenizer" in err, err
    assert "Traceback" not in err and not output.exists()


def test_a_reader_without_a_tokenizer_record_checks_a_given_one_against_its_own(
        tmp_path, capsys):
    """An older export records no tokenizer: with a permuted vocabulary predict exited 0 at EM
    7.1 (85.7 with its own). Its own tokenizer.json is the record then."""
    folder = tmp_path / "older"
    shutil.copytree(FULL, folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest.pop("tokenizer")  # as exported before manifests recorded the tokenizer
    (folder / MANIFEST).write_text(json.dumps(manifest))
    tokenizer = _permuted_tokenizer(FULL, tmp_path / "permuted")
    status, err, output = _predict(folder, tmp_path, capsys, "--tokenizer", str(tokenizer))
    assert status == 1, err
    assert f"dil-jax predict: error: {tokenizer}: not the tokenizer the reader was exported " \
           "with (vocabulary " in err, err
    assert f"recorded in {folder / 'tokenizer.json'}" in err, err
    assert "Traceback" not in err and not output.exists()
    # The same vocabulary from other files (the embedded MiniLM's) is still this reader's.
    assert load_reader(str(folder), None, 16, "default").tokenizer.sep_token_id == 102


def test_a_reader_whose_own_tokenizer_files_changed_is_refused(tmp_path):
    folder = tmp_path / "reader"
    shutil.copytree(FULL, folder)
    _permuted_tokenizer(FULL, folder)  # in place: the folder's own files
    with pytest.raises(TokenizationError, match=r"vocabulary .*tokenizer files changed after "
                                                r"export"):
        load_reader(str(folder), None, 16)


def test_a_tokenizer_without_sep_is_refused_by_name_without_any_manifest(tmp_path):
    """Without [SEP] transformers appends it as a new token, id 30521, which still fits
    MiniLM's 30522 rows: the size checks passed it and every window ended with a row the model
    never learned as [SEP]."""
    folder = tmp_path / "tok"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FULL / name, folder / name)
    definition = json.loads((folder / "tokenizer.json").read_text())
    del definition["model"]["vocab"]["[SEP]"]
    definition["added_tokens"] = [t for t in definition["added_tokens"]
                                  if t["content"] != "[SEP]"]
    (folder / "tokenizer.json").write_text(json.dumps(definition))
    with pytest.raises(TokenizationError) as error:
        load_tokenizer(folder, vocab_size=30522, architecture="bert")
    message = str(error.value)
    assert message.startswith(f"{folder}: the tokenizer's sep_token '[SEP]' is not in its "
                              "vocabulary"), message
    assert "id 30521" in message


# ----------------------------------------------------------------- 3. a QA head that was trained


def test_predict_refuses_a_checkpoint_without_a_qa_head(tmp_path, capsys):
    """The embedded default MiniLM has no QA head: its answers are arbitrary spans."""
    status, err, output = _predict("default", tmp_path, capsys)
    assert status == 1, err
    assert "dil-jax predict: error: checkpoint 'default' has no QA head" in err, err
    assert "fine-tuned" in err and "--allow-untrained-head" in err, err
    assert "Traceback" not in err and not output.exists()
    status, err, output = _predict("default", tmp_path, capsys, "--allow-untrained-head")
    assert status == 0, err
    assert set(json.loads(output.read_text())) == {"q1"}


# ----------------------------------------------------------------- 4. text that is not Unicode


def test_a_lone_surrogate_in_a_squad_question_is_named(tmp_path, capsys):
    squad = one_question_squad(tmp_path, question="When was the \ud800 tower built?")
    status, err, output = _predict(FULL, tmp_path, capsys, squad=squad)
    assert status == 1, err
    assert f"dil-jax predict: error: {squad}: question 'q1': field 'question': a lone " \
           "surrogate '\\ud800' at character 13" in err, err
    assert "Traceback" not in err and not output.exists()


def test_a_lone_surrogate_in_a_question_to_encode_is_named():
    tokenizer = load_tokenizer(FULL)
    with pytest.raises(TokenizationError, match=r"question 1: a lone surrogate '\\udcff' at "
                                                r"character 4"):
        encode_questions(tokenizer, ["fine", "bad \udcff byte"], 16)


def test_ask_names_a_lone_surrogate_before_loading_anything(tmp_path, capsys):
    status, _, err = run_cli(["ask", "who \udcff?", "--index", str(tmp_path / "none")], capsys)
    assert status == 1, err
    assert "a lone surrogate '\\udcff' at character 4" in err and "Traceback" not in err, err


def test_errors_here_are_dil_jax_errors():
    assert issubclass(TokenizationError, DilJaxError) and issubclass(CheckpointError, DilJaxError)


# ----------------------------------------------------------------- 5. outputs that are not files


def test_predict_to_dev_full_is_a_named_error_and_dev_null_stays_a_device(tmp_path, capsys):
    """`predict --output /dev/full` (as root) replaced the device node with a regular file and
    exited 0. Reached here through symlinks in tmp_path, so the real nodes are never at risk."""
    import os
    import stat

    def char_device(path: str) -> bool:
        return os.path.exists(path) and stat.S_ISCHR(os.stat(path).st_mode)

    assert char_device("/dev/null") and char_device("/dev/full")
    full, null = tmp_path / "full.json", tmp_path / "null.json"
    full.symlink_to("/dev/full")
    null.symlink_to("/dev/null")
    squad = one_question_squad(tmp_path)

    def predict(output: Path) -> tuple[int, str]:
        status, _, err = run_cli(["predict", "--checkpoint", str(FULL), "--data", str(squad),
                                  "--output", str(output), "--no-progress",
                                  "--max-question-len", "16", "--max-passage-len", "32",
                                  "--doc-stride", "16"], capsys)
        return status, err

    status, err = predict(full)
    assert status == 1, err
    assert f"dil-jax predict: error: {full}: cannot write it: No space left on device " \
           "(ENOSPC)" in err and "Traceback" not in err, err
    status, err = predict(null)
    assert status == 0, err
    assert full.is_symlink() and null.is_symlink()
    assert char_device("/dev/null") and char_device("/dev/full")
