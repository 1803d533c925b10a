"""The synthetic scale corpus (real sentences resampled into 100-word passages), its JSONL
writer, and the retrieval benchmark on a tiny size."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dil_jax.open_domain.index.corpus import Document, read_jsonl
from dil_jax.open_domain.index.scale_corpus import resampled_passages, sentence_pool

from tests.helpers import REPO


def test_pool_and_passages_by_hand():
    documents = [Document("d", "t", "One two three four. Five six. Seven eight nine ten eleven.")]
    pool = sentence_pool(documents)
    assert pool == ["One two three four.", "Seven eight nine ten eleven."]  # "Five six." < 4
    passages = list(resampled_passages(pool, 50, seed=3, min_words=7))
    assert len(passages) == 50
    assert passages == list(resampled_passages(pool, 50, seed=3, min_words=7))
    for passage in passages:
        words = len(passage.split())
        # Sentences are added until >= 7 words: two or three of 4 or 5 words each.
        assert 8 <= words <= 10 + 4
        rest = passage
        while rest:  # the passage is a sequence of pool sentences joined by spaces
            sentence = next(s for s in pool if rest.startswith(s))
            rest = rest[len(sentence):].lstrip()
    assert list(resampled_passages(pool, 50, seed=4, min_words=7)) != passages
    with pytest.raises(ValueError, match="empty"):
        list(resampled_passages([], 1))


def test_make_scale_corpus_writes_jsonl_once(tmp_path):
    source = tmp_path / "src.jsonl"
    source.write_text(json.dumps({"id": "a", "title": "", "text": "Alpha beta gamma delta. "
                                  "Epsilon zeta eta theta iota."}) + "\n")
    out = tmp_path / "scale.jsonl"
    command = [sys.executable, str(REPO / "tools" / "make_scale_corpus.py"), "--passages", "30",
               "--out", str(out), "--source", f"jsonl:{source}"]
    subprocess.run(command, check=True, capture_output=True)
    documents = read_jsonl(out)
    assert len(documents) == 30 and all(len(d.text.split()) >= 100 for d in documents)
    again = subprocess.run(command, capture_output=True, text=True)
    assert again.returncode != 0 and "exists" in again.stderr


def test_retrieval_benchmark_tiny(tmp_path, shared_data):
    out = tmp_path / "retrieval"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "retrieval.py"), "--sizes", "300",
                    "--queries", "25", "--no-recall",
                    "--data", str(shared_data / "squad" / "dev-v1.1.35-articles.json"),
                    "--out", str(out)], check=True, capture_output=True)
    record = json.loads(out.with_suffix(".json").read_text())
    assert [(row["size"], row["engine"]) for row in record["rows"]] == \
        [(300, "rank-bm25"), (300, "bm25s"), (300, "pyserini")]
    for row in record["rows"]:
        assert row["queries"] == 25 and row["disk_mib"] > 0 and row["passage_words"] >= 100
    assert out.with_suffix(".md").read_text().startswith("| passages | engine |")
