"""What the tests share that is not a test: the one place to look for a test helper.

This module holds the helpers every part of the suite uses (the repository's folders, the shared
SQuAD files, running the CLI in-process, free ports, subprocesses, scripts of tools/ and
benchmarks/ imported by path, file digests); the modules beside it hold the larger families:
- `hf`: tiny Hugging Face checkpoints and tokenizers built locally, and the comparisons against
  them (parity with the PyTorch model, the delayed split against the NumPy reference);
- `numpy_reference`, `qanet_numpy_reference`, `xlnet_numpy_reference`: independent float64
  readers written without dil_jax;
- `squad`: a one-question SQuAD file and `dil-jax predict` of it, the gold-label round trip
  through the decoder;
- `index`: a tiny open-domain index of the sample passages;
- `training`: the tiny training config, param comparisons, the multi-device subprocesses
  (`python -m tests.helpers.training ...`);
- `qanet`: tiny QANet / BiDAF configs, inputs and the pointing task;
- `serving`: an `Engine` without a model and a loopback server (`python -m tests.helpers.serving`).

Tests import them as `tests.helpers...`: `tests/` is a package, so pytest puts the repository
root first on `sys.path` and this checkout's `dil_jax` is the one imported; no test edits
`sys.path`. Fixtures live in the conftest.py files.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
ASSETS = REPO / "dil_jax" / "assets"
CONFIGS = REPO / "configs"
FIXTURES = REPO / "tests" / "fixtures"  # files written by earlier code, read by today's
# The shared data folder beside the repository root (../shared/data): CI has it, so a missing
# folder fails with a clear message instead of skipping.
SHARED_DATA = REPO.parent / "shared" / "data"
SQUAD_DIR = SHARED_DATA / "squad"
V11 = "dev-v1.1.35-articles.json"
V20 = "dev-v2.0.json"
# How long a test waits for a subprocess of its own (a training process, a grid on forced
# devices). It guards against a hang (a collective waiting for a peer that died), not against
# slowness: a subprocess needs ~20-40 CPU seconds, but on a machine shared with other jobs its
# wall time stretches ~10x (a load of 10 on 2 cores), which a 240 s limit did not survive.
SUBPROCESS_TIMEOUT_S = 1200


def squad_file(name: str) -> Path:
    """The shared SQuAD file `name` (V11, V20); fails the test by name when it is missing."""
    path = SQUAD_DIR / name
    if not path.is_file():
        pytest.fail(f"shared SQuAD file missing: {path}. The tests need the shared data folder "
                    f"beside the repo root (../shared/data/squad/), as CI provides it.",
                    pytrace=False)
    return path


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """Runs `dil-jax ARGV` in this process -> (exit status, stdout, stderr).

    argparse's own errors (exit status 2) are returned like any other exit, so a test asserts
    on the status and the message the user sees, not on how the CLI got there.
    """
    from dil_jax.cli import main

    capsys.readouterr()  # drop what earlier steps printed
    try:
        status = main(list(argv))
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else 1
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def edit_json(path: Path, **changes) -> None:
    """Sets top-level keys of the JSON object in `path`."""
    values = json.loads(path.read_text())
    values.update(changes)
    path.write_text(json.dumps(values))


# XLA_FLAGS is a space-separated list of --name=value.
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def _flag_name(flag: str) -> str:
    return flag.split("=", 1)[0]


def subprocess_env(devices: int | None = None, **extra: str) -> dict[str, str]:
    """os.environ for a test's subprocess on the CPU: the caller's XLA flags kept but a forced
    device count, replaced by `devices` forced host devices (None: the platform's one device);
    JAX_PLATFORMS=cpu and `extra` set."""
    flags = [flag for flag in os.environ.get("XLA_FLAGS", "").split()
             if _flag_name(flag) != DEVICE_COUNT_FLAG]
    if devices is not None:
        flags.append(f"{DEVICE_COUNT_FLAG}={devices}")
    return {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu", **extra}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of `host` free now (for a server or a jax.distributed coordinator)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def run_all(argvs: list[list[str]], envs: list[dict]) -> list[tuple[int, str]]:
    """Starts one process per argv (with its env, in the repo root) at once, waits for all ->
    [(exit status, output)]; any still running after SUBPROCESS_TIMEOUT_S is killed."""
    procs = [subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for argv, env in zip(argvs, envs, strict=True)]
    logs = []
    try:
        for proc in procs:
            logs.append(proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return [(proc.returncode, log) for proc, log in zip(procs, logs)]


def load_script(relative_path: str) -> ModuleType:
    """A script of the repository that is not in a package (tools/NAME.py, benchmarks/NAME.py),
    imported as a module from its file, executed afresh on every call.

    It is registered in `sys.modules` under its path's dotted name (e.g. "tools.k_frontier") while
    it runs, as dataclasses need; `sys.path` is left as it is.
    """
    path = REPO / relative_path
    name = ".".join(Path(relative_path).with_suffix("").parts)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def file_digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder` but a `.lock` (to show a failed or refused run
    changed nothing)."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file() and path.name != ".lock"}


def random_prescreener(minilm_dir, seed: int = 0, encoder_name: str | None = None,
                       overlap: bool = False):
    """An untrained prescreener (random scores are enough to check where they lead); with
    `overlap`, one that reads word overlaps too (an IDF of 1 for every piece)."""
    import jax
    import numpy as np

    from dil_jax.prescreening.model import PrescreenConfig, Prescreener
    from dil_jax.prescreening.prescreener import SentencePrescreener
    from dil_jax.readers import load_reader

    config = PrescreenConfig(embedding_dim=384, width=16, num_layers=1, num_heads=2, mlp_dim=16,
                             max_sentences=8, dropout=0.0, overlap=overlap)
    params = Prescreener(config).init(jax.random.key(seed), np.zeros((1, 384), np.float32),
                                      np.zeros((1, 8, 384), np.float32),
                                      np.ones((1, 8), np.int32),
                                      np.zeros((1, 8), np.float32))["params"]
    encoder = load_reader(str(minilm_dir), None, 32)
    idf = np.ones(len(encoder.tokenizer), np.float32) if overlap else None
    return SentencePrescreener(config, params, encoder, encoder_name or str(minilm_dir), 32,
                               idf)
