"""Each bundled reader, read as bundled by `dil-jax predict` on all 35 shared dev articles,
gives the official F1 its manifest records (`read_back`: tools/bundle_readers.py --read-back)
to 0.05, and that record is within 0.1 F1 of the training run's own float32 evaluation
(`final_eval`): the bfloat16 cast does not change the reader (issue 61).

Slow (about 4 minutes a reader on 2 cores): `python3 -m pytest -q -m slow
tests/checkpoints/test_bundled_read_back.py`. Why 0.05: a question's F1 is at most 100 / 6,013 =
0.017 of the total, so the tolerance allows about three questions whose best span changes
between CPUs (float32 logits differ there in the last bits, and a near-tie of two spans may
flip); the reader's own rounding on one machine changes none.
"""

from __future__ import annotations

import json

import pytest

from dil_jax.checkpoints import MANIFEST_FILE
from dil_jax.defaults import BUNDLED_READERS, OTHER_BUNDLED_READERS

from tests.helpers import ASSETS, V11, run_cli, squad_file

BUNDLED = sorted({*BUNDLED_READERS.values(), *OTHER_BUNDLED_READERS.values()})


def test_every_bundled_reader_records_its_read_back():
    """Cheap, in CI: the record the slow test below checks is there for every bundled reader,
    made on the shared dev file."""
    for name in BUNDLED:
        record = json.loads((ASSETS / name / MANIFEST_FILE).read_text()).get("read_back")
        assert record is not None, f"{name}: no read_back in its manifest"
        assert record["data"] == V11 and record["total"] == 6013, (name, record)


@pytest.mark.slow
@pytest.mark.parametrize("name", BUNDLED)
def test_predict_reproduces_the_recorded_f1(tmp_path, capsys, name):
    manifest = json.loads((ASSETS / name / MANIFEST_FILE).read_text())
    record = manifest["read_back"]
    data = squad_file(V11)
    predictions = tmp_path / "predictions.json"
    status, _, err = run_cli(["predict", "--checkpoint", str(ASSETS / name), "--data", str(data),
                              "--output", str(predictions), "--no-progress"], capsys)
    assert status == 0, err
    status, out, err = run_cli(["evaluate", "--data", str(data), "--predictions",
                                str(predictions)], capsys)
    assert status == 0, err
    scores = json.loads(out)
    assert abs(scores["f1"] - record["f1"]) <= 0.05, (name, scores, record)
    assert abs(record["f1"] - manifest["final_eval"]["f1"]) <= 0.1, (name, record,
                                                                     manifest["final_eval"])
