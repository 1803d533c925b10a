"""The `dil-jax` command line: one entry point, one module per subcommand.

Each module in `dil_jax.commands` exposes `register(subparsers)`, which adds its parser and sets
`func` (called with the parsed args, returning an exit code). Heavy imports (jax, flax, orbax,
torch, transformers, numpy) happen inside the commands' `run`, never at module level or in
`register`, and `import dil_jax` resolves its public names lazily: `dil-jax --help` and every
`dil-jax CMD --help` cost about a bare interpreter's start (tests/test_cli_help.py checks it).

Errors: a `DilJaxError` (bad flag, file, field or value; see `dil_jax/errors.py`) is caught here,
once, and printed as one line naming the problem, exit status 1. `--debug` (or the environment
variable `DIL_JAX_DEBUG=1`) shows its traceback too. Any other exception is a bug and keeps its
traceback, except the disk refusing a write (full, read-only, a file-size limit:
`errors.disk_refusal`) wherever it surfaced (orbax, tensorstore, numpy): one line too. Ctrl-C
exits with 130 without one. What orbax and tensorstore print around such a failure is left out
too (unless --verbose or --debug): absl's records of the refused write (each with its
traceback; the command reports the refusal itself), asyncio's "exception was never retrieved"
records of the same refusal, and the late "Event loop is closed"
callbacks of the writes then in flight (`errors.is_late_loop_callback`); together they were
hundreds of lines around the one that says what happened.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys

from dil_jax.errors import (
    DilJaxError,
    disk_refusal,
    disk_refusal_in_text,
    is_late_loop_callback,
)

DEBUG_ENV = "DIL_JAX_DEBUG"

# Subcommand modules, in the order `--help` lists them.
COMMAND_MODULES = (
    "dil_jax.commands.check",
    "dil_jax.commands.predict",
    "dil_jax.commands.evaluate",
    "dil_jax.commands.export",
    "dil_jax.commands.index",
    "dil_jax.commands.odqa",
    "dil_jax.commands.demo",
    "dil_jax.commands.train",
    "dil_jax.commands.plot",
    "dil_jax.commands.bench",
    "dil_jax.commands.prescreen",
    "dil_jax.commands.serve",
)


def build_parser() -> argparse.ArgumentParser:
    from dil_jax.commands.arguments import HelpFormatter

    parser = argparse.ArgumentParser(
        prog="dil-jax", formatter_class=HelpFormatter,
        description="Delayed Interaction Layers for question answering in JAX/Flax.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--debug", action="store_true",
                        help=f"show the traceback of a reported error (or set {DEBUG_ENV}=1)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    # One formatter for every command, set here rather than in each register(), so that a new
    # command's flags show their defaults too.
    for command_parser in subparsers.choices.values():
        command_parser.formatter_class = HelpFormatter
    return parser


def _compilation_cache(args: argparse.Namespace) -> contextlib.AbstractContextManager:
    """JAX's persistent compilation cache as the command's flags and the environment say
    (`dil_jax.compilation_cache`), for the commands that compile; nothing for the others (and
    no JAX import)."""
    if not getattr(args, "compiles", False):
        return contextlib.nullcontext()
    from dil_jax import compilation_cache

    return compilation_cache.applied(compilation_cache.choose(
        args.compilation_cache, args.no_compilation_cache, os.environ))


def _logs_beside_bars() -> contextlib.AbstractContextManager:
    """Log records written through tqdm while the command runs, so that a log line never cuts
    a progress bar in two (`dil_jax.progress.logs_beside_bars`; the console handlers are put
    back after)."""
    from dil_jax.progress import logs_beside_bars

    return logs_beside_bars()


def _debugging(args: argparse.Namespace) -> bool:
    """--debug or DIL_JAX_DEBUG: errors keep their tracebacks, nothing is left out."""
    return args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")


class _DiskRefusalRecords(logging.Filter):
    """Drops the log records of a write the disk refused (orbax logs one per failed thread
    through absl, with its traceback): the command reports the refusal in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        refused = (error is not None and disk_refusal(error)) or \
            disk_refusal_in_text(record.getMessage())
        return not refused


def _quiet_failed_saves() -> None:
    """Leaves out what orbax and tensorstore print around a failed save (see the module's
    docstring); once per process. The hook stays after main returns: the late callbacks come
    until the interpreter exits."""
    # absl: orbax's record of each failed thread. asyncio: "_GatheringFuture exception was
    # never retrieved", when a gather of tensorstore writes is dropped after one write failed
    # (seen under load, when several writes fail before orbax gives up).
    for name in ("absl", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DiskRefusalRecords) for f in logger.filters):
            logger.addFilter(_DiskRefusalRecords())
    previous = sys.unraisablehook
    if getattr(previous, "drops_late_loop_callbacks", False):
        return

    def hook(unraisable) -> None:
        if not is_late_loop_callback(unraisable):
            previous(unraisable)

    hook.drops_late_loop_callbacks = True
    sys.unraisablehook = hook


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # Unknown arguments are errors, except for commands that take ml_collections-style
    # `--config.key=value` overrides (argparse cannot declare an open set of dotted options).
    args, extra_args = parser.parse_known_args(argv)
    if extra_args and not getattr(args, "accepts_config_overrides", False):
        parser.error(f"unrecognized arguments: {' '.join(extra_args)}")
    args.extra_args = extra_args
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        # JAX logs at INFO that it found no TPU; that is not news to a CPU or GPU user.
        logging.getLogger("jax").setLevel(logging.WARNING)
        # orbax logs every checkpoint read and write at INFO through absl.
        logging.getLogger("absl").setLevel(logging.WARNING)
        if not _debugging(args):
            _quiet_failed_saves()
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        with _compilation_cache(args), _logs_beside_bars():
            return int(args.func(args) or 0)
    except DilJaxError as error:
        # Our errors name the file/field/value; a trace from deep inside adds nothing for a user.
        if _debugging(args):
            raise
        print(f"dil-jax {args.command}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"dil-jax {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # the disk refusing a write, wherever it surfaced; else a bug
        reason = disk_refusal(error)
        if reason is None or _debugging(args):
            raise
        where = getattr(error, "filename", None)
        print(f"dil-jax {args.command}: error: cannot write{f' {where}' if where else ''}: "
              f"{reason}; free space, raise the file-size limit (ulimit -f) or write to "
              "another folder, then rerun: interrupted builds and training resume",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
