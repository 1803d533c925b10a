"""Loading SQuAD: official JSON (malformed-input errors), article splits, tensorflow-datasets."""

from __future__ import annotations

import copy
import json
import sys

import pytest

from dil_jax.data.squad import (
    SquadFormatError,
    load_squad,
    load_tfds_squad,
    parse_squad,
    split_by_article,
)
from dil_jax.errors import InputFileError

from tests.helpers import V11, V20, squad_file

QID = "q-1"


def _good() -> dict:
    return {"version": "1.1", "data": [{"title": "T", "paragraphs": [{
        "context": "The Broncos won the game in 2016.",
        "qas": [{"id": QID, "question": "Who won?",
                 "answers": [{"text": "The Broncos", "answer_start": 0}]}]}]}]}


def _write(tmp_path, content) -> str:
    path = tmp_path / "bad.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def test_shared_files_load():
    v11 = load_squad(squad_file(V11))
    v20 = load_squad(squad_file(V20))
    assert (v11.version, len(v11), len(v11.titles)) == ("1.1", 6013, 35)
    assert (v20.version, len(v20)) == ("2.0", 11873)
    assert sum(e.is_impossible for e in v20.examples) == 5945
    first = v11.examples[0]
    assert first.qid == "5725b33f6a3fe71400b8952d" and first.answer_texts[0] == "October 1973"
    start = first.answer_starts[0]
    assert first.context[start:start + len(first.answer_texts[0])] == "October 1973"


def _mutate(change):
    raw = _good()
    change(raw, raw["data"][0]["paragraphs"][0]["qas"][0])
    return raw


MALFORMED = {
    "missing question": (lambda raw, qa: qa.pop("question"), QID, "question", "missing"),
    "missing answers": (lambda raw, qa: qa.pop("answers"), QID, "answers", "missing"),
    "answer outside": (lambda raw, qa: qa["answers"][0].update(answer_start=30), QID,
                       "answers[0].answer_start", "outside the context"),
    "text not at start": (lambda raw, qa: qa["answers"][0].update(answer_start=4), QID,
                          "answers[0].answer_start", "not at answer_start"),
    "start not int": (lambda raw, qa: qa["answers"][0].update(answer_start="0"), QID,
                      "answers[0].answer_start", "expected int"),
    "v1.1 unanswerable": (lambda raw, qa: qa.update(answers=[]), QID, "answers", "empty"),
    "unknown version": (lambda raw, qa: raw.update(version="3.0"), None, "version",
                        "unknown SQuAD version"),
    "missing version": (lambda raw, qa: raw.pop("version"), None, "version", "missing"),
    "missing answer text": (lambda raw, qa: qa["answers"][0].pop("text"), QID,
                            "answers[0].text", "missing"),
    "missing context": (lambda raw, qa: raw["data"][0]["paragraphs"][0].pop("context"), None,
                        "context", "missing"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_file_errors_name_file_question_and_field(tmp_path, case):
    change, qid, field, problem = MALFORMED[case]
    path = _write(tmp_path, _mutate(change))
    with pytest.raises(SquadFormatError) as caught:
        load_squad(path)
    message = str(caught.value)
    print(message)
    assert path in message and f"field {field!r}" in message and problem in message
    assert caught.value.qid == qid
    if qid is not None:
        assert f"question {qid!r}" in message


def test_non_json_and_wrong_version(tmp_path):
    path = _write(tmp_path, '{"version": "1.1", "data": [')
    with pytest.raises(SquadFormatError, match="not valid JSON") as caught:
        load_squad(path)
    assert path in str(caught.value)
    path = _write(tmp_path, _good())
    with pytest.raises(SquadFormatError, match="wrong version: file is SQuAD 1.1, expected 2.0"):
        load_squad(path, expected_version="2.0")
    with pytest.raises(InputFileError, match="no such SQuAD file"):
        load_squad(tmp_path / "nope.json")


def test_v2_unanswerable_and_inconsistent_flags(tmp_path):
    raw = _good()
    raw["version"] = "v2.0"
    qa = raw["data"][0]["paragraphs"][0]["qas"][0]
    impossible = dict(qa, id="q-2", answers=[], is_impossible=True)
    raw["data"][0]["paragraphs"][0]["qas"].append(impossible)
    dataset = parse_squad(copy.deepcopy(raw), "mem.json")
    assert [e.is_impossible for e in dataset.examples] == [False, True]
    impossible["answers"] = qa["answers"]
    with pytest.raises(SquadFormatError, match="'q-2': field 'answers'"):
        parse_squad(raw, "mem.json")


def test_split_by_article_never_splits_an_article():
    dataset = load_squad(squad_file(V11))
    train, valid = split_by_article(dataset, 0.2, seed=3)
    assert len(train) + len(valid) == len(dataset)
    train_titles, valid_titles = {e.title for e in train}, {e.title for e in valid}
    assert not train_titles & valid_titles and len(valid_titles) == 7
    again = split_by_article(dataset.examples, 0.2, seed=3)
    assert [e.qid for e in again[1]] == [e.qid for e in valid]
    assert len({e.title for e in split_by_article(dataset, 5)[1]}) == 5
    with pytest.raises(ValueError, match="count must be in 1..34"):
        split_by_article(dataset, 35)


# ----------------------------------------------------------------------------- tfds


def test_tfds_missing_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import now fails
    with pytest.raises(ImportError, match=r"pip install 'dil_jax\[tfds\]'"):
        load_tfds_squad("squad/v1.1", "validation", "/nonexistent")


@pytest.mark.parametrize("name,source", [("squad/v1.1", V11), ("squad/v2.0", V20)])
def test_tfds_real_builder_over_local_files(tmp_path, monkeypatch, name, source):
    """tfds' own SQuAD builder prepares two shared articles (its download step pointed at local
    files), in array_record format, which tfds reads without TensorFlow."""
    tfds = pytest.importorskip(
        "tensorflow_datasets",
        reason="optional extra: pip install 'dil_jax[tfds]' (tensorflow-datasets) to run")
    raw = json.loads(squad_file(source).read_text())
    raw["data"] = raw["data"][:2]
    for article in raw["data"]:  # tfds' v2.0 generator reads is_impossible on every question
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                qa.setdefault("is_impossible", not qa["answers"])
    small = tmp_path / "small.json"
    small.write_text(json.dumps(raw))
    monkeypatch.setattr(tfds.download.DownloadManager, "download_and_extract",
                        lambda self, urls: {key: str(small) for key in urls})
    data_dir = tmp_path / "tfds"
    builder = tfds.builder(name, data_dir=str(data_dir), file_format="array_record")
    builder.download_and_prepare()

    loaded = load_tfds_squad(name, "validation", data_dir)
    expected = load_squad(small)
    assert loaded.version == expected.version
    assert sorted(loaded.examples, key=lambda e: e.qid) == sorted(expected.examples,
                                                                   key=lambda e: e.qid)
    with pytest.raises(ValueError, match="no split 'test'"):
        load_tfds_squad(name, "test", data_dir)
    with pytest.raises(InputFileError, match="not prepared"):
        load_tfds_squad(name, "validation", tmp_path / "empty")
