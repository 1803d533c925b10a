"""Reliability of reading: segment lengths past the position table, non-finite reader scores,
questions that share no word with the corpus, huge paragraphs, and named errors (exit 1) where
a plain ValueError / FileNotFoundError used to escape as a traceback."""

from __future__ import annotations

import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dil_jax.errors import DilJaxError
from dil_jax.model.delayed import DelayedInteractionModel, InputError
from dil_jax.model.encoder_config import EncoderConfig
from dil_jax.model.span_reader import PASSAGE_SEGMENT
from dil_jax.reading.grid import PairGrid
from dil_jax.samples import SAMPLE_PASSAGES

from tests.helpers import run_cli

# --checkpoint default: the raw embedded MiniLM (what these tests were written for), not the
# bundled fine-tuned readers that index/ask/odqa-eval read without --checkpoint.
READ = ["--checkpoint", "default", "--batch-size", "2", "--chunk-size", "8"]


def _corpus(tmp_path, texts=SAMPLE_PASSAGES) -> str:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": f"doc{i}", "title": f"T{i}", "text": text}) + "\n"
                            for i, text in enumerate(texts)))
    return f"jsonl:{path}"


@pytest.fixture(scope="module")
def long_window_index(tmp_path_factory):
    """A k = 0 index of 500-token windows: fits MiniLM's 512 positions with 12-token questions
    (12 + 500 = 512), not with 25-token ones."""
    from dil_jax.cli import main

    root = tmp_path_factory.mktemp("reading")
    index = root / "index"
    assert main(["index", "--out", str(index), "--corpus", _corpus(root), "--k", "0",
                 "--max-passage-len", "500", "--doc-stride", "250", "--max-question-len", "12",
                 *READ]) == 0
    return index


def _tiny_model(k: int) -> tuple[DelayedInteractionModel, dict]:
    config = EncoderConfig(vocab_size=20, hidden_size=8, num_layers=2, num_heads=2,
                           intermediate_size=8, embedding_size=8, max_position_embeddings=32,
                           max_question_len=8, num_lower_layers=k)
    model = DelayedInteractionModel(config)
    return model, model.init(jax.random.key(0))


# ----------------------------------------------------------------------------- 1. lengths


def test_encode_lower_refuses_a_position_offset_past_the_table():
    model, params = _tiny_model(0)
    ids = np.ones((1, 20), np.int32)
    # 20 + 20 = 40 > 32: the lookup would read past the position table (NaN / clamped).
    with pytest.raises(InputError, match="offset up to 20 .* = 40 exceeds "
                                         "max_position_embeddings 32"):
        model.encode_lower(params, ids, ids, PASSAGE_SEGMENT, jnp.array([20], jnp.int32))
    # Within the table it still works.
    out = model.encode_lower(params, ids, ids, PASSAGE_SEGMENT, jnp.array([12], jnp.int32))
    assert np.isfinite(np.asarray(out)).all()


def test_grid_reader_refuses_question_plus_passage_past_the_table_at_k0():
    model, params = _tiny_model(0)
    reader = PairGrid(model, batch_size=2, chunk_size=2)
    q = np.ones((2, 8), np.int32)
    p = np.ones((2, 30), np.int32)
    q_lower = reader.encode_questions(params, q, q)
    index = np.arange(2)
    with pytest.raises(InputError, match=r"question length 8 \+ passage length 30 = 38 exceeds "
                                         r"max_position_embeddings 32"):
        reader.read_grid(params, q_lower, q, p, p)
    # k > 0 numbers each segment from 0: the same lengths fit.
    model1 = DelayedInteractionModel(model.config.replace(num_lower_layers=1))
    reader1 = PairGrid(model1, batch_size=2, chunk_size=2)
    p_lower = reader1.encode_passages(params, p, p)
    chunks = list(reader1.iter_pair_chunks(params, reader1.encode_questions(params, q, q), q,
                                           p_lower, p, index, index))
    assert np.isfinite(np.asarray(chunks[0][1][0])).all()


