"""The launchers' --dry-run prints the exact commands (nothing is run)."""

import shlex
import subprocess
import sys

import pytest

from tests.helpers import REPO


def _dry_run(script: str, *args: str) -> list[list[str]]:
    out = subprocess.run([sys.executable, str(REPO / "launch" / script), "--dry-run", *args],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [shlex.split(line) for line in out.splitlines()]


POD = ["--name", "dil-v4", "--zone", "us-central2-b"]


def test_tpu_pod_full_plan():
    commands = _dry_run("tpu_pod.py", "all", *POD, "--accelerator", "v4-32",
                        "--config", "configs/bert_base_squad.py", "--workdir", "gs://b/runs/k10",
                        "--", "--config.batch_size=32")
    assert commands[0] == ["gcloud", "compute", "tpus", "tpu-vm", "create", "dil-v4",
                           "--zone=us-central2-b", "--accelerator-type=v4-32",
                           "--version=tpu-ubuntu2204-base"]
    assert commands[1] == ["git", "archive", "--format=tar.gz",
                           "--output=/tmp/dil_jax_code.tar.gz", "HEAD"]
    assert commands[2][:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
    assert "--worker=all" in commands[2]
    setup = commands[4]
    assert setup[4:6] == ["ssh", "dil-v4"] and "--worker=all" in setup
    assert "jax[tpu]" in setup[-1] and "pip install -e '.[train]'" in setup[-1]
    run = commands[5]
    assert "--worker=all" in run
    remote = run[-1].removeprefix("--command=")
    assert remote.startswith("cd ~/dil_jax && nohup python3 -m dil_jax.commands.train "
                             "--config configs/bert_base_squad.py "
                             "--config.distributed.initialize=true "
                             "--config.workdir=gs://b/runs/k10 --config.batch_size=32")
    assert remote.endswith("> ~/train.log 2>&1 &")
    assert commands[6][-2:] == ["--worker=0", "--command=tail -n 100 -F ~/train.log"]
    assert len(commands) == 7  # delete is a separate, explicit step


def test_tpu_pod_delete_and_project():
    assert _dry_run("tpu_pod.py", "delete", *POD, "--project", "p1") == [[
        "gcloud", "compute", "tpus", "tpu-vm", "delete", "dil-v4", "--zone=us-central2-b",
        "--project=p1", "--quiet"]]


def test_tpu_pod_refuses_a_local_workdir():
    result = subprocess.run([sys.executable, str(REPO / "launch" / "tpu_pod.py"), "run", *POD,
                             "--config", "configs/tiny.py", "--workdir", "runs/x", "--dry-run"],
                            check=False, cwd=REPO, capture_output=True, text=True)
    assert result.returncode != 0 and "gs://" in result.stderr


def test_gpu_host_plan():
    commands = _dry_run("gpu_host.py", "all", "--host", "me@gpu",
                        "--config", "configs/minilm_squad.py:k4", "--",
                        "--config.model.dtype=bfloat16")
    assert commands[0][:3] == ["rsync", "-az", "--delete"] and commands[0][-1] == "me@gpu:dil_jax/"
    assert commands[1][:2] == ["ssh", "me@gpu"] and "jax[cuda12]" in commands[1][2]
    assert commands[2] == ["ssh", "me@gpu",
                           ("cd dil_jax && nohup .venv/bin/python -m dil_jax.commands.train "
                            "--config configs/minilm_squad.py:k4 --config.model.dtype=bfloat16 "
                            "> train.log 2>&1 &")]
    assert commands[3] == ["ssh", "me@gpu", "tail -n 100 -F dil_jax/train.log"]
    fetch = _dry_run("gpu_host.py", "fetch", "--host", "me@gpu", "--workdir", "runs/k4")
    assert fetch == [["rsync", "-az", "me@gpu:dil_jax/runs/k4/", "runs/k4/"]]


@pytest.mark.parametrize("script", ["tpu_pod.py", "gpu_host.py"])
def test_overrides_must_be_config_keys(script):
    target = POD if script == "tpu_pod.py" else ["--host", "h"]
    result = subprocess.run([sys.executable, str(REPO / "launch" / script), "run", *target,
                             "--config", "c.py", "--workdir", "gs://b/x", "--dry-run", "--",
                             "--lr=1"], check=False, cwd=REPO, capture_output=True, text=True)
    assert result.returncode != 0 and "--config.key=value" in result.stderr


def test_tpu_pod_index_runs_dil_jax_index_on_every_worker():
    commands = _dry_run("tpu_pod.py", "index", *POD, "--out", "/mnt/share/index", "--",
                        "--corpus", "wikipedia", "--k", "4", "--cache-dtype", "pca64")
    assert len(commands) == 1
    (index,) = commands
    assert index[4:6] == ["ssh", "dil-v4"] and "--worker=all" in index
    assert index[-1] == ("--command=cd ~/dil_jax && nohup python3 -m dil_jax index --distributed "
                         "--out /mnt/share/index --corpus wikipedia --k 4 --cache-dtype pca64 "
                         "> ~/index.log 2>&1 &")
    logs = _dry_run("tpu_pod.py", "logs", *POD, "--log-file", "index.log")
    assert logs[0][-2:] == ["--worker=0", "--command=tail -n 100 -F ~/index.log"]


@pytest.mark.parametrize("args, message", [
    (["--out", "gs://b/index"], "every worker mounts"),
    (["--out", "runs/index"], "absolute path"),
    ([], "index needs --out"),
    (["--out", "/mnt/i", "--", "--process-id", "1"], "index sets --process-id itself"),
])
def test_tpu_pod_index_refuses_bad_outputs(args, message):
    result = subprocess.run([sys.executable, str(REPO / "launch" / "tpu_pod.py"), "index", *POD,
                             "--dry-run", *args], check=False, cwd=REPO, capture_output=True,
                            text=True)
    assert result.returncode != 0 and message in result.stderr
