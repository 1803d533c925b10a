"""The prescreener recipe (`dil-jax prescreen`, configs/prescreen.py) at tiny size: a training
file and an evaluation file written here, the split options honoured, bad ones refused naming
the flag before any model is loaded, and sentence embeddings cached so a stopped run resumes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import CONFIGS, run_cli

FACTS = [("Paris", "France", "the Seine"), ("Rome", "Italy", "the Tiber"),
         ("Vienna", "Austria", "the Danube"), ("Lisbon", "Portugal", "the Tagus"),
         ("Prague", "Czechia", "the Vltava")]


def _article(city: str, country: str, river: str) -> dict:
    """One article, one paragraph of three sentences, two questions answered in sentences 1
    and 2."""
    context = (f"{city} is an old city. It is the capital of {country}. "
               f"The river {river} flows through it.")
    qas = [dict(id=f"{city}-country", question=f"Which country has {city} as its capital?",
                answers=[dict(text=country, answer_start=context.index(country))]),
           dict(id=f"{city}-river", question=f"Which river flows through {city}?",
                answers=[dict(text=river, answer_start=context.index(river))])]
    return dict(title=city, paragraphs=[dict(context=context, qas=qas)])


def _squad_file(path: Path, facts) -> Path:
    path.write_text(json.dumps(dict(version="1.1", data=[_article(*f) for f in facts])))
    return path


@pytest.fixture
def files(tmp_path) -> tuple[Path, Path]:
    """(train file: 3 articles, 6 questions; eval file: 2 articles, dev 0:1 and validation 1:2)."""
    return (_squad_file(tmp_path / "train.json", FACTS[:3]),
            _squad_file(tmp_path / "eval.json", FACTS[3:]))


def _argv(tmp_path: Path, train: Path, evaluation: Path, *extra: str) -> list[str]:
    return ["prescreen", "--config", str(CONFIGS / "prescreen.py"),
            f"--config.data.file={train}", f"--config.data.eval_file={evaluation}",
            "--config.data.dev_articles=0:1", "--config.data.val_articles=1:2",
            f"--config.workdir={tmp_path / 'prescreener'}",
            f"--config.encoder.cache_dir={tmp_path / 'cache'}", *extra]


TINY = ("--config.model.width=16", "--config.model.num_layers=1", "--config.model.num_heads=2",
        "--config.model.mlp_dim=32", "--config.train.batch_size=4", "--config.train.steps=4",
        "--config.train.eval_every=2")


def test_the_recipe_trains_on_one_file_and_stops_early_on_another(tmp_path, files, capsys):
    """Every article of the training file, dev and validation from the evaluation file: a
    prescreener that loads, whose record counts each split's questions from its own file."""
    from dil_jax.prescreening.prescreener import SentencePrescreener

    status, out, err = run_cli(_argv(tmp_path, *files, *TINY), capsys)
    assert status == 0, err
    workdir = tmp_path / "prescreener"
    record = json.loads((workdir / "prescreener.json").read_text())["trained"]
    assert {name: row["questions"] for name, row in record["report"].items()} == dict(
        train=6, dev=2, validation=2)
    assert [step for step, _ in record["dev_top1"]] == [2, 4]
    table = (workdir / "results.md").read_text()
    assert "| train | train.json : | 6 |" in table and "| dev | eval.json 0:1 | 2 |" in table
    assert "| validation | eval.json 1:2 | 2 |" in out
    loaded = SentencePrescreener.load(workdir)
    assert loaded.config.width == 16 and loaded.config.num_layers == 1
    # Embedded once, cached: the sentences and questions of each split.
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 6
    assert not list((tmp_path / "cache").glob("*.parts"))


@pytest.fixture
def no_model(monkeypatch):
    """Loading the sentence encoder fails the test: the checks must come before it."""
    from dil_jax.prescreening import prescreener

    def refuse(*args, **kwargs):
        raise AssertionError("the sentence encoder was loaded before the flags were checked")

    monkeypatch.setattr(prescreener, "load_sentence_encoder", refuse)


@pytest.mark.parametrize("overrides, named", [
    (["--config.data.dev_articles=5:9"], ["--config.data.dev_articles", "'5:9'", "none of the 2"]),
    (["--config.data.train_articles=first"], ["--config.data.train_articles", "'first'"]),
    (["--config.data.dev_articles="], ["--config.data.dev_articles"]),
    (["--config.data.val_articles=", "--readers", "R"], ["--config.data.val_articles", "''"]),
    (["--config.data.file="], ["--config.data.file"]),
    (["--config.data.eval_file=MISSING"], ["--config.data.eval_file", "MISSING"]),
    # One file for all three splits: its articles 0:1 would be both training and dev ones.
    (["--config.data.eval_file=", "--config.data.train_articles=0:2"],
     ["--config.data.train_articles=0:2", "--config.data.dev_articles=0:1", "overlap"]),
    # The workdir is an earlier prescreener, which training replaces: the cache would go too.
    (["--config.encoder.cache_dir=WORKDIR/cache"], ["--config.encoder.cache_dir", "inside"]),
])
def test_bad_split_options_are_refused_naming_the_flag(tmp_path, files, capsys, no_model,
                                                       overrides, named):
    workdir = tmp_path / "prescreener"
    workdir.mkdir()
    (workdir / "prescreener.json").write_text("{}")
    missing = str(tmp_path / "missing.json")
    overrides = [o.replace("MISSING", missing).replace("WORKDIR", str(workdir))
                 for o in overrides]
    status, _, err = run_cli(_argv(tmp_path, *files, *TINY) + overrides, capsys)
    assert status == 1, err
    for text in named:
        assert text.replace("MISSING", missing) in err, err
    assert [p.name for p in workdir.iterdir()] == ["prescreener.json"]


