"""SQuAD v1.1 / v2.0: official JSON files and prepared tensorflow-datasets into plain examples.

    dataset = load_squad("../shared/data/squad/dev-v1.1.35-articles.json")
    train, valid = split_by_article(dataset, 0.2, seed=0)   # by article, never by question

Every malformed input raises `SquadFormatError`, whose message names the file, the question id (or
the article/paragraph position when there is no id yet) and the field.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dil_jax.errors import DilJaxError, InputFileError, UsageError
from dil_jax.tokenization import lone_surrogate, surrogate_problem

log = logging.getLogger(__name__)

# Spellings of the `version` field, by canonical version.
VERSIONS = {"1.1": "1.1", "v1.1": "1.1", "2.0": "2.0", "v2.0": "2.0"}
TFDS_NAMES = {"squad/v1.1": "1.1", "squad/v2.0": "2.0"}


class SquadFormatError(DilJaxError, ValueError):
    """A SQuAD file or record is malformed.

    Attributes:
      source: the file (or tfds name/split) it came from.
      qid: the question id, or None when the problem sits above the question level.
      field: the offending field (e.g. "answers[1].answer_start").
    """

    def __init__(self, source: str, field: str, problem: str, qid: str | None = None,
                 where: str | None = None):
        self.source, self.field, self.qid = source, field, qid
        place = f"question {qid!r}" if qid is not None else (where or "top level")
        super().__init__(f"{source}: {place}: field {field!r}: {problem}")


@dataclasses.dataclass(frozen=True)
class SquadExample:
    """One question on one paragraph.

    answer_texts / answer_starts: the gold answers (character start into `context`); empty for an
    unanswerable SQuAD 2.0 question. Duplicated answers are kept, as the official metric uses them.
    """

    qid: str
    title: str
    context: str
    question: str
    answer_texts: tuple[str, ...] = ()
    answer_starts: tuple[int, ...] = ()
    is_impossible: bool = False


def gold_answers(examples: Iterable[SquadExample]) -> dict[str, tuple[str, ...]]:
    """{question id: gold answer texts} of `examples`, in their order (the SQuAD metric's
    input; an unanswerable question has none)."""
    return {example.qid: example.answer_texts for example in examples}


@dataclasses.dataclass
class SquadDataset:
    """Examples in file order, with the canonical version ("1.1" or "2.0") and their source."""

    version: str
    examples: list[SquadExample]
    source: str = ""

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def gold_answers(self) -> dict[str, tuple[str, ...]]:
        """{question id: gold answer texts} in file order (what the metric scores against)."""
        return gold_answers(self.examples)

    @property
    def titles(self) -> list[str]:
        """Distinct article titles, in order of first appearance."""
        return list(dict.fromkeys(example.title for example in self.examples))


# ----------------------------------------------------------------------------- JSON


def canonical_version(value: Any, source: str) -> str:
    """"1.1"/"v1.1" -> "1.1", "2.0"/"v2.0" -> "2.0"; anything else raises SquadFormatError."""
    if not isinstance(value, str) or value not in VERSIONS:
        raise SquadFormatError(source, "version", f"unknown SQuAD version {value!r}; expected one "
                               f"of {sorted(VERSIONS)}")
    return VERSIONS[value]


def load_squad(path: str | os.PathLike, *, expected_version: str | None = None,
               check_spans: bool = True) -> SquadDataset:
    """Reads an official SQuAD JSON file (v1.1 or v2.0).

    expected_version: "1.1" or "2.0" to refuse a file of the other version.
    check_spans: check that each answer text sits at its answer_start (training and featurization
      need it; scoring does not, so `evaluate` turns it off as the official script does).
    """
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputFileError(f"{source}: no such SQuAD file; check the path"
                             ) from None
    except UnicodeDecodeError as error:
        raise SquadFormatError(source, "<file>", f"not UTF-8 text ({error})") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise SquadFormatError(source, "<file>", f"not valid JSON ({error})") from None
    return parse_squad(raw, source, expected_version=expected_version, check_spans=check_spans)


def parse_squad(raw: Any, source: str = "<memory>", *, expected_version: str | None = None,
                check_spans: bool = True) -> SquadDataset:
    """The decoded JSON object of a SQuAD file -> SquadDataset (see load_squad)."""
    if not isinstance(raw, dict):
        raise SquadFormatError(source, "<file>", f"expected a JSON object with 'version' and "
                               f"'data', got {type(raw).__name__}")
    if "version" not in raw:
        raise SquadFormatError(source, "version", "missing")
    version = canonical_version(raw["version"], source)
    if expected_version is not None and version != VERSIONS.get(expected_version):
        raise SquadFormatError(source, "version", f"wrong version: file is SQuAD {version}, "
                               f"expected {expected_version}")
    articles = _field(raw, "data", list, source, where="top level")
    examples: list[SquadExample] = []
    seen: set[str] = set()
    for a_index, article in enumerate(articles):
        where = f"data[{a_index}]"
        if not isinstance(article, dict):
            raise SquadFormatError(source, where, "expected an object (an article)", where=where)
        title = _field(article, "title", str, source, where=where) if "title" in article else ""
        for p_index, paragraph in enumerate(_field(article, "paragraphs", list, source, where)):
            p_where = f"{where}.paragraphs[{p_index}] (title {title!r})"
            if not isinstance(paragraph, dict):
                raise SquadFormatError(source, "paragraphs", "expected an object", where=p_where)
            context = _field(paragraph, "context", str, source, p_where)
            for q_index, qa in enumerate(_field(paragraph, "qas", list, source, p_where)):
                if not isinstance(qa, dict):
                    raise SquadFormatError(source, "qas", f"qas[{q_index}] is not an object",
                                           where=p_where)
                qid = _field(qa, "id", str, source, f"{p_where}.qas[{q_index}]")
                if qid in seen:
                    raise SquadFormatError(source, "id", "duplicate question id", qid=qid)
                seen.add(qid)
                examples.append(_parse_question(qa, qid, title, context, version, source,
                                                check_spans))
    return SquadDataset(version, examples, source)


def _field(record: dict, name: str, kind: type, source: str, where: str,
           qid: str | None = None, prefix: str = "") -> Any:
    if name not in record:
        raise SquadFormatError(source, prefix + name, "missing", qid=qid, where=where)
    value = record[name]
    # bool is an int subclass: refuse True as an answer_start.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SquadFormatError(source, prefix + name, f"expected {kind.__name__}, got "
                               f"{type(value).__name__} {value!r:.60}", qid=qid, where=where)
    if kind is str and (surrogate := lone_surrogate(value)) is not None:
        raise SquadFormatError(source, prefix + name, surrogate_problem(value, surrogate),
                               qid=qid, where=where)
    return value


def _parse_question(qa: dict, qid: str, title: str, context: str, version: str, source: str,
                    check_spans: bool) -> SquadExample:
    question = _field(qa, "question", str, source, "", qid)
    if not question.strip():
        raise SquadFormatError(source, "question", "empty question", qid=qid)
    answers = _field(qa, "answers", list, source, "", qid)
    texts, starts = [], []
    for index, answer in enumerate(answers):
        name = f"answers[{index}]"
        if not isinstance(answer, dict):
            raise SquadFormatError(source, name, "expected an object", qid=qid)
        text = _field(answer, "text", str, source, "", qid, f"{name}.")
        start = _field(answer, "answer_start", int, source, "", qid, f"{name}.")
        if check_spans:
            _check_span(context, text, start, source, qid, name)
        texts.append(text)
        starts.append(start)
    if version == "1.1":
        if qa.get("is_impossible", False):
            raise SquadFormatError(source, "is_impossible", "SQuAD 1.1 has no unanswerable "
                                   "questions (is the version field right?)", qid=qid)
        if not texts:
            raise SquadFormatError(source, "answers", "empty: every SQuAD 1.1 question has an "
                                   "answer", qid=qid)
        impossible = False
    else:
        # Files rebuilt from the explorer omit is_impossible on answerable questions.
        impossible = qa.get("is_impossible", not texts)
        if not isinstance(impossible, bool):
            raise SquadFormatError(source, "is_impossible", f"expected bool, got {impossible!r}",
                                   qid=qid)
        if impossible and texts:
            raise SquadFormatError(source, "answers", "an unanswerable question (is_impossible "
                                   "true) must have no answers", qid=qid)
        if not impossible and not texts:
            raise SquadFormatError(source, "answers", "empty, but is_impossible is false",
                                   qid=qid)
    return SquadExample(qid, title, context, question, tuple(texts), tuple(starts), impossible)


def _check_span(context: str, text: str, start: int, source: str, qid: str, name: str) -> None:
    if not text:
        raise SquadFormatError(source, f"{name}.text", "empty answer text", qid=qid)
    if start < 0 or start + len(text) > len(context):
        raise SquadFormatError(source, f"{name}.answer_start",
                               f"answer_start {start} + len(text) {len(text)} is outside the "
                               f"context (length {len(context)})", qid=qid)
    found = context[start:start + len(text)]
    if found != text:
        raise SquadFormatError(source, f"{name}.answer_start",
                               f"answer text {text!r:.60} is not at answer_start {start} (the "
                               f"context there reads {found!r:.60})", qid=qid)


# ----------------------------------------------------------------------------- splits


def select_articles(examples: Sequence[SquadExample], spec: str, flag: str = "--articles"
                    ) -> list[SquadExample]:
    """The examples of a slice "a:b" of the articles, in the file's article order; errors name
    the slice as `flag`."""
    start, colon, stop = spec.partition(":")
    titles = list(dict.fromkeys(example.title for example in examples))
    try:
        bounds = [int(v) if v.strip() else None for v in (start, stop)]
    except ValueError:
        bounds = None
    if bounds is None or not colon:
        raise UsageError(f"article slice {spec!r} ({flag}) is not START:STOP with integer "
                         f"bounds, e.g. 28:35 or :")
    chosen = set(titles[slice(*bounds)])
    if not chosen:
        raise UsageError(f"article slice {spec!r} ({flag}) selects none of the "
                         f"{len(titles)} articles; give a slice within 0:{len(titles)}")
    return [example for example in examples if example.title in chosen]


def split_by_article(data: SquadDataset | Sequence[SquadExample], validation: float | int = 0.1,
                     seed: int = 0) -> tuple[list[SquadExample], list[SquadExample]]:
    """(train, validation) examples, split by article title, never by question.

    validation: a fraction of the articles (0 < float < 1) or a number of articles (int >= 1).
    The articles are shuffled with `seed`; each side keeps the file order of its examples.
    """
    examples = list(data.examples if isinstance(data, SquadDataset) else data)
    titles = list(dict.fromkeys(example.title for example in examples))
    if len(titles) < 2:
        raise UsageError(f"split_by_article needs at least 2 articles, got {len(titles)}")
    if isinstance(validation, bool) or not isinstance(validation, (int, float)):
        raise UsageError(f"validation must be a fraction or a count, got {validation!r}")
    if isinstance(validation, float):
        if not 0.0 < validation < 1.0:
            raise UsageError(f"validation fraction must be in (0, 1), got {validation}")
        count = min(max(round(validation * len(titles)), 1), len(titles) - 1)
    elif 1 <= validation < len(titles):
        count = validation
    else:
        raise UsageError(f"validation article count must be in 1..{len(titles) - 1}, "
                         f"got {validation}")
    order = np.random.default_rng(seed).permutation(len(titles))
    held_out = {titles[i] for i in order[:count]}
    train = [example for example in examples if example.title not in held_out]
    valid = [example for example in examples if example.title in held_out]
    return train, valid


# ----------------------------------------------------------------------------- tfds


def load_tfds_squad(name: str = "squad/v1.1", split: str = "validation",
                    data_dir: str | os.PathLike | None = None, *,
                    check_spans: bool = True) -> SquadDataset:
    """A prepared tensorflow-datasets SQuAD (`squad/v1.1` or `squad/v2.0`) as a SquadDataset.

    Nothing is downloaded: the dataset must already be prepared under `data_dir`. Data prepared
    with `file_format="array_record"` is read without TensorFlow (tfds' data source); the default
    tfrecord format needs TensorFlow installed. Needs the `tfds` extra:
    `pip install 'dil_jax[tfds]'` (tensorflow-datasets 4.9.10 also imports `importlib_resources`
    without declaring it). tests/data/test_squad_data.py prepares tfds' own SQuAD builder over local
    files this way and runs whenever tensorflow-datasets is installed.
    """
    if name not in TFDS_NAMES:
        raise UsageError(f"unknown tfds SQuAD name {name!r}; expected one of {sorted(TFDS_NAMES)}")
    try:
        import tensorflow_datasets as tfds
    except ImportError as error:
        raise ImportError(
            "load_tfds_squad needs tensorflow-datasets: `pip install 'dil_jax[tfds]'`, or load the "
            "official JSON with load_squad") from error
    source = f"tfds:{name}[{split}]" + (f" in {data_dir}" if data_dir else "")
    builder = tfds.builder(name, data_dir=None if data_dir is None else str(data_dir))
    if not builder.is_prepared():
        raise InputFileError(
            f"{source}: not prepared under {builder.data_dir}; nothing is downloaded here, prepare "
            "it first (e.g. builder.download_and_prepare(file_format='array_record'))")
    if split not in builder.info.splits:
        raise InputFileError(f"{source}: no split {split!r}; available: "
                             f"{list(builder.info.splits)}")
    file_format = getattr(builder.info, "file_format", None)  # a FileFormat enum
    file_format = str(getattr(file_format, "value", file_format) or "").lower()
    if "array_record" in file_format:
        records: Iterable[dict] = builder.as_data_source(split=split)
    else:
        try:
            records = tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False))
        except ImportError as error:
            raise ImportError(
                f"{source}: prepared as {file_format or 'tfrecord'}, which needs TensorFlow to "
                "read (`pip install tensorflow`); or prepare it with "
                "file_format='array_record', which tfds reads without TensorFlow") from error
    version = TFDS_NAMES[name]
    examples = [_from_tfds(record, version, source, check_spans) for record in records]
    return SquadDataset(version, examples, source)


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _from_tfds(record: dict, version: str, source: str, check_spans: bool) -> SquadExample:
    """A tfds record (bytes strings, numpy ints) -> SquadExample, checked like a JSON one."""
    answers = record["answers"]
    qa = {"id": _text(record["id"]), "question": _text(record["question"]),
          "answers": [{"text": _text(text), "answer_start": int(start)}
                      for text, start in zip(answers["text"], answers["answer_start"])]}
    if "is_impossible" in record:
        qa["is_impossible"] = bool(record["is_impossible"])
    return _parse_question(qa, qa["id"], _text(record["title"]), _text(record["context"]),
                           version, source, check_spans)
