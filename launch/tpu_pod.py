"""Train on a Cloud TPU VM pod slice: create, copy code, install, run on every worker, stream
logs, delete. The gcloud conventions of big_vision and the JAX multi-process docs: one Python
process per host, all started with `--worker=all`; `jax.distributed.initialize()` finds the pod by
itself (`--config.distributed.initialize=true`), and the workdir must be a gs:// bucket every host
can write (checkpoints are written once, cooperatively, by orbax). `setup` installs jax[tpu] at
the version setup.py asks for, dil_jax and the Wikipedia leads' package (`--corpus wikipedia`).
NAME: your login on the workers; a path with an empty component (`/home//...`, what
`/home/$USER/...` gives where $USER is empty) is refused.

    python launch/tpu_pod.py all --name dil-v4 --zone us-central2-b --accelerator v4-32 \\
        --config configs/bert_base_squad.py --workdir gs://BUCKET/runs/bert_k10 \\
        -- --config.data.squad_file=/home/NAME/data/train-v1.1.json
    python launch/tpu_pod.py logs   --name dil-v4 --zone us-central2-b
    python launch/tpu_pod.py delete --name dil-v4 --zone us-central2-b

The `index` step runs `dil-jax index` on every worker instead (after create, copy, setup): one
process per host, `--distributed` (jax.distributed finds the pod), each encoding its own shard of
every passage cache on its own chips. With --cache-store gs://BUCKET/PATH the caches go to the
bucket and the workers share no folder: --out is each worker's own folder (relative to the code
folder, or absolute), where each builds the index from the corpus (installed on every worker by
`setup`); worker 0's is the one to read (it records the bucket). Every worker writes its own
shards to the bucket (tensorstore's gcs driver, with the VM's service account), worker 0 joins
them and writes each cache's manifest, last:

    python launch/tpu_pod.py index --name dil-v4 --zone us-central2-b --out index \
        --cache-store gs://BUCKET/wiki-index -- --corpus wikipedia --k 2 --cache-dtype pq64
    python launch/tpu_pod.py logs  --name dil-v4 --zone us-central2-b --log-file index.log

Without --cache-store, --out must be a folder every worker mounts (e.g. a Filestore NFS share),
not gs://: the caches are written there with file renames.

Every step accepts --dry-run, which prints the exact commands instead of running them.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import PurePosixPath

# Run as a script, so this folder is on sys.path: the shared helpers import by name.
from _common import (
    common_options,
    install_commands,
    launcher_main,
    launcher_parser,
    plan_steps,
    train_command,
)

REMOTE_DIR = "dil_jax"  # on every worker, relative to the login home
ARCHIVE = "/tmp/dil_jax_code.tar.gz"
LOG_FILE = "train.log"
INDEX_LOG_FILE = "index.log"
STEPS = ("create", "copy", "setup", "run", "index", "logs", "delete")
# `dil-jax index` flags the `index` step sets itself (--distributed finds the processes).
_POD_OWNED = ("--out", "--cache-store", "--num-processes", "--process-id",
              "--coordinator-address", "--distributed", "--num-cpu-devices")
# The stores a pod's workers can all write (a file:// store would be each worker's own disk).
_POD_STORES = ("gs://", "s3://")


def _gcloud_tpu(args: argparse.Namespace, *verb: str) -> list[str]:
    command = ["gcloud", "compute", "tpus", "tpu-vm", *verb, f"--zone={args.zone}"]
    if args.project:
        command.append(f"--project={args.project}")
    return command


def _ssh(args: argparse.Namespace, remote: str, worker: str = "all") -> list[str]:
    return [*_gcloud_tpu(args, "ssh", args.name), f"--worker={worker}", f"--command={remote}"]


def create(args: argparse.Namespace) -> list[list[str]]:
    command = [*_gcloud_tpu(args, "create", args.name), f"--accelerator-type={args.accelerator}",
               f"--version={args.version}"]
    if args.spot:
        command.append("--spot")
    return [command]


def copy(args: argparse.Namespace) -> list[list[str]]:
    """The committed tree (git archive: no runs/, caches or untracked files) to every worker."""
    return [
        ["git", "archive", "--format=tar.gz", f"--output={ARCHIVE}", "HEAD"],
        [*_gcloud_tpu(args, "scp", ARCHIVE, f"{args.name}:~/dil_jax_code.tar.gz"),
         "--worker=all"],
        _ssh(args, f"rm -rf ~/{REMOTE_DIR} && mkdir -p ~/{REMOTE_DIR} && "
                   f"tar xzf ~/dil_jax_code.tar.gz -C ~/{REMOTE_DIR}"),
    ]


def setup(args: argparse.Namespace) -> list[list[str]]:
    return [_ssh(args, f"cd ~/{REMOTE_DIR} && {install_commands('pip', 'tpu')}")]


def run(args: argparse.Namespace) -> list[list[str]]:
    """Starts training on all workers, detached (nohup), so the ssh session may end."""
    if not args.config or not args.workdir:
        raise SystemExit("launch: run needs --config and --workdir (a gs:// path)")
    if not args.workdir.startswith("gs://"):
        raise SystemExit("launch: a pod's --workdir must be gs://... (all hosts write there)")
    train = train_command("python3", args.config, [
        "--config.distributed.initialize=true", f"--config.workdir={args.workdir}",
        *args.overrides])
    remote = (f"cd ~/{REMOTE_DIR} && nohup {shlex.join(train)} > ~/{LOG_FILE} 2>&1 &")
    return [_ssh(args, remote)]


def index(args: argparse.Namespace) -> list[list[str]]:
    """Starts `dil-jax index --distributed` on all workers, detached: each builds its shard of
    every passage cache, in the bucket of --cache-store (docs/open_domain.md, "Many hosts, no
    shared folder"), or in a folder every worker mounts (docs/open_domain.md, "The passage
    cache across hosts")."""
    if not args.out:
        raise SystemExit("launch: index needs --out (each worker's index folder with "
                         "--cache-store, else a folder every worker mounts)")
    owned = [flag for flag in args.overrides if flag.split("=", 1)[0] in _POD_OWNED]
    if owned:
        raise SystemExit(f"launch: index sets {', '.join(owned)} itself; give the other "
                         "`dil-jax index` flags after --")
    if args.cache_store and not args.cache_store.startswith(_POD_STORES):
        raise SystemExit(f"launch: index --cache-store {args.cache_store!r}: give a bucket "
                         f"every worker writes ({' or '.join(_POD_STORES)}...); a path would be "
                         "each worker's own disk")
    if "://" in args.out:
        raise SystemExit(f"launch: index --out {args.out!r}: a folder on the workers (one "
                         "every worker mounts, or with --cache-store each worker's own); the "
                         "caches go to a bucket with --cache-store gs://...")
    if not args.cache_store and not PurePosixPath(args.out).is_absolute():
        raise SystemExit(f"launch: index --out {args.out!r}: give an absolute path of a folder "
                         "every worker mounts (e.g. an NFS share); the cache is written with "
                         "file renames and memory maps, which gs:// does not offer")
    store = ["--cache-store", args.cache_store] if args.cache_store else []
    command = ["python3", "-m", "dil_jax", "index", "--distributed", "--out", args.out, *store,
               *args.overrides]
    log_file = args.log_file or INDEX_LOG_FILE
    return [_ssh(args, f"cd ~/{REMOTE_DIR} && nohup {shlex.join(command)} > ~/{log_file} "
                       "2>&1 &")]


def logs(args: argparse.Namespace) -> list[list[str]]:
    """Streams worker 0's log (process 0 prints the progress bar and metrics)."""
    return [_ssh(args, f"tail -n 100 -F ~/{args.log_file or LOG_FILE}", worker="0")]


def delete(args: argparse.Namespace) -> list[list[str]]:
    return [[*_gcloud_tpu(args, "delete", args.name), "--quiet"]]


def plan(args: argparse.Namespace) -> list[list[str]]:
    return plan_steps(args, ("create", "copy", "setup", "run", "logs"), globals())


def build_parser() -> argparse.ArgumentParser:
    parser = launcher_parser(__doc__, STEPS)
    parser.add_argument("--name", required=True, help="TPU VM name")
    parser.add_argument("--zone", required=True)
    parser.add_argument("--project", default="")
    parser.add_argument("--accelerator", default="v4-32", help="e.g. v4-32, v5litepod-16")
    parser.add_argument("--version", default="tpu-ubuntu2204-base", help="TPU VM image")
    parser.add_argument("--spot", action="store_true", help="preemptible capacity")
    parser.add_argument("--out", default="",
                        help="index folder (index): each worker's own with --cache-store, "
                             "else one every worker mounts")
    parser.add_argument("--cache-store", default="", metavar="URL",
                        help="gs://BUCKET/PATH (or s3://) the passage caches are built in "
                             "(index): the workers then share no folder")
    parser.add_argument("--log-file", default="",
                        help=f"worker log (logs, index; default {LOG_FILE}, index: "
                             f"{INDEX_LOG_FILE})")
    return common_options(parser, workdir_help="gs://bucket/path (run)")


def main(argv: list[str] | None = None) -> int:
    return launcher_main(argv, build_parser, plan)


if __name__ == "__main__":
    sys.exit(main())