def test_an_unknown_config_variant_is_refused(capsys, no_model):
    status, _, err = run_cli(["prescreen", "--config", f"{CONFIGS / 'prescreen.py'}:nope"],
                             capsys)
    assert status == 1 and "nope" in err and "full, shared" in err, err


def test_one_file_for_every_split_when_eval_file_is_empty():
    """`data.eval_file=''`: dev and validation come from data.file, named by its flag;
    `data.val_articles=''`: no validation split (runs that choose by the dev accuracy)."""
    from dil_jax.prescreening.splits import config_splits

    data = dict(file="a.json", eval_file="", train_articles="0:2", dev_articles="2:3",
                val_articles="3:4")
    assert {name: (s.file, s.file_flag) for name, s in config_splits(data).items()} == dict(
        train=("a.json", "--config.data.file"), dev=("a.json", "--config.data.file"),
        validation=("a.json", "--config.data.file"))
    assert list(config_splits(dict(data, eval_file="b.json", val_articles=""))) == [
        "train", "dev"]


def test_embedding_cache_resumes_a_stopped_run_and_embeds_each_text_once(tmp_path):
    """Chunks written as they are computed: a run stopped in its second chunk resumes there,
    a later run embeds nothing, a repeated text is embedded once, the result is the uncached
    one's, and other encoder weights do not read it."""
    from dil_jax.prescreening.embedding_cache import EmbeddingCache

    embedded: list[str] = []
    stop = {"dddd"}

    def compute(texts):
        embedded.extend(texts)
        if stop & set(texts):
            stop.clear()
            raise KeyboardInterrupt  # the run is stopped while embedding this chunk
        return np.asarray([[len(t), ord(t[0])] for t in texts], np.float32)

    def cache(fingerprint: str = "f") -> EmbeddingCache:
        return EmbeddingCache(tmp_path, compute, fingerprint, max_len=8, dim=2, chunk_size=2)

    texts = ["aa", "b", "aa", "ccc", "dddd", "e"]  # chunks of distinct texts: aa b, ccc dddd, e
    with pytest.raises(KeyboardInterrupt):
        cache()(texts, "sentences")
    assert embedded == ["aa", "b", "ccc", "dddd"]
    embedded.clear()
    vectors = cache()(texts, "sentences")
    assert embedded == ["ccc", "dddd", "e"]  # the stopped run's first chunk is kept
    np.testing.assert_array_equal(vectors, [[len(t), ord(t[0])] for t in texts])
    embedded.clear()
    np.testing.assert_array_equal(cache()(texts), vectors)
    assert embedded == []  # complete: read from disk
    cache("other weights")(texts)
    assert embedded == ["aa", "b", "ccc", "dddd", "e"]
    assert cache()([]).shape == (0, 2)


def test_the_recipe_with_word_overlaps_saves_its_idf_and_scores_as_trained(tmp_path, files,
                                                                          capsys):
    """--config.model.overlap=true: the IDF of the training passages (3 here, by the same
    tokenizer) is fitted and saved beside the params, the manifest says the prescreener reads
    overlaps, and without idf.npy the folder is refused naming the file."""
    from dil_jax.prescreening.overlap import IDF_FILE, fit_idf
    from dil_jax.prescreening.prescreener import PrescreenerError, SentencePrescreener

    status, _, err = run_cli(_argv(tmp_path, *files, *TINY, "--config.model.overlap=true"),
                               capsys)
    assert status == 0, err
    workdir = tmp_path / "prescreener"
    loaded = SentencePrescreener.load(workdir)
    assert loaded.config.overlap
    contexts = [_article(*fact)["paragraphs"][0]["context"] for fact in FACTS[:3]]
    np.testing.assert_array_equal(loaded.idf, fit_idf(loaded.encoder.tokenizer, contexts))
    record = json.loads((workdir / "prescreener.json").read_text())
    assert record["config"]["overlap"] is True
    (workdir / IDF_FILE).unlink()
    with pytest.raises(PrescreenerError, match=f"{IDF_FILE}: missing"):
        SentencePrescreener.load(workdir)
