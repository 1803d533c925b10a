"""Train on one GPU host over ssh (or on this machine with --host local): copy code, install
jax[cuda12], run detached, stream logs, fetch the run back.

    python launch/gpu_host.py all --host me@gpu-box --config configs/minilm_squad.py:k4
    python launch/gpu_host.py logs  --host me@gpu-box
    python launch/gpu_host.py fetch --host me@gpu-box --config configs/minilm_squad.py:k4 \\
        --workdir runs/minilm_squad_k4

All devices of the host are used (data parallel over the "data" mesh). Every step accepts
--dry-run, which prints the exact commands instead of running them.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

# Run as a script, so this folder is on sys.path: the shared helpers import by name.
from _common import (
    common_options,
    launcher_main,
    launcher_parser,
    plan_steps,
    train_command,
)

REMOTE_DIR = "dil_jax"
LOG_FILE = "train.log"
STEPS = ("copy", "setup", "run", "logs", "fetch")
VENV_PYTHON = ".venv/bin/python"


def _on_host(args: argparse.Namespace, remote: str) -> list[str]:
    if args.host == "local":
        return ["bash", "-c", remote]
    return ["ssh", args.host, remote]


def _root(args: argparse.Namespace) -> str:
    return args.remote_dir if args.host != "local" else str(Path.cwd())


def copy(args: argparse.Namespace) -> list[list[str]]:
    if args.host == "local":
        return []
    return [["rsync", "-az", "--delete", "--exclude=.git", "--exclude=runs/",
             "--exclude=__pycache__", "--exclude=.venv/", "./", f"{args.host}:{args.remote_dir}/"]]


def setup(args: argparse.Namespace) -> list[list[str]]:
    return [_on_host(args, f"cd {_root(args)} && python3 -m venv .venv && "
                           ".venv/bin/pip install -U 'jax[cuda12]' && "
                           ".venv/bin/pip install -e '.[train]'")]


def run(args: argparse.Namespace) -> list[list[str]]:
    if not args.config:
        raise SystemExit("launch: run needs --config")
    overrides = list(args.overrides)
    if args.workdir:
        overrides.insert(0, f"--config.workdir={args.workdir}")
    train = train_command(VENV_PYTHON, args.config, overrides)
    return [_on_host(args, f"cd {_root(args)} && nohup {shlex.join(train)} > {LOG_FILE} 2>&1 &")]


def logs(args: argparse.Namespace) -> list[list[str]]:
    return [_on_host(args, f"tail -n 100 -F {_root(args)}/{LOG_FILE}")]


def fetch(args: argparse.Namespace) -> list[list[str]]:
    """Copies the run's workdir (checkpoints, metrics, exported params) back here."""
    if args.host == "local":
        return []
    if not args.workdir:
        raise SystemExit("launch: fetch needs --workdir (the run's workdir, e.g. runs/NAME)")
    workdir = args.workdir.rstrip("/")
    return [["rsync", "-az", f"{args.host}:{args.remote_dir}/{workdir}/", f"{workdir}/"]]


def plan(args: argparse.Namespace) -> list[list[str]]:
    return plan_steps(args, ("copy", "setup", "run", "logs"), globals())


def build_parser() -> argparse.ArgumentParser:
    parser = launcher_parser(__doc__, STEPS)
    parser.add_argument("--host", required=True, help="user@host for ssh, or 'local'")
    parser.add_argument("--remote-dir", default=REMOTE_DIR, help="code folder on the host")
    return common_options(parser, workdir_help="override config.workdir (run, fetch)")


def main(argv: list[str] | None = None) -> int:
    return launcher_main(argv, build_parser, plan)


if __name__ == "__main__":
    sys.exit(main())
