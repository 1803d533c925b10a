"""`dil-jax index` + `ask` + `odqa-eval` end to end on a tiny JSONL corpus (real MiniLM)."""

from __future__ import annotations

import json

import pytest

from dil_jax.cli import main
from dil_jax.samples import SAMPLE_PASSAGES

from tests.helpers import run_cli

# --checkpoint default: the raw embedded MiniLM (what these tests were written for), not the
# bundled fine-tuned readers that index/ask/odqa-eval read without --checkpoint.
COMMON = ["--checkpoint", "default", "--max-question-len", "16", "--batch-size", "2",
          "--chunk-size", "8"]


def _write_corpus(tmp_path) -> str:
    """The sample passages as a JSONL corpus; returns the --corpus source."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"doc{i}", "title": f"T{i}", "text": text}) + "\n"
                              for i, text in enumerate(SAMPLE_PASSAGES)))
    return f"jsonl:{corpus}"


def _write_squad(tmp_path):
    """A one-question SQuAD file over sample passage 1 -> (path, context)."""
    squad = tmp_path / "squad.json"
    context = SAMPLE_PASSAGES[1]
    answer = {"text": "Jane Austen", "answer_start": context.find("Jane Austen")}
    question = {"id": "q1", "question": "Who wrote it?", "answers": [answer]}
    squad.write_text(json.dumps({"version": "1.1", "data": [
        {"title": "T1", "paragraphs": [{"context": context, "qas": [question]}]}]}))
    return squad, context


def test_index_ask_and_eval(tmp_path, capsys):
    corpus = _write_corpus(tmp_path)
    index = tmp_path / "index"
    common = COMMON
    assert main(["index", "--out", str(index), "--corpus", corpus, "--k", "0", "4",
                 "--max-passage-len", "48", "--doc-stride", "24", *common]) == 0
    assert main(["ask", "Who wrote Pride and Prejudice?", "--index", str(index), "--k", "4",
                 "--top-p", "3", *common]) == 0
    out = capsys.readouterr().out
    assert "Q: Who wrote Pride and Prejudice?" in out and "time: retrieval" in out
    assert "BM25 rank" in out
    # A reader split at another k has no cache in this index: a clear error, not a wrong answer.
    status, _, err = run_cli(["ask", "Who?", "--index", str(index), "--k", "3", *common], capsys)
    assert status == 1 and "no passage cache here" in err
    # ... that lists the two caches the index has (both with this reader's weights) and the
    # command that adds the missing one; run as printed, it makes the question answerable.
    caches = sorted(path.name for path in index.glob("cache-k*"))
    assert [name[:9] for name in caches] == ["cache-k0-", "cache-k4-"]
    # Stored int8 without --cache-dtype; a k = 0 cache holds token ids, recorded as float32.
    for name, k, storage in zip(caches, (0, 4), ("float32", "int8")):
        assert f"{name}: k = {k}, {storage}, model {name[-8:]} (this reader's weights)" in err, err
    command = (f"dil-jax index --out {index} --corpus {corpus} --max-passage-len 48 "
               "--doc-stride 24 --checkpoint default --k 3")
    assert f"build it with: {command}" in err, err
    assert main([*command.split()[1:], *common[2:]]) == 0
    assert main(["ask", "Who wrote Pride and Prejudice?", "--index", str(index), "--k", "3",
                 "--top-p", "3", *common]) == 0

    squad, _ = _write_squad(tmp_path)
    assert main(["odqa-eval", "--index", str(index), "--data", str(squad), "--k", "0", "4",
                 "--p", "1", "3", "--out", str(tmp_path / "eval"), *common]) == 0
    results = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]
    assert set(results) == {"full", "DIL k=4"}
    # One question: R is 0 or 100 whatever BM25 ranks; the reader's QA head is untrained here,
    # so only the form of the scores is checked.
    for result in results.values():
        for row in result["by_p"].values():
            assert row["R"] in (0.0, 100.0) and 0 <= row["F1"] <= 100
    assert (tmp_path / "eval" / "results.md").read_text().startswith("| reader |")
    # Every rule of the one read is reported.
    assert all(set(result["by_score"]) == {"logits", "margin"} for result in results.values())
    # The same command again resumes from the progress files: nothing is read twice.
    capsys.readouterr()
    assert main(["odqa-eval", "--index", str(index), "--data", str(squad), "--k", "0", "4",
                 "--p", "1", "3", "--out", str(tmp_path / "eval"), *common]) == 0
    assert capsys.readouterr().err.count("resuming: 1 questions already read") == 2
    again = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]
    assert [r["by_score"] for r in again.values()] == [r["by_score"] for r in results.values()]
    # With bfloat16 matmul operands: named so, over the same (float32-built) caches, and
    # never resumed from the float32 reads' progress.
    assert main(["odqa-eval", "--index", str(index), "--data", str(squad), "--k", "0", "4",
                 "--p", "1", "3", "--out", str(tmp_path / "eval"), "--matmul-dtype",
                 "bfloat16", *common]) == 0
    assert "resuming" not in capsys.readouterr().err
    rounded = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]
    assert set(rounded) == {"full (bfloat16 matmuls)", "DIL k=4 (bfloat16 matmuls)"}


def test_prescreening_options_of_index_ask_eval_and_predict(tmp_path, capsys, minilm_dir):
    """--prescreen on every command that reads: a random prescreener over the default encoder,
    one that reads word overlaps as the bundled one does (computed from the passages' stored
    sentence spans and texts in the open domain, from the contexts in predict)."""
    from dil_jax.prescreening.sentences import split_sentences

    from tests.helpers import random_prescreener

    # The CLI readers use the default checkpoint: the same MiniLM weights as minilm_dir.
    folder = random_prescreener(minilm_dir, encoder_name="default", overlap=True).save(
        tmp_path / "prescreener")
    index = tmp_path / "index"
    common = COMMON
    build = ["index", "--out", str(index), "--corpus", _write_corpus(tmp_path), "--k", "4",
             "--max-passage-len", "48", "--doc-stride", "24", *common]
    assert main(build) == 0
    # The index exists but holds no sentence embeddings yet: a clear error naming the fix.
    status, _, err = run_cli(["ask", "Who?", "--index", str(index), "--k", "4", "--prescreen",
                              str(folder), *common], capsys)
    assert status == 1 and "dil-jax index" in err
    assert main([*build, "--prescreen", str(folder)]) == 0
    assert list(index.glob("sentences-*/embeddings.npy"))
    assert main(["ask", "Who wrote Pride and Prejudice?", "--index", str(index), "--k", "4",
                 "--top-p", "3", "--prescreen", str(folder), "--top-m", "1", *common]) == 0
    out = capsys.readouterr().out
    assert "prescreen" in out and "Q: Who wrote" in out

    squad, context = _write_squad(tmp_path)
    assert main(["odqa-eval", "--index", str(index), "--data", str(squad), "--k", "4",
                 "--p", "3", "--prescreen", str(folder), "--mass", "0.5",
                 "--out", str(tmp_path / "eval"), *common]) == 0
    results = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]
    assert set(results) == {"DIL k=4", "DIL k=4 + prescreen mass 0.5 (<= 2)"}
    assert "prescreen" in results["DIL k=4 + prescreen mass 0.5 (<= 2)"]["timings"]
    # A progress file written when the prescreened reader was named "+ SEP" is taken over under
    # its new name: the same command again resumes it and reads nothing.
    progress = tmp_path / "eval" / "progress"
    (now,) = progress.glob("*prescreen*.jsonl")
    before = now.with_name(now.name.replace("prescreen", "sep"))  # the earlier name's file
    header, blocks = now.read_text().split("\n", 1)
    settings = json.loads(header)["settings"]
    settings["reader"] = "DIL k=4 + SEP mass 0.5 (<= 2)"
    before.write_text(json.dumps({"settings": settings}) + "\n" + blocks)
    now.unlink()
    capsys.readouterr()
    assert main(["odqa-eval", "--index", str(index), "--data", str(squad), "--k", "4",
                 "--p", "3", "--prescreen", str(folder), "--mass", "0.5",
                 "--out", str(tmp_path / "eval"), *common]) == 0
    assert capsys.readouterr().err.count("resuming: 1 questions already read") == 2
    assert now.is_file() and not before.exists()
    again = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]
    assert [r["by_score"] for r in again.values()] == [r["by_score"] for r in results.values()]

    predictions = tmp_path / "predictions.json"
    assert main(["predict", "--data", str(squad), "--output", str(predictions), "--k", "4",
                 "--allow-untrained-head", "--max-question-len", "16", "--max-passage-len", "48",
                 "--doc-stride", "24",
                 "--prescreen", str(folder), "--top-m", "1", "--no-progress"]) == 0
    answer_text = json.loads(predictions.read_text())["q1"]
    # Top-1: the answer lies inside one sentence of the context.
    assert answer_text and any(answer_text in context[a:b] for a, b in split_sentences(context))


def test_index_retriever_flag(tmp_path, capsys):
    """--retriever bm25s builds and records a bm25s index that `ask` reads; rebuilding with
    another engine replaces BM25 only (the passage cache is kept); an edited bm25s file is
    refused on open, named."""
    from dil_jax.errors import DilJaxError
    from dil_jax.open_domain.index.folder import open_index
    from dil_jax.open_domain.retrieval.engines import BM25sRetriever, RankBM25Retriever

    index = tmp_path / "index"
    build = ["index", "--out", str(index), "--corpus", _write_corpus(tmp_path), "--k", "0",
             "--max-passage-len", "48", "--doc-stride", "24", *COMMON]
    assert main(build + ["--retriever", "bm25s"]) == 0
    settings = json.loads((index / "index.json").read_text())
    assert settings["retriever"] == "bm25s" and "bm25/data.csc.index.npy" in settings["files"]
    assert isinstance(open_index(index).retriever, BM25sRetriever)
    assert main(["ask", "Who wrote Pride and Prejudice?", "--index", str(index), "--k", "0",
                 "--top-p", "2", *COMMON]) == 0
    assert "Q: Who wrote Pride and Prejudice?" in capsys.readouterr().out

    (cache,) = index.glob("cache-k*")
    cache_files = {path: path.stat().st_mtime_ns for path in cache.iterdir()}
    assert main(build + ["--retriever", "rank-bm25"]) == 0
    assert isinstance(open_index(index).retriever, RankBM25Retriever)
    assert {path: path.stat().st_mtime_ns for path in cache.iterdir()} == cache_files

    assert main(build + ["--retriever", "bm25s"]) == 0
    data = index / "bm25" / "data.csc.index.npy"
    data.write_bytes(data.read_bytes()[:-4] + b"\0\0\0\0")
    status, _, err = run_cli(["ask", "Who?", "--index", str(index), "--k", "0", *COMMON], capsys)
    assert status == 1 and "data.csc.index.npy" in err and "changed since" in err
    with pytest.raises(DilJaxError, match="data.csc.index.npy"):
        open_index(index)


def test_index_with_the_lucene_retriever(tmp_path, capsys):
    """--retriever pyserini: index.json records it and fingerprints Lucene's files (names from
    the BM25 manifest); `ask` reads it; an edited Lucene file is refused on open, named."""
    from dil_jax.errors import DilJaxError
    from dil_jax.open_domain.index.folder import open_index
    from dil_jax.open_domain.retrieval.lucene import LuceneRetriever

    index = tmp_path / "index"
    assert main(["index", "--out", str(index), "--corpus", _write_corpus(tmp_path), "--k", "0",
                 "--max-passage-len", "48", "--doc-stride", "24", "--retriever", "pyserini",
                 *COMMON]) == 0
    settings = json.loads((index / "index.json").read_text())
    lucene_files = [name for name in settings["files"] if name.startswith("bm25/_")]
    assert settings["retriever"] == "pyserini" and lucene_files
    assert isinstance(open_index(index).retriever, LuceneRetriever)
    assert main(["ask", "Who wrote Pride and Prejudice?", "--index", str(index), "--k", "0",
                 "--top-p", "2", *COMMON]) == 0
    assert "Q: Who wrote Pride and Prejudice?" in capsys.readouterr().out
    edited = index / lucene_files[0]
    edited.write_bytes(edited.read_bytes()[:-1] + bytes([edited.read_bytes()[-1] ^ 1]))
    with pytest.raises(DilJaxError, match=lucene_files[0].split("/")[1]):
        open_index(index)
