"""Names the docs and the package's docstrings give exist.

What is checked, in README.md, every page under docs/ (results included) and benchmarks/, and
in the docstrings and comments of dil_jax/:
- a backticked dotted name that starts at this package (`dil_jax.open_domain.cache.check`), at
  one of its modules, however much of its path is given (`cache.build`,
  `reading.upper.read_upper`), or at a name one of its modules defines (`PairGrid.read_pairs`):
  the module is imported and the rest looked up (an attribute, a method, a dataclass field);
  a dotted key of the training config (`data.doc_stride`, `config.model.kind`) counts too;
- `module:name` and `path.py:name` (`dil_jax.train.squad_data:featurize`,
  `dil_jax/serve/loading.py:load_served_readers`): the module, and the name in it;
- a backticked path of the repository (`dil_jax/serve/app.py`, `tools/setup.sh`, `tests/model/`)
  exists, and so does a package path given from inside the package (`serve/app.py`);
- in the docstrings and comments, a backticked snake_case identifier (`check_states`) and any
  private one, backticked or not (`_check_checkpoint_count`), occurs in the code, and a file
  name (`build.py`) is a file of the repository;
- a section a page, a docstring, a comment or a message points to (`docs/serving.md,
  "Framework"`) is a heading or a bold lead of that page (a part of its words will do).
Words that name nothing here are left alone: `jax.jit`, `np.testing`, `index.json`, `runs/x`,
`configs/NAME.py` (a placeholder), a flag, a number.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import inspect
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO

PACKAGE = "dil_jax"
# Folders whose files a doc may name by path (the repository's sources and pages).
PATH_ROOTS = ("dil_jax", "tests", "tools", "benchmarks", "configs", "launch", "docs", ".ci")
# Folders whose code defines the identifiers a docstring may name (tests: their defs only).
CODE_ROOTS = ("dil_jax", "configs", "tools", "benchmarks", "launch")
# A file name, not a dotted Python name (`config.json`, `model.safetensors`).
FILE_SUFFIXES = frozenset({
    "json", "jsonl", "py", "md", "txt", "png", "npy", "npz", "sh", "safetensors", "bin", "xz",
    "gz", "tar", "csv", "toml", "cfg", "yaml", "yml", "lock", "html", "prof", "log", "pkl",
    "msgpack", "model", "00"})
IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
DOTTED = re.compile(rf"{IDENTIFIER}(?:\.{IDENTIFIER})+")
# A placeholder the reader replaces: NAME, DIR, <x>, {a,b}, *, ...
PLACEHOLDER = re.compile(r"[*<>{}\[\]$]|\.\.\.|(^|/)[A-Z][A-Z0-9_]*(\.|/|:|$)")
BACKTICKED = re.compile(r"`([^`\n]+)`")
# Other projects' names a docstring gives in backticks, with whose they are: not this code's.
EXTERNAL = {
    "use_mems_eval": "transformers' XLNetConfig", "use_mems_train": "transformers' XLNetConfig",
    "padding_idx": "transformers' RoBERTa embeddings",
    "create_position_ids_from_input_ids": "transformers' RoBERTa",
    "select_starts_ends": "transformers' QA pipeline", "decode_spans": "transformers' QA pipeline",
    "token_to_word": "tokenizers' Encoding", "run_squad": "transformers' example script",
    "run_squad.py": "XLNet's and transformers' example scripts",
    "find_best_thresh": "the official SQuAD v2.0 evaluation script",
    "importlib_resources": "a PyPI package", "optimization_barrier": "jax.lax",
    "num_updates": "TensorFlow's ExponentialMovingAverage",
}
# Hugging Face tensor names start with these (`bert.embeddings.word_embeddings.weight`).
TENSOR_PREFIXES = frozenset({"bert", "roberta", "albert", "electra", "distilbert", "transformer"})


@dataclasses.dataclass(frozen=True)
class Mention:
    where: str  # file:line
    text: str  # what the backticks (or the prose) hold
    # "name": a backticked span; "code": an identifier of a docstring or comment, which the code
    # must hold; "file": a file name of a docstring or comment, which the repository must hold
    kind: str


# --------------------------------------------------------------------------- what exists


def python_files(root: str) -> list[Path]:
    return sorted(path for path in (REPO / root).rglob("*.py") if "__pycache__" not in path.parts)


@functools.cache
def package_modules() -> tuple[str, ...]:
    """Every module of dil_jax, dotted."""
    names = []
    for path in python_files(PACKAGE):
        parts = path.relative_to(REPO).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return tuple(sorted(names))


@functools.cache
def top_level_names() -> dict[str, tuple[str, ...]]:
    """name -> the modules of dil_jax that define it at their top level (def, class, assignment)."""
    found: dict[str, list[str]] = {}
    for module in package_modules():
        for name in module_definitions(module):
            found.setdefault(name, []).append(module)
    return {name: tuple(modules) for name, modules in found.items()}


def module_file(module: str) -> Path:
    path = REPO / Path(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


@functools.cache
def module_definitions(module: str) -> frozenset[str]:
    tree = ast.parse(module_file(module).read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return frozenset(names)


@functools.cache
def code_identifiers() -> frozenset[str]:
    """Every identifier the code uses: names, attributes, parameters, keywords, definitions,
    imports and the identifier-like words of its strings (JSON fields, metric names), not of
    its docstrings; and the names tests define (a doc may name a test)."""
    words: set[str] = set()
    for root in CODE_ROOTS:
        for path in python_files(root):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                          if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                               ast.AsyncFunctionDef))
                          and node.body and isinstance(node.body[0], ast.Expr)
                          and isinstance(node.body[0].value, ast.Constant)}
            words.add(path.stem)
            for node in ast.walk(tree):
                if isinstance(node, ast.Name):
                    words.add(node.id)
                elif isinstance(node, ast.Attribute):
                    words.add(node.attr)
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    words.add(node.name)
                elif isinstance(node, ast.arg):
                    words.add(node.arg)
                elif isinstance(node, ast.keyword) and node.arg:
                    words.add(node.arg)
                elif isinstance(node, ast.alias):
                    words.update(node.name.split("."))
                    if node.asname:
                        words.add(node.asname)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                        and id(node) not in docstrings:
                    words.update(re.findall(IDENTIFIER, node.value))
    for path in python_files("tests"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        words.update(node.name for node in ast.walk(tree)
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
    return frozenset(words)


@functools.cache
def config_keys() -> frozenset[str]:
    """The dotted keys of the training config (`data.doc_stride`), and every prefix of them."""
    from dil_jax.train.default_config import base_config

    keys: set[str] = set()

    def walk(value, prefix: str) -> None:
        if prefix:
            keys.add(prefix)
        if hasattr(value, "items"):
            for key, child in value.items():
                walk(child, f"{prefix}.{key}" if prefix else key)

    walk(base_config(), "")
    return frozenset(keys)


@functools.cache
def module_tree(module: str) -> ast.Module:
    return ast.parse(module_file(module).read_text(encoding="utf-8"))


@functools.cache
def instance_attributes(module: str, name: str) -> frozenset[str]:
    """What the methods of class `name` of `module` set on `self` (`self.x = ...`, and
    `object.__setattr__(self, "x", ...)` in a frozen dataclass)."""
    found: set[str] = set()
    for klass in module_tree(module).body:
        if not (isinstance(klass, ast.ClassDef) and klass.name == name):
            continue
        for node in ast.walk(klass):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id == "self":
                found.add(node.attr)
            elif isinstance(node, ast.Call) and ast.unparse(node.func) == "object.__setattr__" \
                    and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                found.add(str(node.args[1].value))
    return frozenset(found)


def has_attribute(value: object, name: str) -> bool:
    """An attribute of `value`; of a class: also a dataclass field without a default and what
    its methods set on `self`; of a module: also an attribute of one of its classes (so
    `plan.trims_padding` names `ReusePlan.trims_padding` of `reading/plan.py`)."""
    if hasattr(value, name):
        return True
    if isinstance(value, type):
        for klass in value.__mro__:
            if name in getattr(klass, "__dataclass_fields__", {}) \
                    or name in getattr(klass, "__annotations__", {}):
                return True
            if klass.__module__.split(".")[0] == PACKAGE and name in instance_attributes(
                    klass.__module__, klass.__name__):
                return True
        return False
    if inspect.ismodule(value):
        return any(has_attribute(klass, name) for klass in vars(value).values()
                   if isinstance(klass, type)
                   and klass.__module__.split(".")[0] == PACKAGE)
    return False


def resolves_in(module: str, attributes: list[str]) -> bool:
    """Whether `module` imports and `attributes` are found in it one after the other."""
    try:
        value = importlib.import_module(module)
    except ImportError:
        return False
    for i, name in enumerate(attributes):
        sub = f"{module}.{'.'.join(attributes[:i + 1])}"
        if sub in package_modules():
            value = importlib.import_module(sub)
            continue
        if not has_attribute(value, name):
            return False
        value = getattr(value, name, None)
    return True


@functools.cache
def config_classes() -> tuple[type, ...]:
    """The package's config classes (`EncoderConfig`, `QANetConfig`, ...): a `config.x` of a
    docstring is often one of their fields."""
    return tuple(getattr(importlib.import_module(module), name)
                 for name, modules in top_level_names().items() if name.endswith("Config")
                 for module in modules if isinstance(getattr(importlib.import_module(module),
                                                             name, None), type))


def is_config_key(name: str) -> bool:
    """A key of the training config (`data.doc_stride`, `config.model.kind`), or `config.x`
    where x is a field of one of the package's config classes."""
    key = name.removeprefix("config.")
    if key in config_keys():
        return True
    if name.startswith("config.") and any(has_attribute(klass, key.split(".")[0])
                                          for klass in config_classes()):
        return True
    # model.reader.NAME: the reader kind's own config fields, unknown to the schema (None).
    parts = key.split(".")
    return any(".".join(parts[:n]) in config_keys() and parts[n - 1] == "reader"
               for n in range(1, len(parts)))


