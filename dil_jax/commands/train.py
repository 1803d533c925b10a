"""`dil-jax train --config configs/NAME.py[:variant] [--config.key=value ...]`.

Fine-tunes a delayed-interaction reader per an ml_collections config file (see configs/ and
dil_jax/train/default_config.py for every key). Re-running the same command with the same workdir
resumes from its latest checkpoint. Also runnable as `python -m dil_jax.commands.train`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from dil_jax.commands.arguments import add_compilation_cache_arguments

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train", help="fine-tune a reader (configs/*.py, --config.key=value overrides)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    add_compilation_cache_arguments(parser)
    parser.set_defaults(func=run, accepts_config_overrides=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="FILE[:ARG]",
                        help="config file with get_config(); FILE.py:ARG passes ARG")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config and exit")


def check_workdir(config) -> None:
    """Refuses, before training starts, a local workdir that is empty (""), a file, cannot be
    written, is one of the run's input files or checkpoints, or is a non-empty folder train did
    not write (checkpoints/, params/, config.json and metrics are written into it; a remote
    gs:// workdir is left to the checkpointer)."""
    from dil_jax.atomic import check_output_folder
    from dil_jax.errors import OutputPathError
    from dil_jax.train.setup import is_remote
    from dil_jax.train.workdir import workdir_problem

    if is_remote(config.workdir):
        return
    if not str(config.workdir).strip():  # before check_output_folder reads "" as the cwd
        raise OutputPathError(workdir_problem(config.workdir))
    inputs = {f"--config.{key}": value for key, value in (
        ("data.squad_file", config.data.squad_file),
        ("data.validation_file", config.data.validation_file),
        ("model.checkpoint", config.model.checkpoint),
        ("teacher.checkpoint", config.teacher.checkpoint))
        if value and str(value) not in ("default", "student_init")}
    check_output_folder(config.workdir, "--config.workdir", inputs)
    problem = workdir_problem(config.workdir)  # after the input check: its message is sharper
    if problem:
        raise OutputPathError(problem)


def run(args: argparse.Namespace) -> int:
    from dil_jax.errors import InterruptedRun, UsageError
    from dil_jax.train.config_files import load_config, split_overrides
    from dil_jax.train.config_rules import validate_config

    rest, overrides = split_overrides(getattr(args, "extra_args", None) or [])
    if rest:
        raise UsageError(f"unrecognized arguments: {' '.join(rest)} "
                         "(overrides are --config.key=value)")
    config = load_config(args.config, overrides)
    validate_config(config, args.config)  # every bad value by its key, before anything loads
    if not args.print_config:
        check_workdir(config)
    # orbax logs every save step at INFO through absl; keep the console to our own lines.
    logging.getLogger("absl").setLevel(logging.WARNING)
    if args.print_config:
        print(config.to_json_best_effort(indent=2))
        return 0
    from dil_jax.train.loop import train

    result = train(config)
    step = int(result.state.step)
    summary = {"workdir": str(result.workdir), "step": step, "total_steps": result.total_steps,
               "train": result.last_metrics, "eval": result.eval_metrics,
               "best_step": result.best_step}
    if result.interrupted_by:
        status = f"interrupted at step {step} of {result.total_steps}"
        summary["status"] = status
        print(json.dumps(summary, indent=2))
        # Not a success: a script waiting on this run must not take it as finished.
        raise InterruptedRun(f"{status} ({result.interrupted_by}); the checkpoint of step {step} "
                             f"is in {result.workdir}/checkpoints: re-run the same command to "
                             "resume")
    summary["status"] = "finished"
    print(json.dumps(summary, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dil-jax train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args, extras = parser.parse_known_args(argv)
    args.extra_args = extras
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from dil_jax.errors import DilJaxError
    from dil_jax.progress import logs_beside_bars

    try:
        with logs_beside_bars():  # log lines never cut the progress bar in two
            return run(args)
    except DilJaxError as error:  # as dil_jax.cli does: the message names the problem
        print(f"dil-jax train: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
