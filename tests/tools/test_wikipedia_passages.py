"""benchmarks/wikipedia_passages.py's sample and file counts, against hand computation."""

from __future__ import annotations

import json

from tests.helpers import load_script

passages = load_script("benchmarks/wikipedia_passages.py")


def test_full_blocks_keep_whole_blocks_only():
    text = " ".join(f"w{i}" for i in range(7))  # w0 w1 ... w6: 2 characters + a space each
    assert passages.full_blocks(text, words=3) == [(0, 8), (9, 17)]  # w6 is a remainder
    assert passages.full_blocks("one two", words=3) == []


def test_index_files_reads_the_recorded_bytes(tmp_path):
    (tmp_path / "index.json").write_text(json.dumps(dict(
        format="dil_jax.odqa_index/1", num_passages=2, num_windows=3, retriever="pyserini",
        max_passage_len=192, files={"passages.jsonl": {"bytes": 10, "sha256": "x"}})))
    files = passages.index_files(tmp_path)
    assert files["file_bytes"] == {"passages.jsonl": 10}
    assert (files["num_passages"], files["num_windows"]) == (2, 3)