def looks_ours(parts: list[str]) -> bool:
    """Whether a dotted name looks like one of this package's: it starts at one of its modules
    or names, or ends at a name one of its modules defines (`cache_check.check_states`)."""
    short = {part for module in package_modules() for part in module.split(".")}
    return parts[0] in short or parts[0] in top_level_names() or parts[0] == "config" \
        or parts[-1] in top_level_names()


def dotted_exists(name: str) -> bool:
    """Whether a dotted name resolves from the package, one of its modules (by any suffix of its
    path) or one of its top-level names; or is a training config key."""
    parts = name.split(".")
    if is_config_key(name):
        return True
    if parts[0] == PACKAGE:
        return resolves_in(PACKAGE, parts[1:])
    for module in package_modules():
        path = module.split(".")
        for n in range(len(parts), 0, -1):
            if path[-n:] == parts[:n] and resolves_in(module, parts[n:]):
                return True
    return any(resolves_in(module, parts) for module in top_level_names().get(parts[0], ()))


@functools.cache
def repo_files() -> tuple[str, ...]:
    return tuple(str(path.relative_to(REPO)) for root in PATH_ROOTS
                 for path in (REPO / root).rglob("*") if "__pycache__" not in path.parts)


def package_path(path: str) -> str | None:
    """The repository path of a repository path (`dil_jax/serve/app.py`, `tests/model/`) or of
    a package path given from inside the package (`serve/app.py`, `cache/build.py`); None if
    there is no such file or folder."""
    path = path.rstrip("/")
    if path.split("/")[0] in PATH_ROOTS:
        return path if (REPO / path).exists() else None
    return next((file for file in repo_files() if file.startswith(f"{PACKAGE}/")
                 and (file == f"{PACKAGE}/{path}" or file.endswith(f"/{path}"))), None)


