"""tools/gpu_squad_v11.py --init-of: a student's own warm start, refused by name when it names a
student not in --students, a malformed entry or a folder that does not exist (before any run)."""

from __future__ import annotations

import pytest

from tests.helpers import REPO, load_script


@pytest.mark.parametrize("init_of,message", [
    ("k4_warm={params}", "--init-of names ['k4_warm'], not in --students 'k5_warm'"),
    ("k5_warm", "--init-of 'k5_warm': expected STUDENT=PARAMS"),
    ("k5_warm={missing}", "{missing} is not a params folder"),
])
def test_init_of_is_refused_by_name(tmp_path, capsys, monkeypatch, init_of, message):
    monkeypatch.syspath_prepend(str(REPO / "tools"))  # its sibling modules, as when run
    tool = load_script("tools/gpu_squad_v11.py")
    params, missing = tmp_path / "k4", tmp_path / "nope"
    params.mkdir()
    argv = ["--data", str(tmp_path), "--base", str(tmp_path), "--runs", str(tmp_path / "runs"),
            "--out", str(tmp_path / "out"), "--full-runs=", "--teacher", str(params),
            "--students", "k5_warm",
            "--init-of", init_of.format(params=params, missing=missing)]
    with pytest.raises(SystemExit) as stopped:
        tool.main(argv)
    assert stopped.value.code == 2
    assert message.format(missing=missing) in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # refused before anything was written
