"""Shared plumbing of the launchers: their common options, the plan of a step, print-or-run a
list of commands."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence


def show(command: Sequence[str]) -> str:
    """The exact shell line of `command` (what --dry-run prints)."""
    return shlex.join(command)


def execute(commands: Sequence[Sequence[str]], dry_run: bool) -> int:
    """Prints each command; runs it unless dry_run. Stops at the first failure."""
    for command in commands:
        print(show(command), flush=True)
        if dry_run:
            continue
        code = subprocess.run(list(command), check=False).returncode
        if code:
            print(f"launch: command failed with exit code {code}", file=sys.stderr)
            return code
    return 0


def train_command(python: str, config: str, overrides: Sequence[str]) -> list[str]:
    """`python -m dil_jax.commands.train --config CONFIG [--config.k=v ...]`."""
    for override in overrides:
        if not override.startswith("--config."):
            raise SystemExit(f"launch: overrides must look like --config.key=value, got "
                             f"{override!r}")
    return [python, "-m", "dil_jax.commands.train", "--config", config, *overrides]


def launcher_parser(description: str, steps: Sequence[str]) -> argparse.ArgumentParser:
    """A launcher's parser: STEP (one of `steps`, or "all" for the launcher's full plan); the
    launcher adds its own options, then `common_options`."""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=(*steps, "all"))
    return parser


def common_options(parser: argparse.ArgumentParser, workdir_help: str) -> argparse.ArgumentParser:
    """--config, --workdir and --dry-run, which every launcher takes; returns `parser`."""
    parser.add_argument("--config", default="", help="config file[:variant] (run)")
    parser.add_argument("--workdir", default="", help=workdir_help)
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    return parser


def plan_steps(args: argparse.Namespace, full_plan: Sequence[str],
               step_functions: Mapping[str, Callable[[argparse.Namespace], list[list[str]]]]
               ) -> list[list[str]]:
    """The commands of `args.step`, or of every step of `full_plan` in order for "all";
    `step_functions`: the launcher's step functions by name (its `globals()`)."""
    steps = full_plan if args.step == "all" else (args.step,)
    return [command for step in steps for command in step_functions[step](args)]


def launcher_main(argv: Sequence[str] | None, build_parser, plan) -> int:
    """`launcher STEP [options] [-- EXTRA ...]`: parse, plan, run or print. EXTRA: the
    --config.key=value overrides of training, or the `dil-jax index` flags of an index step."""
    argv = sys.argv[1:] if argv is None else list(argv)
    own, overrides = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    args = build_parser().parse_args(own)
    args.overrides = overrides
    return execute(plan(args), args.dry_run)