def path_exists(path: str) -> bool:
    return package_path(path) is not None


def named_in_path(path: str, name: str) -> bool:
    """`path.py:name`: the module at that path defines `name` (or it is a config variant)."""
    if path.startswith("configs/"):
        return (REPO / path).exists()  # configs/x.py:variant: the variant is the config's
    if not (REPO / path).is_file():
        return False
    module = ".".join(Path(path).with_suffix("").parts)
    if module.split(".")[0] != PACKAGE:
        return name in code_identifiers()
    return resolves_in(module, name.split("."))


# --------------------------------------------------------------------------- what is named


def problem(mention: Mention) -> str | None:
    """Why `mention` names nothing, or None (it exists, or it is no name of this package)."""
    text = mention.text.strip()
    if PLACEHOLDER.search(text):
        return None
    text = re.sub(r"\(\)$", "", text.strip(".,;"))
    if mention.kind == "code":
        return None if text in code_identifiers() or text in EXTERNAL else \
            "no such name in the code (another project's? add it to EXTERNAL)"
    if mention.kind == "file":
        names = {Path(file).name for file in repo_files()} | {"setup.py"}
        return None if text in names or text in EXTERNAL else \
            "no such file in the repository (another project's? add it to EXTERNAL)"
    if not text or " " in text or text.startswith("-"):
        return None
    path, colon, name = text.partition(":")
    if colon and re.fullmatch(rf"{IDENTIFIER}(\.{IDENTIFIER})*", name):
        if "/" in path and path.endswith(".py"):
            return None if named_in_path(path, name) else "no such file or name in it"
        if DOTTED.fullmatch(path) and path.split(".")[0] == PACKAGE:
            return None if resolves_in(path, name.split(".")) else "no such module or name in it"
        return None
    if colon:
        return None
    if "/" in text:
        first = text.split("/")[0]
        folder, _, last = text.rpartition("/")
        module, dot, name = last.partition(".")
        if dot and name.split(".")[0] not in FILE_SUFFIXES \
                and re.fullmatch(rf"{IDENTIFIER}(\.{IDENTIFIER})*", name):
            # serve/app.create_app: a module given by its path, then a name in it
            file = package_path(f"{folder}/{module}.py")
            return None if file and named_in_path(file, name) else "no such file or name in it"
        if first in PATH_ROOTS or (text.endswith(".py") and re.fullmatch(r"[\w/.-]+", text)):
            return None if path_exists(text) else "no such file"
        return None
    if not DOTTED.fullmatch(text):
        return None
    parts = text.split(".")
    if parts[-1] in FILE_SUFFIXES or not looks_ours(parts):
        return None
    if parts[0] in TENSOR_PREFIXES and parts[1] not in top_level_names():
        return None  # a Hugging Face tensor name
    return None if dotted_exists(text) else "no such module, name or config key"