def test_index_refuses_lengths_past_the_table_before_building(tmp_path, capsys):
    out = tmp_path / "index"
    status, _, err = run_cli(["index", "--out", str(out), "--corpus", _corpus(tmp_path),
                              "--k", "0", "--max-passage-len", "500", "--max-question-len", "25",
                              *READ], capsys)
    assert status == 1
    assert "question length 25 + passage length 500 = 525 exceeds max_position_embeddings 512" \
        in err
    assert "--max-question-len" in err and "--max-passage-len" in err
    assert not out.exists()  # refused before any work


def test_ask_refuses_a_question_length_the_index_windows_do_not_fit(long_window_index,
                                                                     capsys):
    status, out, err = run_cli(["ask", "Who wrote Pride and Prejudice?", "--index",
                                str(long_window_index), "--k", "0", "--max-question-len", "25",
                                "--top-p", "2", *READ], capsys)
    assert status == 1
    assert "question length 25 + passage length 500 = 525 exceeds" in err
    assert "--max-question-len" in err
    assert "no passage" not in out  # was "(no passage retrieved)" from NaN logits
    # At the question length the index was built for, it reads.
    status, out, _ = run_cli(["ask", "Who wrote Pride and Prejudice?", "--index",
                              str(long_window_index), "--k", "0", "--max-question-len", "12",
                              "--top-p", "2", *READ], capsys)
    assert status == 0 and "BM25 rank" in out


def test_non_finite_reader_scores_are_an_error_naming_question_and_passage(long_window_index):
    from dil_jax.open_domain.index.folder import open_index
    from dil_jax.open_domain.reader import OpenDomainReader
    from dil_jax.readers import load_reader

    loaded = load_reader("default", 0, 12, None)
    index = open_index(long_window_index)
    cache = index.open_cache(loaded)
    # A checkpoint with a NaN weight in its span head: every span score is NaN.
    params = jax.tree.map(lambda a: a, loaded.params)
    head = params["qa_outputs"]
    params["qa_outputs"] = dict(head, bias=jnp.full_like(head["bias"], jnp.nan))
    reader = OpenDomainReader(index, loaded.with_params(params), cache, top_p=2, batch_size=2,
                              chunk_size=8)
    with pytest.raises(DilJaxError, match=r"non-finite span scores .* question 'Who wrote "
                                          r"Pride and Prejudice\?' on passage doc1#0"):
        reader.read(["Who wrote Pride and Prejudice?"])


# ----------------------------------------------------------------------------- 2. no match


def test_ask_says_when_no_passage_shares_a_word(long_window_index, capsys):
    status, out, _ = run_cli(["ask", "zzqx fnord?", "--index", str(long_window_index), "--k",
                              "0", "--max-question-len", "12", "--top-p", "3", *READ], capsys)
    assert status == 0
    assert "no passage shares a word with the question" in out
    assert "BM25 rank" not in out  # no answer taken from a 0-score passage


def test_odqa_eval_counts_a_no_match_question_as_unanswered(long_window_index, tmp_path,
                                                             capsys):
    context = SAMPLE_PASSAGES[1]
    answer = {"text": "Jane Austen", "answer_start": context.find("Jane Austen")}
    questions = [{"id": "q1", "question": "zzqx fnord?", "answers": [answer]}]
    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps({"version": "1.1", "data": [
        {"title": "T1", "paragraphs": [{"context": context, "qas": questions}]}]}))
    status, _, _ = run_cli(["odqa-eval", "--index", str(long_window_index), "--data",
                            str(squad), "--k", "0", "--max-question-len", "12", "--p", "3",
                            "--out", str(tmp_path / "eval"), *READ], capsys)
    assert status == 0
    result = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]["full"]
    assert result["unmatched"] == 1
    row = result["by_p"]["3"]
    # Nothing retrieved: no recall, no answer (was: 3 passages of score 0, one holding it).
    assert row["R"] == 0.0 and row["EM"] == 0.0 and row["EM_ir"] == 0.0


# ----------------------------------------------------------------------------- 3. huge paragraph


