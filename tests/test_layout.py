"""The package layout's rules hold: no import cycle, nothing imports a command module."""

from __future__ import annotations

import ast

from tests.helpers import REPO, load_script

import_graph = load_script("tools/import_graph.py")


def test_dil_jax_has_no_import_cycle_and_no_import_into_commands():
    graph = import_graph.import_graph(REPO)
    assert "dil_jax.model.delayed" in graph["dil_jax.reading.grid"]  # the scan sees imports
    assert import_graph.cycles(graph) == []
    assert import_graph.command_layer_violations(graph) == []


def test_the_checker_finds_a_cycle_hidden_in_a_function():
    # a imports b at the top; b imports a inside a function: still a circle.
    a = ast.parse("import dil_jax.b\n")
    b = ast.parse("def f():\n    from dil_jax.a import x\n")
    known = {"dil_jax.a", "dil_jax.b"}
    graph = {"dil_jax.a": import_graph.imported_modules(a, known),
             "dil_jax.b": import_graph.imported_modules(b, known)}
    assert import_graph.cycles(graph) == [["dil_jax.a", "dil_jax.b"]]
    assert import_graph.command_layer_violations(
        {"dil_jax.predict": {"dil_jax.commands.odqa"}}) == [
        "dil_jax.predict imports the command module dil_jax.commands.odqa"]


def test_the_commands_shared_module_is_theirs_alone():
    """Commands share `commands.arguments`; a module below the command layer importing it is
    an arrow back up like any other (it was exempt while the server loaded its readers there:
    `readers.request` holds that now)."""
    violations = import_graph.command_layer_violations
    assert violations({"dil_jax.serve.loading": {"dil_jax.commands.arguments"}}) == [
        "dil_jax.serve.loading imports the command module dil_jax.commands.arguments"]
    assert violations({"dil_jax.commands.odqa": {"dil_jax.commands.arguments"},
                       "dil_jax.cli": {"dil_jax.commands.odqa"}}) == []
    assert violations({"dil_jax.commands.odqa": {"dil_jax.commands.index"}}) == [
        "command dil_jax.commands.odqa imports another command, dil_jax.commands.index"]
