"""The passage windows a reader records it was trained on (`ResolvedCheckpoint.trained_windows`),
read from `trained_from.json` or a Hugging Face export's manifest; malformed records named."""

from __future__ import annotations

import json
import shutil

import pytest

from dil_jax.checkpoints import resolve_reader_checkpoint
from dil_jax.checkpoints.windows import TrainedWindows
from dil_jax.errors import CheckpointError

from tests.helpers import REPO

BUNDLED = REPO / "dil_jax" / "assets" / "minilm-squad-k4"


def test_a_bundled_reader_records_its_training_windows():
    # Its manifest's training config: data.max_passage_len 160, data.doc_stride 80.
    manifest = json.loads((BUNDLED / "dil_jax_manifest.json").read_text())
    data = manifest["training_config"]["data"]
    assert resolve_reader_checkpoint(BUNDLED).trained_windows == TrainedWindows(
        data["max_passage_len"], data["doc_stride"])


def test_a_plain_hugging_face_checkpoint_records_none():
    assert resolve_reader_checkpoint("default").trained_windows is None


@pytest.fixture
def export_folder(tmp_path):
    """A copy of the bundled reader's files (the weights are not read here)."""
    folder = tmp_path / "reader"
    shutil.copytree(BUNDLED, folder)
    return folder


def test_trained_from_json_wins_over_the_manifest(export_folder):
    (export_folder / "trained_from.json").write_text(json.dumps(
        {"step": 1, "windows": {"max_passage_len": 64, "doc_stride": 32}}))
    assert resolve_reader_checkpoint(export_folder).trained_windows == TrainedWindows(64, 32)


@pytest.mark.parametrize("windows, named", [
    ({"max_passage_len": 64}, "'doc_stride' must be a positive integer, got None"),
    ({"max_passage_len": "64", "doc_stride": 32}, "'max_passage_len' must be a positive integer"),
    ({"max_passage_len": 64, "doc_stride": True}, "'doc_stride' must be a positive integer"),
    ({"max_passage_len": 64, "doc_stride": 64}, "'doc_stride' 64 must be smaller"),
    ([64, 32], "'windows' must be an object"),
])
def test_a_malformed_record_is_named(export_folder, windows, named):
    (export_folder / "trained_from.json").write_text(json.dumps({"windows": windows}))
    with pytest.raises(CheckpointError, match=named) as error:
        _ = resolve_reader_checkpoint(export_folder).trained_windows
    assert "trained_from.json" in str(error.value)


def test_predict_takes_each_unset_window_flag_from_the_record_and_names_a_bad_pair():
    import argparse
    import types

    from dil_jax.commands.predict import reading_windows
    from dil_jax.errors import UsageError

    recorded = types.SimpleNamespace(trained_windows=TrainedWindows(160, 80))
    unrecorded = types.SimpleNamespace(trained_windows=None)

    def flags(length=None, stride=None):
        return argparse.Namespace(max_passage_len=length, doc_stride=stride)

    assert reading_windows(flags(), recorded) == (160, 80)
    assert reading_windows(flags(320), recorded) == (320, 80)
    assert reading_windows(flags(None, 40), recorded) == (160, 40)
    assert reading_windows(flags(), unrecorded) == (384, 128)  # BERT's
    with pytest.raises(UsageError, match="--doc-stride is unset and comes from the reader's"):
        reading_windows(flags(64), recorded)