def markdown_mentions(path: Path) -> Iterator[Mention]:
    """The backticked spans of a page's prose and tables (fenced code blocks are commands)."""
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            continue
        for match in BACKTICKED.finditer(line):
            yield Mention(f"{path.relative_to(REPO)}:{number}", match.group(1), "name")


def docstrings_and_comments(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of each docstring and comment of a Python file."""
    import io
    import tokenize

    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant) \
                and isinstance(node.body[0].value.value, str):
            yield node.body[0].lineno, node.body[0].value.value
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def row_mentions(row: str, where: str) -> Iterator[Mention]:
    """What one line of a docstring or comment names: its backticked spans (a snake_case
    identifier among them must be in the code), any private identifier (`_name`, backticked or
    not: it must be in the code) and any file name (`build.py`: a file of the repository)."""
    for span in BACKTICKED.findall(row):
        span = span.strip()
        if re.fullmatch(r"_?[a-z][a-z0-9]*(_[a-z0-9]+)+(\(\))?", span):
            yield Mention(where, span.removesuffix("()"), "code")
        else:
            yield Mention(where, span, "name")
    prose = BACKTICKED.sub(" ", row)
    for private in re.findall(r"(?<![\w.`/*-])(_[a-z][A-Za-z0-9_]*)", prose):
        yield Mention(where, private, "code")
    for file in re.findall(r"(?<![\w./`-])(\w+\.py)\b", prose):
        yield Mention(where, file, "file")


def code_mentions(path: Path, where: str) -> Iterator[Mention]:
    for line, text in docstrings_and_comments(path):
        for offset, row in enumerate(text.splitlines()):
            yield from row_mentions(row, f"{where}:{line + offset}")


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")),
            *sorted((REPO / "benchmarks").rglob("*.md"))]


def all_problems() -> list[str]:
    problems = []
    for page in pages():
        problems += [f"{m.where}: `{m.text}`: {why}" for m in markdown_mentions(page)
                     if (why := problem(m))]
    for path in python_files(PACKAGE):
        where = str(path.relative_to(REPO))
        problems += [f"{m.where}: `{m.text}`: {why}" for m in code_mentions(path, where)
                     if (why := problem(m))]
    return problems


# --------------------------------------------------------------------------- sections named

SECTION_REFERENCE = re.compile(r'((?:docs/[\w/.-]+\.md)|benchmarks/README\.md|README(?:\.md)?)`?'
                               r'[,:]?\s*\(?\s*"([^"]+)"')


def words(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.replace("`", "").lower()).strip()


@functools.cache
def sections(page: Path) -> tuple[str, ...]:
    """The headings and bold leads (`**Checked on open**`) of a page, as words."""
    text = page.read_text(encoding="utf-8")
    return tuple(words(title) for title in re.findall(r"^#+\s+(.*)$", text, re.MULTILINE)
                 + re.findall(r"\*\*([^*]+)\*\*", text))


def texts() -> Iterator[tuple[str, str]]:
    """(file, text) of every paragraph of the pages, every string of the code (docstrings and
    messages) and every run of comment lines, whitespace joined."""
    import io
    import tokenize

    for page in pages():
        for paragraph in page.read_text(encoding="utf-8").split("\n\n"):
            yield str(page.relative_to(REPO)), " ".join(paragraph.split())
    for root in (*CODE_ROOTS, "tests"):
        for path in python_files(root):
            if path == Path(__file__):
                continue  # its probes name what does not exist on purpose
            where, source = str(path.relative_to(REPO)), path.read_text(encoding="utf-8")
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    yield where, " ".join(node.value.split())
            runs, last = [], -2
            for token in tokenize.generate_tokens(io.StringIO(source).readline):
                if token.type == tokenize.COMMENT:
                    text = token.string.lstrip("#").strip()
                    if token.start[0] == last + 1 and runs:
                        runs[-1] += " " + text
                    else:
                        runs.append(text)
                    last = token.start[0]
            yield from ((where, run) for run in runs)


def section_problems(found: Iterator[tuple[str, str]]) -> list[str]:
    problems = []
    for where, text in found:
        for match in SECTION_REFERENCE.finditer(text):
            page, title = match.groups()
            path = REPO / ("README.md" if page.startswith("README") else page)
            if not path.is_file():
                problems.append(f'{where}: {page}, "{title}": no such page')
            elif not any(words(title) in section for section in sections(path)):
                problems.append(f'{where}: {page}, "{title}": no such section')
    return problems


# --------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("text", [
    "dil_jax.open_domain.cache.check", "dil_jax.open_domain.cache.check.check_states",
    "cache.build", "reading.upper.read_upper", "PairGrid.read_pairs", "dil_jax.load_reader",
    "EncoderConfig.passage_position_offset", "data.doc_stride", "config.model.kind",
    "dil_jax/serve/app.py", "serve/app.py", "tests/model/", "tools/setup.sh",
    "dil_jax/serve/loading.py:load_served_readers", "dil_jax.train.squad_data:featurize",
    "configs/minilm_squad.py:k4_warm", "serve/app.create_app", "cache/store.PassageCache",
    # not this package's names: left alone
    "jax.jit", "np.testing.assert_allclose", "index.json", "model.safetensors", "runs/x",
    "configs/NAME.py", "--config.model.kind=qanet", "1e-4", "e.g.", "bert.embeddings.x",
    "bert.embeddings...", "plan.trims_padding", "grid.batch_size", "config.num_lower_layers",
    "config.layer_dropout", "OpenDomainIndex.open_cache",
])
def test_a_name_that_exists_or_is_none_of_ours_passes(text):
    assert problem(Mention("probe", text, "name")) is None


@pytest.mark.parametrize("text", [
    "dil_jax.open_domain.cache_check", "cache_check.check_states", "cache.build.no_such_name",
    "PairGrid.no_such_method", "dil_jax/serve/no_such.py", "serve/no_such.py",
    "tools/no_such.py", "dil_jax/serve/loading.py:no_such_function",
    "dil_jax.train.squad_data:no_such", "data.no_such_key", "reading.upper.no_such",
    "serve/app._route", "serve/no_such.create_app", "index.open_cache",
])
def test_a_stale_name_is_caught(text):
    assert problem(Mention("probe", text, "name")) is not None


STALE_MODULE = '''"""Builds in shards. Separate from cache_build.py, it imports from
`cache_build` and `dil_jax.open_domain.cache.build` (`build_passage_cache`); the routes are
`serve/app._route`\'s; `cache_digests` says what a check catches."""

x = 1  # one per k: _check_checkpoint_count ran first
'''


def test_stale_names_in_a_docstring_or_comment_are_caught(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(STALE_MODULE)
    found = [(m.where, m.text) for m in code_mentions(probe, "probe.py") if problem(m)]
    assert found == [("probe.py:1", "cache_build.py"), ("probe.py:2", "cache_build"),
                     ("probe.py:3", "serve/app._route"), ("probe.py:3", "cache_digests"),
                     ("probe.py:5", "_check_checkpoint_count")]


def test_the_docs_and_docstrings_name_only_what_exists():
    problems = all_problems()
    assert not problems, "\n".join(problems)


def test_a_section_named_that_is_gone_is_caught():
    found = [("a.py", 'see docs/checks.md, "How the costs were measured" and (docs/checks.md,'
                      ' "how the costs"), then docs/checks.md "No such part", README, "Gone", '
                      'docs/no_such.md, "X", `docs/checks.md`, "Gone too"')]
    assert section_problems(iter(found)) == [
        'a.py: docs/checks.md, "No such part": no such section',
        'a.py: README, "Gone": no such section', 'a.py: docs/no_such.md, "X": no such page',
        'a.py: docs/checks.md, "Gone too": no such section']


def test_every_section_named_exists():
    problems = section_problems(texts())
    assert not problems, "\n".join(problems)


def unlisted_results(folder: Path) -> list[str]:
    """The pages and run folders of docs/results/ that its README.md does not name (a .json or
    .png beside a page of the same stem goes with it)."""
    index = (folder / "README.md").read_text(encoding="utf-8")
    missing = []
    for entry in sorted(folder.iterdir()):
        if entry.name == "README.md":
            continue
        if entry.is_dir():
            named = f"{entry.name}/" in index
        else:
            named = entry.name in index or f"{entry.stem}.md" in index
        if not named:
            missing.append(entry.name)
    return missing


def test_the_results_index_names_every_page_and_run_folder(tmp_path):
    (tmp_path / "README.md").write_text("| a_log.md | x |\n| run/ | y |\n")
    for name in ("a_log.md", "a_log.json", "b.md", "b.png"):
        (tmp_path / name).write_text("")
    (tmp_path / "run").mkdir()
    (tmp_path / "other_run").mkdir()
    assert unlisted_results(tmp_path) == ["b.md", "b.png", "other_run"]
    missing = unlisted_results(REPO / "docs" / "results")
    assert not missing, f"docs/results/README.md should say what these are: {missing}"


def broken_links(page: Path) -> list[str]:
    """The relative Markdown links of a page (`[x](../training.md)`, images too) that lead to no
    file."""
    text = page.read_text(encoding="utf-8")
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", text)
            if "://" not in target and not target.startswith(("#", "mailto:"))
            and not (page.parent / target.split("#")[0]).exists()]


def test_links_lead_to_files_and_the_readme_maps_every_page(tmp_path):
    probe = tmp_path / "probe.md"
    probe.write_text("[a](probe.md) [b](gone.md#x) ![c](gone.png) [d](https://x.org) [e](#top)")
    assert broken_links(probe) == ["gone.md#x", "gone.png"]
    problems = [f"{page.relative_to(REPO)}: {target}" for page in pages()
                for target in broken_links(page)]
    assert not problems, "\n".join(problems)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    unmapped = [page.name for page in sorted((REPO / "docs").glob("*.md"))
                if f"(docs/{page.name})" not in readme]
    assert not unmapped, f"README.md's map of the docs lacks {unmapped}"