def test_a_huge_paragraph_is_indexed_as_bounded_passages(tmp_path, capsys, caplog):
    """A stand-in for a 10 MB one-paragraph document: 2,600 words without a blank line (over
    the 1,000-word paragraph limit) must become passages of at most 100 words."""
    words = " ".join(" ".join(text.split()) for text in SAMPLE_PASSAGES).split()
    huge = " ".join((words * (2600 // len(words) + 1))[:2600])
    out = tmp_path / "index"
    with caplog.at_level(logging.WARNING, logger="dil_jax.open_domain.index.corpus"):
        status, _, err = run_cli(["index", "--out", str(out), "--corpus",
                                  _corpus(tmp_path, [huge, SAMPLE_PASSAGES[0]]), "--k", "0",
                                  "--max-passage-len", "48", "--doc-stride", "24", *READ],
                                 capsys)
    assert status == 0, err
    passages = [json.loads(line) for line in (out / "passages.jsonl").read_text().splitlines()]
    huge_passages = [p for p in passages if p["doc_id"] == "doc0"]
    assert len(huge_passages) == 51  # windows of 100 words every 50 over 2,600 words
    assert max(len(p["text"].split()) for p in huge_passages) == 100
    assert all(huge[p["char_start"]:p["char_end"]] == p["text"] for p in huge_passages)
    assert "document doc0: 1 paragraph(s) over 1000 words split into windows of 100 words " \
           "(stride 50): 51 passages" in caplog.text
    # Reading one retrieved passage is bounded: a few windows, not the document's hundreds.
    with np.load(out / "windows.npz") as windows:
        assert windows["count"].max() <= 8
    status, out_text, _ = run_cli(["ask", "Who wrote Pride and Prejudice?", "--index", str(out),
                                   "--k", "0", "--top-p", "2", *READ], capsys)
    assert status == 0 and "BM25 rank" in out_text


# ----------------------------------------------------------------------------- 4. named errors


def test_ask_without_a_question_is_a_usage_error_before_loading(tmp_path, capsys):
    # Checked first: no model is loaded and the (here missing) index is not opened.
    status, _, err = run_cli(["ask", "--index", str(tmp_path / "missing")], capsys)
    assert status == 1 and "give a question" in err and "--interactive" in err


def test_odqa_eval_bad_flags_are_named(long_window_index, tmp_path, capsys):
    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps({"version": "1.1", "data": [{"title": "T1", "paragraphs": [
        {"context": SAMPLE_PASSAGES[1], "qas": [{"id": "q1", "question": "Who?", "answers": [
            {"text": "Jane Austen", "answer_start": SAMPLE_PASSAGES[1].find("Jane Austen")}]}]}
    ]}]}))
    base = ["odqa-eval", "--index", str(long_window_index), "--max-question-len", "12", *READ]
    status, _, err = run_cli([*base, "--data", str(squad), "--k", "0", "--articles", "5:"],
                             capsys)
    assert status == 1 and "'5:' (--articles) selects none of the 1 articles" in err
    status, _, err = run_cli([*base, "--data", str(squad), "--k", "0", "--articles", "a:b"],
                             capsys)
    assert status == 1 and "'a:b' (--articles) is not START:STOP" in err
    status, _, err = run_cli([*base, "--data", str(tmp_path / "missing.json"), "--k", "0"],
                             capsys)
    assert status == 1 and "missing.json: no such SQuAD file" in err
    status, _, err = run_cli([*base, "--data", str(squad), "--k", "0", "4",
                              "--checkpoint", "default", "default", "default"], capsys)
    assert status == 1 and "--checkpoint has 3 values and --k has 2" in err


def test_library_misuse_of_the_grid_is_a_named_error():
    model, params = _tiny_model(0)
    ids = np.ones((2, 6), np.int32)
    with pytest.raises(DilJaxError, match="k = 0 .* passage states depend on the question"):
        PairGrid(model, batch_size=2).encode_passages(params, ids, ids)


def test_demo_refuses_lengths_past_the_position_table_before_building(tmp_path, capsys):
    index = tmp_path / "demo-index"
    status, _, err = run_cli(["demo", "--index", str(index), "--max-passage-len", "500",
                              "--distractors", "5", "Who?"], capsys)
    assert status == 1, err
    assert "32 + passage length 500 = 532 exceeds max_position_embeddings 512" in err, err
    assert not index.exists()
