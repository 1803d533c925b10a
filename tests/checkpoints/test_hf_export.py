"""The bundled readers and transformers (issue 59, BAD 3 and 4).

A bundled reader leaves its word embeddings to the embedded MiniLM. Stored as a Hugging Face
`model.safetensors`, transformers loaded it with one "MISSING" line and random word embeddings and
answered wrongly; now its weights file has a name transformers does not look for, so it refuses
the folder, and `dil-jax export --format hf` writes the complete folder transformers reads, with
dil_jax's start/end logits (compared here with transformers itself, the independent reference).
And `dil-jax check`, the documented parity check, ended in a TypeError on the bundled readers'
bfloat16 weights: it now checks them.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from dil_jax.checkpoints import MANIFEST_FILE, PARTIAL_SAFETENSORS_FILE, SAFETENSORS_FILE
from dil_jax.commands.check import parity_tolerance
from dil_jax.model.encoder_config import ReaderOverrides
from dil_jax.readers import load_reader
from dil_jax.tokenization import encode_passages, encode_questions, load_tokenizer

from tests.helpers import ASSETS, V11, run_cli, squad_file

BUNDLED = ("minilm-squad-full", "minilm-squad-k2", "minilm-squad-k4")
FULL = ASSETS / "minilm-squad-full"
K2 = ASSETS / "minilm-squad-k2"
PASSAGE_LEN = 160  # the bundled readers' training windows


def _export(checkpoint: Path, out: Path, capsys, *extra: str) -> tuple[int, str, str]:
    return run_cli(["export", "--format", "hf", "--checkpoint", str(checkpoint), "--out",
                    str(out), *extra], capsys)


@pytest.fixture(scope="module")
def full_export(tmp_path_factory) -> Path:
    """The bundled full reader exported by `dil-jax export --format hf` (run once)."""
    from dil_jax.cli import main

    out = tmp_path_factory.mktemp("export") / "full-hf"
    assert main(["export", "--format", "hf", "--checkpoint", str(FULL), "--out", str(out)]) == 0
    return out


def _real_pair() -> tuple[str, str]:
    """The first question of the shared dev file and its paragraph."""
    paragraph = json.loads(squad_file(V11).read_text())["data"][0]["paragraphs"][0]
    return paragraph["qas"][0]["question"], paragraph["context"]


# ------------------------------------------------------------ the bundled folders themselves


@pytest.mark.parametrize("name", BUNDLED)
def test_transformers_refuses_a_bundled_reader_folder(name):
    """It loaded them with random word embeddings (start logits off by up to 10.7)."""
    from transformers import AutoModelForQuestionAnswering

    folder = ASSETS / name
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    assert manifest["from_base"] == ["bert.embeddings.word_embeddings.weight"]  # why it must
    with pytest.raises(OSError, match=f"no file named {SAFETENSORS_FILE}"):
        AutoModelForQuestionAnswering.from_pretrained(str(folder))
    assert (folder / PARTIAL_SAFETENSORS_FILE).is_file()  # dil_jax's loaders read this one


# ------------------------------------------------------------ dil-jax export --format hf


def test_the_export_loads_in_transformers_with_the_readers_logits(full_export):
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    hf_model, info = AutoModelForQuestionAnswering.from_pretrained(
        str(full_export), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    with safe_open(str(full_export / SAFETENSORS_FILE), framework="numpy") as weights:
        assert "bert.embeddings.word_embeddings.weight" in set(weights.keys())
        assert {weights.get_slice(name).get_dtype() for name in weights.keys()} == {"F32"}
    assert hf_model.dtype == torch.float32

    reader = load_reader(FULL)  # dil_jax's own reader of the bundled folder
    question, context = _real_pair()
    q = encode_questions(reader.tokenizer, [question], reader.config.max_question_len)
    p = encode_passages(reader.tokenizer, [context], PASSAGE_LEN)
    ours = reader.model(reader.params, q.ids, q.mask, p.ids, p.mask)
    nq, n_p = int(q.mask.sum()), int(p.mask.sum())
    # transformers' own tokenizer of the export makes the same `[CLS] q [SEP] p [SEP]`.
    encoded = AutoTokenizer.from_pretrained(str(full_export))(
        question, context, truncation="only_second", max_length=nq + n_p, return_tensors="pt")
    assert encoded["input_ids"][0].tolist() == [*q.ids[0, :nq], *p.ids[0, :n_p]]
    hf_model.eval()
    with torch.no_grad():
        theirs = hf_model(**encoded)
    for mine, their in ((ours.start_logits, theirs.start_logits),
                        (ours.end_logits, theirs.end_logits)):
        reference = their[0, nq:].numpy()
        assert np.abs(reference).max() > 3  # a trained head: the tolerance scales with this
        np.testing.assert_allclose(np.asarray(mine[0, :n_p]), reference, rtol=0,
                                   atol=parity_tolerance(reference))
    np.testing.assert_allclose(float(ours.null_start_logits[0]), theirs.start_logits[0, 0].item(),
                               rtol=0, atol=parity_tolerance(theirs.start_logits[0].numpy()))


def test_a_delayed_reader_exports_with_a_warning_and_reads_back_as_itself(tmp_path, capsys,
                                                                          caplog):
    from transformers import AutoModelForQuestionAnswering

    out = tmp_path / "k2-hf"
    with caplog.at_level(logging.WARNING, logger="dil_jax.commands.export"):
        status, stdout, err = _export(K2, out, capsys)
    assert status == 0, err
    assert f"{out}: a complete Hugging Face folder" in stdout, stdout
    assert "delayed reader (k = 2 of 6)" in caplog.text and "as dil_jax does at k = 0" in \
        caplog.text, caplog.text
    _, info = AutoModelForQuestionAnswering.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    # dil_jax reads the export as the same reader: k, passage offset, weights, records.
    exported, bundled = load_reader(out), load_reader(K2)
    assert exported.config == bundled.config and exported.config.num_lower_layers == 2
    for a, b in _leaves(exported.params, bundled.params):
        np.testing.assert_array_equal(a, b)
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    source = json.loads((K2 / MANIFEST_FILE).read_text())
    assert "from_base" not in manifest and manifest["stored_dtype"] == "float32"
    assert all(manifest[key] == source[key] for key in ("final_eval", "training_config", "note"))
    assert manifest["exported_from"] == {"checkpoint": str(K2), "weights": source["weights"]}
    assert list(manifest["weights"]) == [SAFETENSORS_FILE]


def _leaves(a, b):
    import jax

    return zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)


def test_a_training_export_exports_with_the_tokenizer_given(hf_folder_factory, tmp_path,
                                                           capsys):
    """A `dil-jax train` export (orbax params/, no tokenizer files) needs --tokenizer; with it,
    the folder transformers loads holds every tensor and reads back in dil_jax as the same
    reader (k = 1)."""
    from transformers import AutoModelForQuestionAnswering

    from dil_jax.checkpoints import load_hf_checkpoint, save_params

    from tests.helpers.hf import save_fast_tokenizer

    config, params, _ = load_hf_checkpoint(hf_folder_factory("bert")[0],
                                           ReaderOverrides(max_question_len=8, num_lower_layers=1))
    params_dir = save_params(tmp_path / "run" / "params", params, config)
    texts = ["the tower was built in paris in 1889", "who built the tower and when"] * 20
    save_fast_tokenizer("electra", texts, 99, tmp_path / "tok")
    status, _, err = _export(params_dir, tmp_path / "no-tok", capsys)
    assert status == 1 and "without tokenizer files" in err and "--tokenizer" in err, err
    assert not (tmp_path / "no-tok").exists()
    out = tmp_path / "hf"
    status, _, err = _export(params_dir, out, capsys, "--tokenizer", str(tmp_path / "tok"))
    assert status == 0, err
    _, info = AutoModelForQuestionAnswering.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    exported = load_reader(out)
    given = load_tokenizer(tmp_path / "tok")
    assert exported.config == config and exported.tokenizer.get_vocab() == given.get_vocab()
    for a, b in _leaves(exported.params, params):
        np.testing.assert_array_equal(a, b)


def test_export_refuses_outputs_that_would_destroy_something(tmp_path, capsys):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    cases = [
        (foreign, "is a folder that is not empty"),
        (K2, "is the --checkpoint input"),
        (K2 / "hf", "lies inside the --checkpoint folder"),
    ]
    before = sorted(path.name for path in K2.iterdir())
    for out, problem in cases:
        status, _, err = _export(K2, out, capsys)
        assert status == 1, err
        line = err.strip().splitlines()[-1]
        assert line.startswith(f"dil-jax export: error: --out {out}") and problem in line, err
    assert (foreign / "notes.txt").read_text() == "mine" and len(list(foreign.iterdir())) == 1
    assert sorted(path.name for path in K2.iterdir()) == before
    status, _, err = _export(K2, tmp_path / "x", capsys, "--format", "onnx")
    assert status == 2 and "--format: invalid choice: 'onnx'" in err, err


def test_export_refuses_a_checkpoint_without_a_qa_head(tmp_path, capsys):
    status, _, err = _export(Path("default"), tmp_path / "out", capsys)
    assert status == 1 and "has no QA head" in err and "--allow-untrained-head" in err, err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------ dil-jax check


def test_check_checks_a_bundled_reader_against_transformers(capsys):
    """It ended in `TypeError: Got unsupported ScalarType BFloat16`; a delayed reader's parity
    is of its full model (k = 0), the one transformers runs."""
    status, out, err = run_cli(["check", "--checkpoint", str(ASSETS / "minilm-squad-k4"),
                                "--k", "1", "--repeats", "1", "--max-passage-len", "48"], capsys)
    assert status == 0, out + err
    line = next(line for line in out.splitlines() if line.startswith("parity vs Hugging Face"))
    assert "read from its complete float32 export" in line and line.endswith("[OK]"), line
    assert "at random" not in line
