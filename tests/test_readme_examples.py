"""The Python examples of README.md and the docs/ pages run as written.

Every ```python block of README.md and docs/*.md is marked `python runnable` (run here, each in a
fresh namespace) or `python not-runnable` (it needs something a test cannot have, e.g. the
network; the page says what). An unmarked block fails the test: nothing is skipped silently.
"""

from __future__ import annotations

import re

import pytest

from tests.helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(python[^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
MARKS = ("runnable", "not-runnable")


def python_blocks(text: str) -> list[tuple[int, str, str]]:
    """(line, mark, code) of each ```python block; mark is the word after "python" ("" if
    none)."""
    blocks = []
    for match in FENCE.finditer(text):
        words = match.group(1).split()
        line = text.count("\n", 0, match.start()) + 1
        blocks.append((line, words[1] if len(words) > 1 else "", match.group(2)))
    return blocks


BLOCKS = [(f"{page.relative_to(REPO)}:{line}", mark, code) for page in PAGES
          for line, mark, code in python_blocks(page.read_text(encoding="utf-8"))]
RUNNABLE = [(where, code) for where, mark, code in BLOCKS if mark == "runnable"]


def test_python_blocks_are_found_and_each_is_marked():
    assert python_blocks("x\n```python runnable\na = 1\n```\n```python\nb\n```\n") == [
        (2, "runnable", "a = 1\n"), (5, "", "b\n")]
    unmarked = [where for where, mark, _ in BLOCKS if mark not in MARKS]
    assert not unmarked, f"{unmarked}: mark each ```python block " \
                         f"'python runnable' or 'python not-runnable'"
    assert len(RUNNABLE) >= 2
    assert any(where.startswith("README.md:") for where, _ in RUNNABLE)


@pytest.mark.parametrize("where,code", RUNNABLE, ids=[where for where, _ in RUNNABLE])
def test_readme_example_runs(where, code):
    exec(compile(code, where, "exec"), {"__name__": "readme_example"})
