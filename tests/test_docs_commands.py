"""Documented commands that name a reader under dil_jax/assets/ must work as written: either the
folder is bundled in this checkout, or the same code block (or paragraph) says which commit's
`git checkout` brings it back (dil_jax/assets/README.md keeps the history)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSET = re.compile(r"dil_jax/assets/([A-Za-z0-9_.-]+)")
# What makes a block or paragraph a command a reader copies (not a sentence naming a reader).
COMMAND = re.compile(r"\bdil-jax \w|\bpython3? \S+\.py\b|--config\.|--checkpoint\b")


def markdown_units(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each fenced block, indented block and prose paragraph."""
    units: list[tuple[int, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith("```"):
            end = next((j for j in range(i + 1, len(lines))
                        if lines[j].lstrip().startswith("```")), len(lines) - 1)
            units.append((i + 1, "\n".join(lines[i:end + 1])))
            i = end + 1
            continue
        if not line.strip():
            i += 1
            continue
        indented = line.startswith("    ")
        start = i
        while i < len(lines) and lines[i].strip() and lines[i].startswith("    ") == indented \
                and not lines[i].lstrip().startswith("```"):
            i += 1
        units.append((start + 1, "\n".join(lines[start:i])))
    return units


def unbundled_commands(path: Path) -> list[str]:
    """Each command in `path` naming an absent dil_jax/assets/ folder without saying how to
    bring it back."""
    problems = []
    for line, unit in markdown_units(path.read_text(encoding="utf-8")):
        if not COMMAND.search(unit):
            continue
        for name in sorted(set(ASSET.findall(unit))):
            name = name.rstrip(".")
            if (ROOT / "dil_jax" / "assets" / name).exists():
                continue
            # The note may wrap over lines, as prose does.
            if not re.search(rf"git\s+checkout\s+[0-9a-f]{{7,40}}\s+--\s+dil_jax/assets/"
                             rf"{re.escape(name)}", unit):
                shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
                problems.append(f"{shown}:{line}: dil_jax/assets/{name}")
    return problems


def test_markdown_units_split_blocks_and_paragraphs():
    text = "A para\nstill it.\n\n    cmd one\n    cmd two\nafter\n\n```bash\nx\n\ny\n```\n"
    assert markdown_units(text) == [(1, "A para\nstill it."), (4, "    cmd one\n    cmd two"),
                                    (6, "after"), (8, "```bash\nx\n\ny\n```")]


def test_a_command_naming_an_unbundled_reader_is_caught(tmp_path):
    doc = tmp_path / "probe.md"
    doc.write_text("    dil-jax ask Q --index I --checkpoint dil_jax/assets/no-such-reader\n"
                   "\n    dil-jax ask Q --index I --checkpoint dil_jax/assets/minilm-squad-full\n"
                   "\n    # git checkout 0123abc -- dil_jax/assets/old-reader\n"
                   "    dil-jax ask Q --index I --checkpoint dil_jax/assets/old-reader\n")
    assert unbundled_commands(doc) == ["probe.md:1: dil_jax/assets/no-such-reader"]


def test_documented_commands_name_only_bundled_readers_or_say_how_to_restore_them():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted((ROOT / "benchmarks").glob("*.md"))]
    problems = [problem for doc in docs for problem in unbundled_commands(doc)]
    assert not problems, "\n".join(problems)
