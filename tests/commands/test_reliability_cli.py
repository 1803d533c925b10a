"""Command-line flags and output paths: bad values and bad outputs are refused up front.

Every flag with a range is checked where argparse parses it (exit 2, naming the flag and the
value); relations between flags and output locations are checked before any model, index or
corpus is loaded (exit 1, naming the flags / path), and never at the cost of an input file.
Heavy entry points are replaced by `_no_work` so that a check that came too late fails the test
at once instead of running a model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import CONFIGS, run_cli

SQUAD = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{
    "context": "Paris is in France.",
    "qas": [{"id": "q1", "question": "Where is Paris?",
             "answers": [{"text": "France", "answer_start": 12}]}]}]}]}


class WorkStarted(AssertionError):
    """A command began loading a model, index or corpus before refusing its flags."""


@pytest.fixture
def _no_work(monkeypatch):
    """Makes every heavy entry point fail loudly: the checks under test must come first."""
    # Modules that bind a patched name at import (`from ... import build_index`) are imported
    # first: imported for the first time inside a patched test, they would keep `refuse` for
    # every later test of the session.
    import dil_jax.open_domain.build
    import dil_jax.open_domain.index.verify  # noqa: F401
    from dil_jax import bench, checkpoints, readers
    from dil_jax.open_domain.index import folder as index
    from dil_jax.prescreening import prescreener
    from dil_jax.readers import request
    from dil_jax.train import loop

    def refuse(*args, **kwargs):
        raise WorkStarted("work started before the flags were checked")

    for module, name in ((readers, "load_reader"), (request, "load_reader"),
                         (checkpoints, "load_hf_checkpoint"),
                         (checkpoints, "resolve_checkpoint"), (bench, "suite_model"),
                         (bench, "run_suite"), (index, "open_index"), (index, "build_index"),
                         (prescreener, "load_sentence_encoder"),
                         (prescreener.SentencePrescreener, "load"), (loop, "train")):
        monkeypatch.setattr(module, name, refuse)


@pytest.fixture
def squad_file(tmp_path) -> Path:
    path = tmp_path / "data.json"
    path.write_text(json.dumps(SQUAD))
    return path


# ------------------------------------------------------------------------ ranges (argparse, 2)

RANGE_CASES = [
    # (command and its required arguments, flag, bad value(s), the rejected value)
    ("predict --data D --output O", "--batch-size", ["0"], "0"),
    ("predict --data D --output O", "--limit", ["-2"], "-2"),
    ("predict --data D --output O", "--limit", ["0"], "0"),
    ("predict --data D --output O", "--k", ["-1"], "-1"),
    ("predict --data D --output O", "--max-question-len", ["0"], "0"),
    ("predict --data D --output O", "--max-passage-len", ["1"], "1"),
    ("predict --data D --output O", "--doc-stride", ["0"], "0"),
    ("predict --data D --output O", "--max-answer-length", ["0"], "0"),
    ("predict --data D --output O", "--n-best", ["0"], "0"),
    ("predict --data D --output O", "--null-threshold", ["nan"], "nan"),
    ("predict --data D --output O", "--top-m", ["0"], "0"),
    ("predict --data D --output O", "--mass", ["0"], "0"),
    ("predict --data D --output O", "--mass", ["1.5"], "1.5"),
    ("check", "--k", ["4", "-1"], "-1"),
    ("check", "--repeats", ["0"], "0"),
    ("check", "--max-question-len", ["0"], "0"),
    ("check", "--max-passage-len", ["1"], "1"),
    ("index --out O --corpus wikipedia", "--corpus-limit", ["0"], "0"),
    ("index --out O --corpus wikipedia", "--max-passage-len", ["0"], "0"),
    ("index --out O --corpus wikipedia", "--doc-stride", ["-5"], "-5"),
    ("index --out O --corpus wikipedia", "--k", ["0", "-4"], "-4"),
    ("index --out O --corpus wikipedia", "--batch-size", ["0"], "0"),
    ("index --out O --corpus wikipedia", "--chunk-size", ["0"], "0"),
    ("index --out O --corpus wikipedia", "--max-question-len", ["-1"], "-1"),
    ("ask q --index I", "--top-p", ["0"], "0"),
    ("ask q --index I", "--top-p", ["-3"], "-3"),
    ("ask q --index I", "--mu", ["1.5"], "1.5"),
    ("ask q --index I", "--mu", ["-0.1"], "-0.1"),
    ("ask q --index I", "--k", ["-1"], "-1"),
    ("ask q --index I", "--chunk-size", ["0"], "0"),
    ("ask q --index I", "--top-m", ["0"], "0"),
    ("odqa-eval --index I --data D", "--p", ["29", "0"], "0"),
    ("odqa-eval --index I --data D", "--limit", ["-1"], "-1"),
    ("odqa-eval --index I --data D", "--seed", ["-1"], "-1"),
    ("odqa-eval --index I --data D", "--mu", ["2"], "2"),
    ("odqa-eval --index I --data D", "--k", ["-2"], "-2"),
    ("odqa-eval --index I --data D", "--batch-size", ["0"], "0"),
    ("demo", "--top-p", ["0"], "0"),
    ("demo", "--k", ["0"], "0"),
    ("demo", "--distractors", ["-1"], "-1"),
    ("demo", "--mu", ["inf"], "inf"),
    ("demo", "--doc-stride", ["0"], "0"),
    ("demo", "--max-passage-len", ["1"], "1"),
    ("demo", "--max-question-len", ["0"], "0"),
    ("bench --suite tiny --no-hf --out O", "--questions", ["0"], "0"),
    ("bench --suite tiny --no-hf --out O", "--passages", ["-1"], "-1"),
    ("bench --suite tiny --no-hf --out O", "--question-len", ["0"], "0"),
    ("bench --suite tiny --no-hf --out O", "--passage-len", ["0"], "0"),
    ("bench --suite tiny --no-hf --out O", "--repeats", ["0"], "0"),
    ("bench --suite tiny --no-hf --out O", "--chunk-size", ["0"], "0"),
    ("bench --suite tiny --no-hf --out O", "--batch-size", ["0"], "0"),
    ("bench --suite tiny --no-hf --out O", "--ks", ["1,-1"], "-1"),
    ("bench --suite tiny --no-hf --out O", "--seed", ["-1"], "-1"),
    ("bench --suite tiny --no-hf --out O", "--name", ["../x"], "../x"),
    ("prescreen --config C", "--top-m", ["1", "0"], "0"),
    ("prescreen --config C", "--mass", ["0.5", "1.5"], "1.5"),
    ("prescreen --config C", "--eval-limit", ["0"], "0"),
    ("prescreen --config C", "--max-passage-len", ["1"], "1"),
]


@pytest.mark.parametrize("command, flag, values, rejected", RANGE_CASES,
                         ids=[f"{c.split()[0]}{f}={'_'.join(v)}" for c, f, v, _ in RANGE_CASES])
def test_out_of_range_flag_exits_2_naming_flag_and_value(command, flag, values, rejected,
                                                          capsys, _no_work, tmp_path):
    argv = [str(tmp_path / part) if part in ("D", "O", "I", "C") else part
            for part in command.split()] + [flag, *values]
    status, _, err = run_cli(argv, capsys)
    assert status == 2, err
    assert f"argument {flag}" in err and repr(rejected) in err, err


# ----------------------------------------------------------- relations between flags (UsageError)

RELATION_CASES = [
    (["predict", "--data", "D", "--output", "O", "--max-passage-len", "128", "--doc-stride",
      "128"], ["--doc-stride 128", "--max-passage-len 128"]),
    (["index", "--out", "O", "--corpus", "wikipedia", "--max-passage-len", "64", "--doc-stride",
      "100"], ["--doc-stride 100", "--max-passage-len 64"]),
    (["demo", "--index", "O", "--max-passage-len", "64", "--doc-stride", "64"],
     ["--doc-stride 64", "--max-passage-len 64"]),
    (["ask", "--index", "I"], ["give a question", "--interactive"]),
]


@pytest.mark.parametrize("argv, wanted", RELATION_CASES,
                         ids=[f"{a[0]}-{i}" for i, (a, _) in enumerate(RELATION_CASES)])
def test_flag_relations_refused_before_any_work(argv, wanted, capsys, _no_work, tmp_path,
                                                squad_file):
    names = {"D": str(squad_file), "O": str(tmp_path / "out"), "I": str(tmp_path / "index")}
    status, _, err = run_cli([names.get(part, part) for part in argv], capsys)
    assert status == 1, err
    assert err.startswith(f"dil-jax {argv[0]}: error: "), err
    for fragment in wanted:
        assert fragment in err, err


def _reported_error(argv: list[str]):
    """The error `dil-jax ARGV` reports, raised as the CLI's function raises it (the CLI prints
    only a DilJaxError without a traceback; anything else is a bug with one)."""
    from dil_jax.cli import build_parser

    args, extra = build_parser().parse_known_args(argv)
    args.extra_args = extra
    with pytest.raises(Exception) as caught:
        args.func(args)
    return caught.value


@pytest.mark.parametrize("command", ["index --out O --corpus wikipedia",
                                     "odqa-eval --index I --data D"])
def test_checkpoint_count_is_a_usage_error_naming_both_flags(command, _no_work, tmp_path,
                                                             squad_file):
    from dil_jax.errors import UsageError

    names = {"D": str(squad_file), "O": str(tmp_path / "out"), "I": str(tmp_path / "index")}
    argv = [names.get(part, part) for part in command.split()]
    error = _reported_error(argv + ["--k", "0", "4", "--checkpoint", "a", "b", "c"])
    assert isinstance(error, UsageError), repr(error)
    assert "--checkpoint has 3 values" in str(error) and "--k has 2" in str(error)


def test_check_k_beyond_the_checkpoint_names_flag_and_blocks(capsys):
    status, _, err = run_cli(["check", "--k", "3", "6"], capsys)  # MiniLM: l = 6
    assert status == 1, err
    assert "--k 6" in err and "0..5" in err, err


# ------------------------------------------------------------------ predict --output (probe 1)

def _output_variants(tmp_path: Path, data: Path) -> dict[str, Path]:
    (tmp_path / "sub").mkdir()
    link = tmp_path / "link.json"
    link.symlink_to(data)
    return {"same path": data, "through ..": tmp_path / "sub" / ".." / data.name,
            "symlink": link}


@pytest.mark.parametrize("variant", ["same path", "through ..", "symlink"])
def test_predict_refuses_to_write_over_its_data(variant, capsys, _no_work, tmp_path,
                                                squad_file):
    before = squad_file.read_bytes()
    output = _output_variants(tmp_path, squad_file)[variant]
    status, _, err = run_cli(["predict", "--data", str(squad_file), "--output", str(output)],
                             capsys)
    assert status == 1, err
    assert f"--output {output}" in err and "--data" in err and "overwrite the input" in err, err
    assert squad_file.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.json", "link.json", "sub"]


def test_predict_refuses_a_folder_as_output_before_loading_the_model(capsys, _no_work,
                                                                     tmp_path, squad_file):
    folder = tmp_path / "preds"
    folder.mkdir()
    status, _, err = run_cli(["predict", "--data", str(squad_file), "--output", str(folder)],
                             capsys)
    assert status == 1, err
    assert f"--output {folder} is a folder" in err, err
    assert list(folder.iterdir()) == []


def test_predict_refuses_an_output_whose_folder_cannot_be_created(capsys, _no_work, tmp_path,
                                                                  squad_file):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("keep me")
    output = blocker / "run" / "preds.json"
    status, _, err = run_cli(["predict", "--data", str(squad_file), "--output", str(output)],
                             capsys)
    assert status == 1, err
    assert f"--output {output}" in err and f"{blocker} is a file" in err, err
    assert blocker.read_text() == "keep me"


def test_output_checks_read_only_folder(tmp_path):
    """os.access decides; as root every folder is writable, so the refusal is checked with a
    stand-in for os.access."""
    from unittest import mock

    from dil_jax.atomic import check_output_folder, check_output_path
    from dil_jax.errors import OutputPathError

    with mock.patch("dil_jax.atomic.os.access", return_value=False):
        with pytest.raises(OutputPathError, match=r"--output .*not writable"):
            check_output_path(tmp_path / "new" / "preds.json", "--output")
        with pytest.raises(OutputPathError, match=r"--out .*not writable"):
            check_output_folder(tmp_path, "--out", files=["results.md"])


# ----------------------------------------------------------------------- other output folders

def test_odqa_eval_refuses_out_that_would_overwrite_data(capsys, _no_work, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    data = out / "results.json"
    data.write_text(json.dumps(SQUAD))
    status, _, err = run_cli(["odqa-eval", "--index", str(tmp_path / "index"), "--data",
                              str(data), "--out", str(out)], capsys)
    assert status == 1, err
    assert "--out" in err and "results.json" in err and "--data" in err, err
    assert json.loads(data.read_text()) == SQUAD


def test_odqa_eval_refuses_a_file_as_out(capsys, _no_work, tmp_path, squad_file):
    blocker = tmp_path / "results"
    blocker.write_text("x")
    status, _, err = run_cli(["odqa-eval", "--index", str(tmp_path / "index"), "--data",
                              str(squad_file), "--out", str(blocker)], capsys)
    assert status == 1, err
    assert f"--out {blocker} is a file, not a folder" in err, err


@pytest.mark.parametrize("command", ["index", "demo"])
def test_index_folder_of_other_files_is_never_replaced(command, capsys, _no_work, tmp_path):
    folder = tmp_path / "papers"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    argv = (["index", "--out", str(folder), "--corpus", "wikipedia"] if command == "index"
            else ["demo", "--index", str(folder)])
    status, _, err = run_cli(argv, capsys)
    assert status == 1, err
    if command == "index":  # built in place under its lock, which names what is foreign
        assert str(folder) in err and "not an index folder" in err and "thesis.tex" in err, err
    else:
        assert f"--index {folder}" in err and "not empty" in err and "index.json" in err, err
    assert (folder / "thesis.tex").read_text() == "years of work"


def test_index_refuses_out_holding_its_corpus(capsys, _no_work, tmp_path):
    folder = tmp_path / "idx"
    folder.mkdir()
    corpus = folder / "docs.jsonl"
    corpus.write_text('{"title": "a", "text": "b"}\n')
    status, _, err = run_cli(["index", "--out", str(folder), "--corpus", f"jsonl:{corpus}"],
                             capsys)
    assert status == 1, err
    assert str(folder) in err and "docs.jsonl" in err and "--out" in err, err
    assert corpus.is_file()


def test_bench_refuses_unwritable_out_before_timing(capsys, _no_work, tmp_path):
    blocker = tmp_path / "results"
    blocker.write_text("x")
    status, _, err = run_cli(["bench", "--suite", "tiny", "--no-hf", "--out", str(blocker)],
                             capsys)
    assert status == 1, err
    assert f"--out {blocker} is a file, not a folder" in err, err


def test_prescreen_training_refuses_workdir_holding_its_data(capsys, _no_work, tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    data = workdir / "squad.json"
    data.write_text(json.dumps(SQUAD))
    config = CONFIGS / "prescreen.py"
    status, _, err = run_cli(["prescreen", "--config", str(config),
                              f"--config.workdir={workdir}", f"--config.data.file={data}"],
                             capsys)
    assert status == 1, err
    assert f"--config.workdir {workdir}" in err and "--config.data.file" in err, err
    assert json.loads(data.read_text()) == SQUAD


def test_train_refuses_a_file_as_workdir(capsys, _no_work, tmp_path):
    blocker = tmp_path / "run"
    blocker.write_text("x")
    config = CONFIGS / "tiny.py"
    status, _, err = run_cli(["train", "--config", str(config), f"--config.workdir={blocker}"],
                             capsys)
    assert status == 1, err
    assert f"--config.workdir {blocker} is a file" in err, err
    assert blocker.read_text() == "x"



def test_train_refuses_its_model_checkpoint_as_workdir(capsys, _no_work, tmp_path, minilm_dir):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text((minilm_dir / "config.json").read_text())
    config = CONFIGS / "tiny.py"
    status, _, err = run_cli(["train", "--config", str(config), f"--config.workdir={checkpoint}",
                              f"--config.model.checkpoint={checkpoint}"], capsys)
    assert status == 1, err
    assert f"--config.workdir {checkpoint} is the --config.model.checkpoint input" in err, err
    assert sorted(p.name for p in checkpoint.iterdir()) == ["config.json"]

# ------------------------------------------------------------------------- evaluate (probe 2)

@pytest.mark.parametrize("flag", ["--data", "--predictions"])
def test_evaluate_names_a_folder_given_as_a_file(flag, capsys, tmp_path, squad_file):
    predictions = tmp_path / "preds.json"
    predictions.write_text(json.dumps({"q1": "France"}))
    folder = tmp_path / "folder"
    folder.mkdir()
    files = {"--data": str(squad_file), "--predictions": str(predictions), flag: str(folder)}
    status, _, err = run_cli(["evaluate", *[x for kv in files.items() for x in kv]], capsys)
    assert status == 1, err
    assert f"{flag} {folder} is a folder, not a" in err, err


@pytest.mark.parametrize("content, wanted", [("{not json", "not valid JSON"),
                                             ("[]", "expected a JSON object"),
                                             ('{"q1": 3}', "answer must be a string")])
def test_evaluate_bad_predictions_are_input_file_errors(content, wanted, tmp_path, squad_file):
    from dil_jax.errors import InputFileError

    predictions = tmp_path / "preds.json"
    predictions.write_text(content)
    error = _reported_error(["evaluate", "--data", str(squad_file), "--predictions",
                             str(predictions)])
    assert isinstance(error, InputFileError), repr(error)
    assert f"{predictions}" in str(error) and wanted in str(error)


# ------------------------------------------------------------- library errors users can reach

def test_reachable_value_errors_are_dil_jax_errors():
    from dil_jax.errors import DilJaxError
    from dil_jax.metrics.squad_metric import squad_scores
    from dil_jax.prescreening.screen import SentenceRule

    with pytest.raises(DilJaxError, match=r"--top-m\) must be >= 1, got 0"):
        SentenceRule(top_m=0)
    with pytest.raises(DilJaxError, match=r"--mass\) must be in \(0, 1\], got 2"):
        SentenceRule(top_m=None, mass=2)
    with pytest.raises(DilJaxError, match="version must be"):
        squad_scores({}, {}, version="3.0")
    with pytest.raises(DilJaxError, match="no questions to score"):
        squad_scores({}, {}, version="1.1")


def test_staged_directory_refusal_is_an_output_path_error(tmp_path):
    from dil_jax.atomic import staged_directory
    from dil_jax.errors import OutputPathError

    with pytest.raises(OutputPathError, match="refusing to overwrite"), \
            staged_directory(tmp_path, overwrite=False):
        pass


@pytest.mark.parametrize("command", ["prescreen", "train"])
def test_unknown_argument_is_a_usage_error(command, _no_work):
    from dil_jax.errors import UsageError

    config = CONFIGS / f"{command}.py"
    if command == "train":
        config = config.with_name("tiny.py")
    error = _reported_error([command, "--config", str(config), "--bogus"])
    assert isinstance(error, UsageError), repr(error)
    assert "unrecognized arguments: --bogus" in str(error)
