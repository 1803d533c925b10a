"""tools/bundle_readers.py records a bundled reader's whole lineage: every run whose export the
bundled run started from (`model.checkpoint` = that run's params/), with each run's exported
step and that step's scores, newest first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import load_script

bundle_readers = load_script("tools/bundle_readers.py")


def _run(workdir: Path, starts_from: str, exported_step: int, f1_by_step: dict[int, float]) -> Path:
    """A finished run's workdir as the trainer leaves it; returns its params/ folder."""
    params = workdir / "params"
    params.mkdir(parents=True)
    (params / "encoder_config.json").write_text("{}")
    (params / "trained_from.json").write_text(json.dumps({"step": exported_step}))
    (workdir / "config.json").write_text(json.dumps({"model": {"checkpoint": starts_from}}))
    lines = [{"step": step, "split": "eval", "f1": f1} for step, f1 in f1_by_step.items()]
    (workdir / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return params


def test_lineage_lists_each_earlier_run_with_its_exported_step(tmp_path):
    first = _run(tmp_path / "first", "dil_jax/assets/minilm-squad-full", 1000,
                 {500: 66.0, 1000: 69.0, 1464: 68.6})
    second = _run(tmp_path / "second", str(first), 500, {250: 66.7, 500: 69.6, 600: 69.4})
    third = _run(tmp_path / "third", str(second), 250, {250: 70.0})

    stages = bundle_readers.earlier_stages(bundle_readers.run_record(third))

    assert [stage["params_dir"] for stage in stages] == [str(second), str(first)]
    # Each stage's scores are those of its exported step, not of its last evaluation.
    assert [stage["final_eval"]["f1"] for stage in stages] == [69.6, 69.0]
    assert [stage["trained_from"]["step"] for stage in stages] == [500, 1000]
    # The first run started from a folder that is not a run's params/ (a bundled reader): the
    # chain ends there.
    assert stages[-1]["training_config"]["model"]["checkpoint"] == \
        "dil_jax/assets/minilm-squad-full"


def test_a_run_from_the_base_model_has_no_earlier_stage_and_a_loop_ends(tmp_path):
    alone = _run(tmp_path / "alone", "default", 10, {10: 1.0})
    assert bundle_readers.earlier_stages(bundle_readers.run_record(alone)) == []

    # Two workdirs naming each other (only possible by hand-editing configs) must not hang.
    a = _run(tmp_path / "a", str(tmp_path / "b" / "params"), 1, {1: 1.0})
    b = _run(tmp_path / "b", str(a), 1, {1: 2.0})
    stages = bundle_readers.earlier_stages(bundle_readers.run_record(b))
    assert [stage["params_dir"] for stage in stages] == [str(a)]


def test_a_reader_of_the_wrong_k_for_its_role_is_refused_before_anything_is_written(
        tmp_path, monkeypatch, capsys):
    written = []
    monkeypatch.setattr(bundle_readers, "bundle", lambda *args: written.append(args))
    full = _run(tmp_path / "full", "default", 1, {1: 1.0})
    k4 = _run(tmp_path / "k4", "default", 1, {1: 1.0})
    (k4 / "encoder_config.json").write_text(json.dumps({"num_lower_layers": 4}))
    for argv in (["--k2", str(k4)], ["--full", str(k4)], ["--delayed", str(full)],
                 ["--full", str(full), "--k2", str(k4)]):
        monkeypatch.setattr("sys.argv", ["bundle_readers.py", *argv])
        with pytest.raises(SystemExit) as stop:
            bundle_readers.main()
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert "num_lower_layers" in err and "encoder_config.json" in err, err
    assert written == []
    assert bundle_readers.trained_k(full) == 0 and bundle_readers.trained_k(k4) == 4


def test_record_integrity_of_a_bundled_reader_records_what_its_manifest_holds(tmp_path):
    """`--record-integrity` finds a bundled reader's weights under the partial export's name
    (not model.safetensors, which transformers would load without the word embeddings): the
    digest it records is the committed one, the manifest otherwise unchanged."""
    import shutil

    from dil_jax.checkpoints import MANIFEST_FILE, PARTIAL_SAFETENSORS_FILE

    from tests.helpers import ASSETS

    folder = tmp_path / "reader"
    shutil.copytree(ASSETS / "minilm-squad-k2", folder)
    before = json.loads((folder / MANIFEST_FILE).read_text())
    record = bundle_readers.record_integrity(folder)
    assert list(record["weights"]) == [PARTIAL_SAFETENSORS_FILE]
    assert json.loads((folder / MANIFEST_FILE).read_text()) == before


def test_read_back_is_recorded_beside_the_training_runs_own_scores(tmp_path):
    """`--read-back`: predict's scores of the folder as bundled go under `read_back`, the
    manifest's other fields (the training run's `final_eval` among them) as they were; scores
    without F1 are refused."""

    from dil_jax.checkpoints import MANIFEST_FILE

    from tests.helpers import ASSETS

    folder = tmp_path / "reader"
    folder.mkdir()
    before = json.loads((ASSETS / "minilm-squad-k2" / MANIFEST_FILE).read_text())
    before.pop("read_back", None)
    (folder / MANIFEST_FILE).write_text(json.dumps(before))
    scores = {"exact": 72.5, "f1": 82.25, "total": 6013}
    record = bundle_readers.record_read_back(folder, scores, "dev.json", "predict, a CPU")
    after = json.loads((folder / MANIFEST_FILE).read_text())
    assert after["read_back"] == record == {**scores, "data": "dev.json", "how": "predict, a CPU"}
    assert {key: value for key, value in after.items() if key != "read_back"} == before
    with pytest.raises(SystemExit, match=r"lack \['f1'\]"):
        bundle_readers.record_read_back(folder, {"exact": 1.0, "total": 3}, "d", "h")


def test_read_back_of_a_missing_or_bad_scores_file_is_refused_by_flag(tmp_path, monkeypatch,
                                                                      capsys):
    """--read-back names the file that is not `dil-jax evaluate`'s JSON and exits 2; no
    manifest is touched (record_read_back is never reached)."""
    monkeypatch.setattr(bundle_readers, "record_read_back",
                        lambda *args: pytest.fail("a manifest was written"))
    bad = tmp_path / "scores.json"
    bad.write_text("not json")
    for path in (tmp_path / "missing.json", bad):
        monkeypatch.setattr("sys.argv", ["bundle_readers.py", "--read-back", "k2", str(path)])
        with pytest.raises(SystemExit) as stop:
            bundle_readers.main()
        assert stop.value.code == 2
        assert f"--read-back k2 {path}: not the JSON" in capsys.readouterr().err
