"""Documented commands must work as written.

A command naming a reader under dil_jax/assets/: the folder is bundled in this checkout, or the same
code block (or paragraph) says which commit's `git checkout` brings it back
(dil_jax/assets/README.md keeps the history). And every path any `dil-jax` / `python3 -m dil_jax`
command of README.md, docs/ (docs/results/ included) and benchmarks/ names exists, or a documented
command writes it first, or the doc says it is not bundled (`missing_paths`)."""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

from tests.helpers import REPO

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
            if (REPO / "dil_jax" / "assets" / name).exists():
                continue
            # The note may wrap over lines, as prose does.
            if not re.search(rf"git\s+checkout\s+[0-9a-f]{{7,40}}\s+--\s+dil_jax/assets/"
                             rf"{re.escape(name)}", unit):
                shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
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


def documented_pages() -> list[Path]:
    """README.md, every page under docs/ (the task pages and the logs of docs/results/) and
    benchmarks/'s."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")),
            *sorted((REPO / "benchmarks").rglob("*.md"))]


def test_documented_commands_name_only_bundled_readers_or_say_how_to_restore_them():
    docs = documented_pages()
    problems = [problem for doc in docs for problem in unbundled_commands(doc)]
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- every path named
#
# Every path a documented `dil-jax` / `python3 -m dil_jax` command names must exist in this
# checkout (or in ../shared, the shared data the tests read), or be written by a documented
# command (one earlier in the same file, or one in another file: the docs refer to each other),
# or be marked where it is named: "not bundled", or a `git checkout SHA -- PATH` that restores it.

COMMAND_START = re.compile(r"(?:^|(?<=[\s;&|(`]))(?:dil-jax|python3? -m dil_jax)\s+(?=[a-z])")
# Flags whose value a command writes (a file, or a folder whatever is under it).
OUTPUT_FLAGS = frozenset({"--out", "--output", "--config.workdir", "--cache-dir"})
# Commands whose config file names the workdir they write when --config.workdir is not given.
CONFIG_WORKDIR_COMMANDS = frozenset({"train", "prescreen"})
SHELL_BREAKS = frozenset({"&&", "||", ";", "|", "&"})
PATH_SUFFIXES = (".json", ".jsonl", ".py", ".png", ".md", ".npz", ".txt", ".npy")
# A stand-in the reader replaces: DIR, FILE, WORKDIR, runs/NAME, configs/NAME.py, $VAR, <x>, ...
PLACEHOLDER = re.compile(r"[$<>\[\]{}*]|\.\.\.|(^|/)[A-Z][A-Z0-9_]*(\.|/|$)|NAME")
SHARED = REPO.parent / "shared"


def logical_lines(unit: str) -> list[tuple[int, str]]:
    """(offset from the unit's first line, text) of each line of a fenced or indented block,
    backslash continuations joined; a prose paragraph gives its inline code spans instead."""
    lines = unit.splitlines()
    if lines and lines[0].lstrip().startswith("```"):
        body = [(i + 1, line) for i, line in enumerate(lines[1:-1])]
    elif lines and lines[0].startswith("    "):
        body = [(i, line[4:]) for i, line in enumerate(lines)]
    else:
        spans, offset = [], 0
        for match in re.finditer(r"`([^`]+)`", unit):
            offset = unit.count("\n", 0, match.start())
            spans.append((offset, " ".join(match.group(1).split())))
        return spans
    joined: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for offset, line in body:
        start, text = pending if pending else (offset, "")
        text += line
        if text.rstrip().endswith("\\"):
            pending = (start, text.rstrip()[:-1] + " ")
            continue
        pending = None
        joined.append((start, text))
    if pending:
        joined.append(pending)
    return joined


def command_tokens(text: str) -> list[list[str]]:
    """The tokens after `dil-jax` of each command in a line (up to a shell `&&`, `;`, `|` or a
    comment); a line shlex cannot split (an unbalanced quote in prose) gives none."""
    commands = []
    for match in COMMAND_START.finditer(text):
        lexer = shlex.shlex(text[match.end():], posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        try:
            tokens = list(lexer)
        except ValueError:
            continue
        if tokens and tokens[0].endswith(":"):
            continue  # an error message quoted ("dil-jax ask: error: ..."), not a command
        cut = next((i for i, token in enumerate(tokens) if token in SHELL_BREAKS), len(tokens))
        commands.append(tokens[:cut])
    return commands


def flag_values(tokens: list[str]) -> list[tuple[str, str]]:
    """(flag, value) of every value in a command's tokens: `--flag=value`, and the tokens after
    a `--flag` up to the next flag (a flag may take several, e.g. --checkpoint A B); tokens before
    the first flag are the subcommand's positionals, under flag ''."""
    pairs, flag = [], ""
    for token in tokens[1:]:
        if token.startswith("--"):
            flag, eq, value = token.partition("=")
            if eq:
                pairs.append((flag, value))
            continue
        if token.startswith("-") and len(token) > 1:
            flag = token
            continue
        pairs.append((flag, token))
    return pairs


def path_of(value: str) -> str | None:
    """The file path a flag value names, or None (a word, a placeholder, a URL): `squad:PATH`
    and `jsonl:PATH` give PATH, `FILE.py:ARG` gives FILE.py."""
    value = re.sub(r"^(squad|jsonl):", "", value)
    value = re.sub(r"\.py:.*$", ".py", value).rstrip(",;.)")
    if "://" in value or PLACEHOLDER.search(value):
        return None
    if "/" not in value and not value.endswith(PATH_SUFFIXES):
        return None
    return value.rstrip("/") or None


def config_workdir(spec: str) -> str | None:
    """The workdir a `--config FILE.py:ARG` names itself (None when it cannot be loaded)."""
    from dil_jax.train.config_files import load_config_file

    path, sep, arg = spec.partition(".py:")
    try:
        config = load_config_file(str(REPO / path) + (sep + arg if sep else ""))
    except Exception:  # a config or variant the docs name wrongly is a missing input below
        return None
    workdir = config.get("workdir")
    return str(workdir) if workdir else None


@dataclasses.dataclass(frozen=True)
class DocumentedCommand:
    """A dil-jax command of a doc, or (shell=True) another command line of a code block, whose
    paths all count as written by it (`python -c "... open('runs/x.json', 'w') ..."`)."""

    doc: Path
    line: int
    unit: str
    command: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    shell: bool = False


def shell_paths(text: str) -> tuple[str, ...]:
    """The paths a command line that is not dil-jax's names (quoted or not)."""
    suffixes = "|".join(re.escape(suffix) for suffix in PATH_SUFFIXES)
    words = re.findall(rf"[\w.~-]*/[\w./~-]+|[\w.-]+(?:{suffixes})\b", text)
    return tuple(path for word in words if (path := path_of(word)) is not None)


def documented_commands(doc: Path) -> list[DocumentedCommand]:
    """Every dil-jax command of `doc`, with the paths it reads and writes."""
    from dil_jax.cli import build_parser

    demo_index = build_parser().parse_args(["demo"]).index
    found = []
    for line, unit in markdown_units(doc.read_text(encoding="utf-8")):
        block = unit.startswith(("    ", "```"))
        for offset, text in logical_lines(unit):
            if block and not COMMAND_START.search(text) and not text.lstrip().startswith(
                    ("#", "```")) and shell_paths(text):
                found.append(DocumentedCommand(doc, line + offset, unit, text.strip(), (),
                                               shell_paths(text), shell=True))
            for tokens in command_tokens(text):
                if not tokens:
                    continue
                inputs, outputs = [], []
                for flag, value in flag_values(tokens):
                    path = path_of(value)
                    if path is None:
                        continue
                    (outputs if flag in OUTPUT_FLAGS else inputs).append(path)
                command = tokens[0]
                if command == "demo" and not any(f == "--index" for f, _ in
                                                 flag_values(tokens)):
                    outputs.append(demo_index)
                if command in CONFIG_WORKDIR_COMMANDS and not any(
                        f == "--config.workdir" for f, _ in flag_values(tokens)):
                    spec = next((v for f, v in flag_values(tokens) if f == "--config"), None)
                    workdir = config_workdir(spec) if spec and path_of(spec) else None
                    if workdir:
                        outputs.append(workdir)
                found.append(DocumentedCommand(doc, line + offset, unit, " ".join(tokens),
                                               tuple(inputs), tuple(outputs)))
    return found


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def marked_absent(path: str, unit: str) -> bool:
    """Whether the block or paragraph says how to restore `path` (`git checkout SHA -- path`),
    or one of its lines names it (or a folder above it) and says it is not bundled."""
    if re.search(rf"git\s+checkout\s+[0-9a-f]{{7,40}}\s+--\s+{re.escape(path)}", unit):
        return True
    parts = path.split("/")
    named = ["/".join(parts[:n]) for n in range(2, len(parts) + 1)]
    return any(re.search(r"not\s+bundled|no\s+longer\s+bundled", line)
               and any(name in line for name in named) for line in unit.splitlines())


def missing_paths(commands: list[DocumentedCommand], root: Path = REPO) -> list[str]:
    """'doc:line: path (in `command`)' for each input path that exists nowhere."""
    problems = []
    for command in commands:
        for path in command.inputs:
            if (root / path).exists():
                continue
            if path.startswith("../shared/") and not SHARED.is_dir():
                continue  # no shared data on this machine: nothing to check against
            produced = any(
                _under(path, output) for other in commands for output in other.outputs
                if other.doc != command.doc or other.line < command.line
                or (other.line == command.line and other is not command
                    and commands.index(other) < commands.index(command)))
            if produced or marked_absent(path, command.unit):
                continue
            shown = (command.doc.relative_to(root) if command.doc.is_relative_to(root)
                     else command.doc.name)
            problems.append(f"{shown}:{command.line}: {path} (in `dil-jax {command.command}`)")
    return problems


PROBE_DOC = """\
    dil-jax index --out runs/made --corpus squad:{data}
    dil-jax ask "Who?" --index runs/made/sub --checkpoint dil_jax/assets/no-such-reader

Then `dil-jax ask "Who?" --index runs/later` fails: runs/later is written only below, and
`dil-jax predict --data DIR/FILE.json --output x.json` names placeholders only; a quoted error
`dil-jax ask: error: runs/gone: no such file` is no command.

    dil-jax index --out runs/later --corpus wikipedia
    dil-jax train --config configs/minilm_squad.py:k4_warm
    dil-jax predict --checkpoint runs/minilm_squad_k4_warm/params --data {data} --output p.json
    dil-jax predict --checkpoint runs/old/params --data {data} --output p.json  # not bundled
    dil-jax demo
    dil-jax plot runs/demo-index --out c.png
    dil-jax plot runs/nowhere
"""


def test_a_path_no_command_writes_and_no_note_marks_is_caught(tmp_path):
    doc = tmp_path / "probe.md"
    doc.write_text(PROBE_DOC.format(data="README.md"))
    commands = [c for c in documented_commands(doc) if not c.shell]
    assert [c.command.split()[0] for c in commands] == [
        "index", "ask", "ask", "predict", "index", "train", "predict", "predict", "demo", "plot",
        "plot"]
    assert commands[5].outputs == ("runs/minilm_squad_k4_warm",)  # the config's workdir
    assert commands[8].outputs == ("runs/demo-index",)  # demo's own --index
    assert [problem.split(" (in")[0] for problem in missing_paths(commands)] == [
        "probe.md:2: dil_jax/assets/no-such-reader",
        "probe.md:4: runs/later",
        "probe.md:14: runs/nowhere",
    ]


def test_documented_commands_name_only_paths_that_exist_or_an_earlier_command_writes():
    docs = documented_pages()
    commands = [command for doc in docs for command in documented_commands(doc)]
    assert len(commands) > 50  # the scan found the docs' commands
    problems = missing_paths(commands)
    assert not problems, "\n".join(problems)


def test_ci_runs_the_readme_test_command():
    """README's second command installs and runs the tests; `.ci/run` must run exactly that."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", readme, re.DOTALL)
    assert block, "README.md opens with a bash block of two commands"
    demo, tests = [line.split("  #")[0].strip() for line in block.group(1).splitlines()[:2]]
    assert demo == "bash tools/setup.sh && python3 -m dil_jax demo"
    assert tests.startswith("bash tools/setup.sh && python3 -m pytest ")
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()
          if line.strip() and not line.lstrip().startswith(("#", "set ", "cd "))]
    assert ci == [tests], f".ci/run runs {ci}, README's test command is {tests!r}"
