"""The first minute of a new user: `dil-jax --help` and `dil-jax CMD --help`.

Start-up: building the parser and printing any command's help must not import jax, flax, orbax,
torch or transformers (together seconds on a small CPU); the commands import them when they run.
Help texts: every flag says what it does and shows its default.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from dil_jax.cli import build_parser

from tests.helpers import REPO

HEAVY = ("jax", "jaxlib", "flax", "orbax", "torch", "transformers", "tokenizers", "numpy",
         "starlette", "uvicorn", "fastapi", "prometheus_client", "httpx")

# Run in a fresh interpreter: this test process has long imported jax through conftest and other
# tests, so its own sys.modules says nothing.
_PROBE = """
import argparse, contextlib, io, json, sys
from dil_jax.cli import build_parser
parser = build_parser()
with contextlib.redirect_stdout(io.StringIO()):
    for argv in [["--help"]] + [[name, "--help"] for name in sys.argv[1:]]:
        try:
            parser.parse_args(argv)
        except SystemExit:
            pass
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
"""


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_help_of_every_command_imports_no_heavy_library():
    names = sorted(_subcommands(build_parser()))
    assert {"ask", "demo", "index", "odqa-eval", "bench", "check"} <= set(names)
    done = subprocess.run([sys.executable, "-c", _PROBE, *names], cwd=REPO, check=True,
                          capture_output=True, text=True, env={"PYTHONPATH": str(REPO),
                                                               "PATH": "/usr/bin:/bin"})
    imported = set(json.loads(done.stdout))
    assert "dil_jax" in imported  # the probe did import the package it checks
    assert imported.isdisjoint(HEAVY), sorted(imported & set(HEAVY))


def test_import_dil_jax_is_light_and_public_names_resolve_lazily():
    probe = ("import sys, dil_jax; light = 'jax' not in sys.modules; "
             "from dil_jax import load_hf_checkpoint, EncoderConfig, bundled_reader; "
             "print(light, callable(load_hf_checkpoint), 'jax' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, check=True,
                          capture_output=True, text=True, env={"PYTHONPATH": str(REPO),
                                                               "PATH": "/usr/bin:/bin"})
    assert done.stdout.split() == ["True", "True", "True"]


def test_unknown_public_name_is_an_attribute_error():
    import dil_jax

    with pytest.raises(AttributeError, match="no_such_name"):
        dil_jax.no_such_name  # noqa: B018


def _flags(parser: argparse.ArgumentParser, command: str = ""):
    """(command, action) for every flag and positional of every command, -h excepted."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _flags(sub, name)
        elif not isinstance(action, argparse._HelpAction):
            yield command, action


def test_every_flag_has_help_and_shows_its_default():
    parser = build_parser()
    flags = list(_flags(parser))
    assert len(flags) > 100  # the walk reached every command's flags
    missing, no_default = [], []
    for command, action in flags:
        name = "/".join(action.option_strings) or action.dest
        if not (action.help or "").strip():
            missing.append(f"{command} {name}")
            continue
        # What --help prints for it (the command's own formatter, as `dil-jax CMD --help` uses).
        shown = parser._subparsers._group_actions[0].choices[command]._get_formatter() \
            ._expand_help(action) if command else action.help
        flat = " ".join(shown.split())
        switch = action.nargs == 0  # store_true / store_false: off unless given
        positional = not action.option_strings  # `ask "question"`: its help says when to omit
        if not (switch or positional or action.required or "(default" in flat or "default:" in flat
                or "; default" in flat):
            no_default.append(f"{command} {name}: {flat}")
    assert not missing, missing
    assert not no_default, "\n".join(no_default)


def test_defaults_are_shown_as_typed():
    from dil_jax.commands.arguments import default_text

    assert default_text([29, 100]) == "29 100"
    assert default_text(("minilm",)) == "minilm"
    assert default_text(0.5) == "0.5"
    assert default_text([]) == "none"


@pytest.mark.parametrize("command,flag,values", [
    ("ask", "--top-p", ("29",)), ("demo", "--top-p", ("10",)), ("odqa-eval", "--p", ("29", "100"))])
def test_top_p_defaults_that_differ_say_why(command, flag, values):
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[command]
    action = next(a for a in sub._actions if flag in a.option_strings)
    assert action.help, f"{command} {flag} has no help"
    text = " ".join(sub._get_formatter()._expand_help(action).split())
    assert f"(default: {' '.join(values)})" in text or all(v in text for v in values)
    # Each names the other command's depth and why it differs.
    assert ("demo" in text) if command != "demo" else ("ask" in text), text
