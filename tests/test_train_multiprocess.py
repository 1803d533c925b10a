"""Two real JAX processes on this machine (gloo CPU collectives), 2 host devices each.

They train the tiny config for 2 steps, stop with a checkpoint, restore it in a second train()
call, run to step 4, and must agree with one process running 4 steps on 1 device.
"""

import os
import socket
import subprocess
import sys

import numpy as np
from train_helpers import REPO, assert_same_training, flat_params, tiny_config

from dil_jax.train.loop import train


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def test_two_processes_agree_with_one(tmp_path):
    workdir, out = tmp_path / "shared_workdir", tmp_path / "params"
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "train_helpers.py"), "multiprocess", str(out),
         str(workdir), str(port), str(pid)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for pid in (0, 1)]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=240)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for pid, (proc, log) in enumerate(zip(procs, logs)):
        assert proc.returncode == 0, f"process {pid} failed:\n{log[-4000:]}"

    single = train(tiny_config(tmp_path / "single", {
        "num_train_steps": 4, "checkpoint.every_steps": 2,
        "checkpoint.export_params": "false"}))
    reference = flat_params(single.state.params)
    for pid in (0, 1):
        theirs = dict(np.load(f"{out}.process{pid}.npz"))
        assert_same_training(reference, theirs)
    # The checkpoint was written once, as one step directory, and read back by both.
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()
                  if p.name.isdigit()) == ["2", "4"]
