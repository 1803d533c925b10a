"""Train on one GPU host over ssh (or on this machine with --host local): copy code, install
jax[cuda12] (at the version setup.py asks for), dil_jax and the Wikipedia leads' package, run
detached, stream logs, fetch the run back.

    python launch/gpu_host.py all --host me@gpu-box --config configs/minilm_squad.py:k4
    python launch/gpu_host.py logs  --host me@gpu-box
    python launch/gpu_host.py fetch --host me@gpu-box --config configs/minilm_squad.py:k4 \\
        --workdir runs/minilm_squad_k4

All devices of the host are used (data parallel over the "data" mesh). The `index` step builds
an open-domain index on the host instead (after copy, setup): one `dil-jax index` process
encodes every passage cache on all of the host's GPUs (data parallel over its local devices);
--out is a folder on the host (relative to the code folder, or absolute), which `fetch
--workdir` copies back like a run:

    python launch/gpu_host.py index --host me@gpu-box --out runs/wiki-index \\
        -- --corpus wikipedia --k 4 --cache-dtype pca64
    python launch/gpu_host.py logs  --host me@gpu-box --log-file index.log
    python launch/gpu_host.py fetch --host me@gpu-box --workdir runs/wiki-index

Every step accepts --dry-run, which prints the exact commands instead of running them.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

# Run as a script, so this folder is on sys.path: the shared helpers import by name.
from _common import (
    common_options,
    install_commands,
    launcher_main,
    launcher_parser,
    plan_steps,
    train_command,
)

REMOTE_DIR = "dil_jax"
LOG_FILE = "train.log"
INDEX_LOG_FILE = "index.log"
STEPS = ("copy", "setup", "run", "index", "logs", "fetch")
VENV_PYTHON = ".venv/bin/python"
# `dil-jax index` flags of several processes: on one host a single process drives every GPU.
_SINGLE_PROCESS_OWNED = ("--out", "--num-processes", "--process-id", "--coordinator-address",
                         "--distributed", "--num-cpu-devices")


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
                           f"{install_commands('.venv/bin/pip', 'cuda12')}")]


def run(args: argparse.Namespace) -> list[list[str]]:
    if not args.config:
        raise SystemExit("launch: run needs --config")
    overrides = list(args.overrides)
    if args.workdir:
        overrides.insert(0, f"--config.workdir={args.workdir}")
    train = train_command(VENV_PYTHON, args.config, overrides)
    return [_on_host(args, f"cd {_root(args)} && nohup {shlex.join(train)} > {LOG_FILE} 2>&1 &")]


def index(args: argparse.Namespace) -> list[list[str]]:
    """Starts `dil-jax index` on the host, detached: one process, every GPU of the host
    (docs/open_domain.md, "The passage cache across hosts")."""
    if not args.out:
        raise SystemExit("launch: index needs --out (the index folder on the host)")
    if "://" in args.out:
        raise SystemExit(f"launch: index --out {args.out!r}: give a folder on the host (the "
                         "cache is written with file renames and memory maps)")
    owned = [flag for flag in args.overrides if flag.split("=", 1)[0] in _SINGLE_PROCESS_OWNED]
    if owned:
        raise SystemExit(f"launch: index sets {', '.join(owned)} itself (one process uses every "
                         "GPU of the host); give the other `dil-jax index` flags after --")
    command = [VENV_PYTHON, "-m", "dil_jax", "index", "--out", args.out, *args.overrides]
    log_file = args.log_file or INDEX_LOG_FILE
    return [_on_host(args, f"cd {_root(args)} && nohup {shlex.join(command)} > {log_file} "
                           "2>&1 &")]


def logs(args: argparse.Namespace) -> list[list[str]]:
    return [_on_host(args, f"tail -n 100 -F {_root(args)}/{args.log_file or LOG_FILE}")]


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
    parser.add_argument("--out", default="", help="index folder on the host (index)")
    parser.add_argument("--log-file", default="",
                        help=f"the host's log (logs, index; default {LOG_FILE}, index: "
                             f"{INDEX_LOG_FILE})")
    return common_options(parser, workdir_help="override config.workdir (run, fetch)")


def main(argv: list[str] | None = None) -> int:
    return launcher_main(argv, build_parser, plan)


if __name__ == "__main__":
    sys.exit(main())
