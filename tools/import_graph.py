"""The import graph of dil_jax: cycles and imports that run into the command layer.

    python3 tools/import_graph.py [ROOT]   # prints modules, edges, cycles; exit 1 on a problem

Every `import dil_jax...` / `from dil_jax... import ...` counts, including imports inside
functions (a circle hidden in a function is still a circle). A package's `__init__` counts as the
package module. Rules checked: no cycle among modules other than a package and its own
submodules re-exported by its `__init__`; no module outside `dil_jax.commands` (but `dil_jax.cli`,
which dispatches to them) imports any module of `dil_jax.commands`, its shared
`dil_jax.commands.arguments` included (what the library needs of a command lives below it, e.g.
`dil_jax.readers.request`); no command module imports another command module except
`dil_jax.commands.arguments`, which the commands share.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = "dil_jax"
COMMANDS = "dil_jax.commands"
# What every command may import of its own layer (and nothing below the layer may).
SHARED_COMMAND_MODULES = {COMMANDS, "dil_jax.commands.arguments"}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(tree: ast.AST, known: set[str]) -> set[str]:
    """The dil_jax modules a module imports (for `from a import b`, `a.b` when it is a module)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] != PACKAGE:
                continue
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    paths = sorted((root / PACKAGE).rglob("*.py"))
    names = {module_name(path, root): path for path in paths}
    return {name: imported_modules(ast.parse(path.read_text()), set(names)) - {name}
            for name, path in names.items()}


def is_own_package(a: str, b: str) -> bool:
    """a is a package and b one of its submodules, or the reverse (re-exports are no circle)."""
    return b.startswith(a + ".") or a.startswith(b + ".")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), package links removed."""
    edges = {a: {b for b in bs if not is_own_package(a, b)} for a, bs in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def is_command(module: str) -> bool:
    return module == COMMANDS or module.startswith(COMMANDS + ".")


def command_layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """An import into the command layer from below it (`dil_jax.cli` dispatches to the
    commands: it stands above them), and one command importing another."""
    problems = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if not is_command(target) or module == "dil_jax.cli":
                continue
            if not is_command(module):
                problems.append(f"{module} imports the command module {target}")
            elif module != target and target not in SHARED_COMMAND_MODULES:
                problems.append(f"command {module} imports another command, {target}")
    return problems


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    graph = import_graph(root)
    found = cycles(graph)
    problems = command_layer_violations(graph)
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} import edges")
    for component in found:
        print("cycle:", " <-> ".join(component))
    for problem in problems:
        print(problem)
    if not found and not problems:
        print("no cycles; nothing imports a command module")
    return 1 if found or problems else 0


if __name__ == "__main__":
    sys.exit(main())
