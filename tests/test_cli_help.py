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
from pathlib import Path

import pytest

from dil_jax.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("jax", "jaxlib", "flax", "orbax", "torch", "transformers", "tokenizers", "numpy")

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
    done = subprocess.run([sys.executable, "-c", _PROBE, *names], cwd=ROOT, check=True,
                          capture_output=True, text=True, env={"PYTHONPATH": str(ROOT),
                                                               "PATH": "/usr/bin:/bin"})
    imported = set(json.loads(done.stdout))
    assert "dil_jax" in imported  # the probe did import the package it checks
    assert imported.isdisjoint(HEAVY), sorted(imported & set(HEAVY))


def test_import_dil_jax_is_light_and_public_names_resolve_lazily():
    probe = ("import sys, dil_jax; light = 'jax' not in sys.modules; "
             "from dil_jax import load_hf_checkpoint, EncoderConfig, bundled_reader; "
             "print(light, callable(load_hf_checkpoint), 'jax' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, check=True,
                          capture_output=True, text=True, env={"PYTHONPATH": str(ROOT),
                                                               "PATH": "/usr/bin:/bin"})
    assert done.stdout.split() == ["True", "True", "True"]


def test_unknown_public_name_is_an_attribute_error():
    import dil_jax

    with pytest.raises(AttributeError, match="no_such_name"):
        dil_jax.no_such_name  # noqa: B018
