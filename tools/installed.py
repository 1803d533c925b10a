"""Whether tools/setup.sh has nothing to do: exit 0 when every requirement is already met.

    python3 -I tools/installed.py [--setup setup.py] [REQUIREMENT ...]

Met means: dil_jax is installed in editable mode from this checkout, with the console scripts
setup.py declares; every requirement of setup.py (install_requires and every extra) and every
REQUIREMENT given (the pins tools/setup.sh installs with --no-deps) is installed at a version its
specifier allows. The first unmet one is printed and the exit status is 1, so setup.sh runs pip;
pip's own check of an unchanged environment resolves and rebuilds the editable wheel, which
takes about 100 s here. Run it with `python3 -I`: from the checkout's root the interpreter would
otherwise read the work tree's dil_jax.egg-info instead of what is installed. Imports nothing
heavy (no jax), and without `packaging` it reports unmet, never a false "met".
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DISTRIBUTION = "dil_jax"


def declared(setup_py: Path) -> tuple[list[str], list[str]]:
    """-> (requirements, console scripts) written as literals in setup.py's `setup(...)` call:
    install_requires plus every list of extras_require, and the `console_scripts` entry points."""
    tree = ast.parse(setup_py.read_text(encoding="utf-8"), filename=str(setup_py))
    requirements: list[str] = []
    scripts: list[str] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup"):
            continue
        for keyword in node.keywords:
            value = ast.literal_eval(keyword.value) if keyword.arg in (
                "install_requires", "extras_require", "entry_points") else None
            if keyword.arg == "install_requires":
                requirements += value
            elif keyword.arg == "extras_require":
                requirements += [r for extra in value.values() for r in extra]
            elif keyword.arg == "entry_points":
                scripts += value.get("console_scripts", [])
    return requirements, scripts


def installed_from_here(root: Path) -> str | None:
    """None when dil_jax is an editable install of `root`, else why not."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return f"{DISTRIBUTION} is not installed"
    direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
    url = direct_url.get("url", "")
    if not direct_url.get("dir_info", {}).get("editable") or url != root.as_uri():
        return f"{DISTRIBUTION} is installed from {url or 'an index'}, not editable from {root}"
    return None


def unmet(requirement: str) -> str | None:
    """None when `requirement` (a PEP 508 string) is installed at an allowed version."""
    from packaging.requirements import Requirement

    parsed = Requirement(requirement)
    if parsed.marker is not None and not parsed.marker.evaluate():
        return None
    try:
        version = importlib.metadata.version(parsed.name)
    except importlib.metadata.PackageNotFoundError:
        return f"{requirement}: not installed"
    if not parsed.specifier.contains(version, prereleases=True):
        return f"{requirement}: {version} installed"
    return None


def first_unmet(root: Path, setup_py: Path, extra_requirements: list[str]) -> str | None:
    """None when nothing is missing, else the first missing piece, in words."""
    try:
        import packaging.requirements  # noqa: F401
    except ImportError:
        return "the `packaging` module is missing, so requirements cannot be checked"
    requirements, scripts = declared(setup_py)
    problem = installed_from_here(root)
    if problem:
        return problem
    have = {f"{e.name}={e.value}" for e in importlib.metadata.entry_points(group="console_scripts")
            if e.dist is not None and e.dist.name.replace("-", "_") == DISTRIBUTION}
    for script in scripts:
        if script.replace(" ", "") not in have:
            return f"console script {script!r} is not installed"
    for requirement in requirements + extra_requirements:
        problem = unmet(requirement)
        if problem:
            return problem
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("requirements", nargs="*", help="more PEP 508 requirements to check")
    parser.add_argument("--setup", type=Path, default=ROOT / "setup.py",
                        help="the setup.py whose requirements are checked (default: this repo's)")
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="the checkout dil_jax must be installed from (default: this one)")
    args = parser.parse_args(argv)
    problem = first_unmet(args.root.resolve(), args.setup, args.requirements)
    if problem:
        print(f"tools/installed.py: not yet installed: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
