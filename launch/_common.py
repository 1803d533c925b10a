"""Shared plumbing of the launchers: print-or-run a list of commands."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Sequence


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


def launcher_main(argv: Sequence[str] | None, build_parser, plan) -> int:
    """`launcher STEP [options] [-- EXTRA ...]`: parse, plan, run or print. EXTRA: the
    --config.key=value overrides of training, or the `dil-jax index` flags of an index step."""
    argv = sys.argv[1:] if argv is None else list(argv)
    own, overrides = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    args = build_parser().parse_args(own)
    args.overrides = overrides
    return execute(plan(args), args.dry_run)
