"""tools/installed.py: setup.sh's "nothing to do" check reads setup.py's requirements and reports
the first one the environment does not meet (so setup.sh never skips a needed install)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO, load_script

installed = load_script("tools/installed.py")

SETUP_PY = '''
from setuptools import setup
setup(
    name="x",
    install_requires=["pytest>=1", "numpy"],
    extras_require={"a": ["packaging>=1"], "b": ["pytest"]},
    entry_points={"console_scripts": ["x-tool=x.cli:main"]},
)
'''


def test_declared_reads_requirements_extras_and_scripts(tmp_path):
    setup_py = tmp_path / "setup.py"
    setup_py.write_text(SETUP_PY)
    requirements, scripts = installed.declared(setup_py)
    assert requirements == ["pytest>=1", "numpy", "packaging>=1", "pytest"]
    assert scripts == ["x-tool=x.cli:main"]


def test_unmet_checks_the_installed_version():
    assert installed.unmet("pytest>=1") is None
    message = installed.unmet("pytest>=999")
    assert message.startswith("pytest>=999: ") and message.endswith(" installed")
    assert installed.unmet("no-such-distribution-dil-jax") == (
        "no-such-distribution-dil-jax: not installed")
    assert installed.unmet('pytest>=999; python_version < "3"') is None  # marker excludes it


def test_an_install_from_elsewhere_is_not_met(tmp_path):
    problem = installed.installed_from_here(tmp_path)
    assert problem is not None and str(tmp_path) in problem


def test_the_script_exits_1_naming_the_unmet_requirement(tmp_path):
    setup_py = tmp_path / "setup.py"
    setup_py.write_text(SETUP_PY)
    result = subprocess.run(
        [sys.executable, "-I", str(REPO / "tools" / "installed.py"), "--setup", str(setup_py),
         "--root", str(tmp_path), "pytest>=1"],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "not editable from" in result.stderr


@pytest.mark.parametrize("requirement", ["pytest>=999", "no-such-distribution-dil-jax"])
def test_first_unmet_names_an_extra_requirement(requirement, monkeypatch):
    monkeypatch.setattr(installed, "installed_from_here", lambda root: None)
    monkeypatch.setattr(installed, "declared", lambda setup_py: ([], []))
    assert installed.first_unmet(REPO, REPO / "setup.py", ["pytest>=1", requirement]).startswith(
        requirement)
