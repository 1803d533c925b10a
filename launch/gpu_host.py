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
        -- --corpus wikipedia --k 2 --cache-dtype pq64
    python launch/gpu_host.py logs  --host me@gpu-box --log-file index.log
    python launch/gpu_host.py fetch --host me@gpu-box --workdir runs/wiki-index

With --cache-store URL (gs://, s3://) the caches are built in the store instead of --out, and
several GPU hosts can share the work without a shared folder: host I of N runs its shard of every
cache (`--num-hosts N --host-index I`, independent processes that meet only in the store; each
builds the index in its own --out, host 0's records the store and is the one to read):

    python launch/gpu_host.py index --host me@gpu-0 --out runs/wiki-index \\
        --cache-store gs://BUCKET/wiki --num-hosts 2 --host-index 0 -- --corpus wikipedia --k 4
    python launch/gpu_host.py index --host me@gpu-1 --out runs/wiki-index \\
        --cache-store gs://BUCKET/wiki --num-hosts 2 --host-index 1 -- --corpus wikipedia --k 4

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
_SINGLE_PROCESS_OWNED = ("--out", "--cache-store", "--num-processes", "--process-id",
                         "--coordinator-address", "--distributed", "--num-cpu-devices")
# The stores several hosts can all write (a file:// store would be each host's own disk).
_HOST_STORES = ("gs://", "s3://")


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


def _host_share(args: argparse.Namespace) -> list[str]:
    """The `dil-jax index` flags of this host's part: the store, and with several hosts this
    one's shard (--num-processes / --process-id; no coordinator: the build needs no
    collective). SystemExit naming the flag when they do not go together."""
    if not args.cache_store:
        if args.num_hosts != 1 or args.host_index != 0:
            raise SystemExit("launch: index --num-hosts / --host-index need --cache-store (the "
                             "hosts share no folder; they meet in the store)")
        return []
    if not args.cache_store.startswith(_HOST_STORES):
        raise SystemExit(f"launch: index --cache-store {args.cache_store!r}: give a store "
                         f"every host writes ({' or '.join(_HOST_STORES)}...)")
    if not 0 <= args.host_index < args.num_hosts:
        raise SystemExit(f"launch: index --host-index {args.host_index}: must be 0 .. "
                         f"--num-hosts - 1 ({args.num_hosts - 1})")
    share = ["--cache-store", args.cache_store]
    if args.num_hosts > 1:
        share += ["--num-processes", str(args.num_hosts), "--process-id", str(args.host_index)]
    return share


def index(args: argparse.Namespace) -> list[list[str]]:
    """Starts `dil-jax index` on the host, detached: one process, every GPU of the host
    (docs/open_domain.md, "The passage cache across hosts"); with --cache-store, this host's
    shard of every cache in the store (docs/open_domain.md, "Many hosts, no shared folder")."""
    if not args.out:
        raise SystemExit("launch: index needs --out (the index folder on the host)")
    if "://" in args.out:
        raise SystemExit(f"launch: index --out {args.out!r}: give a folder on the host (the "
                         "cache is written with file renames and memory maps)")
    owned = [flag for flag in args.overrides if flag.split("=", 1)[0] in _SINGLE_PROCESS_OWNED]
    if owned:
        raise SystemExit(f"launch: index sets {', '.join(owned)} itself (one process uses every "
                         "GPU of the host); give the other `dil-jax index` flags after --")
    command = [VENV_PYTHON, "-m", "dil_jax", "index", "--out", args.out, *_host_share(args),
               *args.overrides]
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
    parser.add_argument("--cache-store", default="", metavar="URL",
                        help="gs://BUCKET/PATH (or s3://) the passage caches are built in "
                             "(index; default: in --out)")
    parser.add_argument("--num-hosts", type=int, default=1,
                        help="GPU hosts building the caches together in --cache-store (index)")
    parser.add_argument("--host-index", type=int, default=0,
                        help="this host's number, 0 .. --num-hosts - 1 (index)")
    parser.add_argument("--log-file", default="",
                        help=f"the host's log (logs, index; default {LOG_FILE}, index: "
                             f"{INDEX_LOG_FILE})")
    return common_options(parser, workdir_help="override config.workdir (run, fetch)")


def main(argv: list[str] | None = None) -> int:
    return launcher_main(argv, build_parser, plan)


if __name__ == "__main__":
    sys.exit(main())
