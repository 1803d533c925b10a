"""A QANet export in the open domain: `dil-jax index` caches its passage side (embedding +
embedding encoder, read with each token's characters from the passage text), `ask` and
`odqa-eval` read questions against that cache.

References: the whole QANet (`QANetModel.__call__`, tested against NumPy in
tests/model/test_qanet.py) on each (question, window) pair, with characters taken from the
corpus texts by each passage's own rows (`PassageWindows.first` / `count`), not by the index's
row -> passage map the cache builder uses.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from dil_jax.data.decoding import window_nbest
from dil_jax.model.qanet_inputs import QANetSegment, token_characters
from dil_jax.open_domain.index.folder import open_index, window_arrays
from dil_jax.open_domain.reader import OpenDomainReader
from dil_jax.readers import load_reader
from dil_jax.samples import SAMPLE_PASSAGES
from dil_jax.tokenization import encode_questions

from tests.helpers import run_cli
from tests.helpers.qanet import tiny_char_index

Q_LEN, P_LEN, STRIDE = 16, 48, 24
QUESTION = "Who wrote Pride and Prejudice?"
# Whole reader vs the same reader compiled at other shapes (the grid's batches and chunks):
# float32 rounding over a few hundred O(1) ops, far below this share of the largest logit.
RTOL = 1e-4


@pytest.fixture(scope="module")
def qanet_index(tmp_path_factory, tokenizer):
    """A tiny QANet export over MiniLM's vocabulary and an index of the sample passages with
    its cache: (export folder, index folder, corpus source)."""
    return tiny_char_index(tmp_path_factory.mktemp("qanet_odqa"), tokenizer, Q_LEN, P_LEN,
                            STRIDE)


def _reference_states(reader, index) -> np.ndarray:
    """encode_lower of every window, passage by passage, characters from the corpus text."""
    arrays = window_arrays(index)
    states = np.zeros(arrays["ids"].shape + (reader.config.hidden_size,), np.float32)
    windows = index.windows
    for passage, (first, count) in enumerate(zip(windows.first, windows.count, strict=True)):
        rows = np.arange(first, first + count)
        text = SAMPLE_PASSAGES[int(index.passages[passage].passage_id.removeprefix("doc")
                                   .split("#")[0].split("-")[0])]
        assert index.passages[passage].text in text
        chars = token_characters([index.passages[passage].text] * count,
                                 arrays["offsets"][rows], arrays["mask"][rows],
                                 reader.config.max_chars)
        segment = QANetSegment(arrays["ids"][rows], chars, arrays["mask"][rows])
        states[rows] = np.asarray(reader.model.encode_lower(reader.params, segment))
    return states


def test_the_cache_holds_each_windows_embedding_encoder_state(qanet_index):
    export, index_dir, _ = qanet_index
    reader = load_reader(export)
    index = open_index(index_dir)
    cache = index.open_cache(reader)  # also re-encodes two rows (`check_states`)
    assert cache.manifest.key.architecture == "qanet"
    assert cache.manifest.key.num_lower_layers == 1 and cache.manifest.key.hidden_size == 16
    assert [p.name[:9] for p in index_dir.glob("cache-k*")] == ["cache-k1-"]
    want = _reference_states(reader, index)
    got = cache.read_states(np.arange(len(cache)))
    real = np.asarray(window_arrays(index)["mask"]) > 0
    np.testing.assert_allclose(got[real], want[real], rtol=0,
                               atol=RTOL * np.abs(want[real]).max())


def test_reader_scores_are_the_whole_qanets_on_each_pair(qanet_index, tokenizer):
    """Each retrieved passage's candidate score is the best allowed span of its windows under
    the whole QANet (question characters from the question text)."""
    export, index_dir, _ = qanet_index
    reader = load_reader(export)
    index = open_index(index_dir)
    odqa = OpenDomainReader(index, reader, index.open_cache(reader), top_p=3, batch_size=2,
                            chunk_size=4)
    result = odqa.read([QUESTION])
    candidates = result.candidates[0]
    assert candidates  # BM25 retrieves only passages sharing a word with the question
    q = encode_questions(tokenizer, [QUESTION], Q_LEN)
    question = QANetSegment(q.ids, token_characters([QUESTION], q.offsets, q.mask,
                                                    reader.config.max_chars), q.mask)
    arrays = window_arrays(index)
    states = _reference_states(reader, index)
    for candidate in candidates:
        rows = np.arange(index.windows.first[candidate.passage_index],
                         index.windows.first[candidate.passage_index]
                         + index.windows.count[candidate.passage_index])
        q_state = reader.model.encode_lower(reader.params, question)
        out = reader.model.encode_upper(
            reader.params, np.repeat(np.asarray(q_state), len(rows), 0),
            np.repeat(q.mask, len(rows), 0), states[rows], arrays["mask"][rows])
        valid_end = arrays["offsets"][rows][..., 0] >= 0
        scores, _, _ = window_nbest(np.asarray(out.start_logits), np.asarray(out.end_logits),
                                    valid_end & arrays["max_context"][rows], valid_end,
                                    n_best=1, max_answer_length=30)
        want = float(scores[:, 0].max()) / 2
        assert candidate.reader_score == pytest.approx(want, abs=RTOL * abs(want) + 1e-5)


def test_ask_and_odqa_eval_read_a_qanet(qanet_index, tmp_path, capsys):
    export, index_dir, _ = qanet_index
    common = ["--checkpoint", str(export), "--max-question-len", str(Q_LEN), "--batch-size",
              "2", "--chunk-size", "8"]
    status, out, err = run_cli(["ask", QUESTION, "--index", str(index_dir), "--k", "1",
                                "--top-p", "3", *common], capsys)
    assert status == 0, err
    assert f"Q: {QUESTION}" in out and "time: retrieval" in out
    squad = tmp_path / "squad.json"
    context = SAMPLE_PASSAGES[1]
    answer = {"text": "Jane Austen", "answer_start": context.find("Jane Austen")}
    squad.write_text(json.dumps({"version": "1.1", "data": [{"title": "T1", "paragraphs": [
        {"context": context, "qas": [{"id": "q1", "question": "Who wrote it?",
                                      "answers": [answer]}]}]}]}))
    status, _, err = run_cli(["odqa-eval", "--index", str(index_dir), "--data", str(squad),
                              "--k", "1", "--p", "1", "3", "--out", str(tmp_path / "eval"),
                              *common], capsys)
    assert status == 0, err
    results = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]
    assert len(results) == 1
    for row in next(iter(results.values()))["by_p"].values():
        assert row["R"] in (0.0, 100.0) and 0 <= row["F1"] <= 100


def test_a_k_other_than_the_fixed_split_is_refused(qanet_index, capsys):
    export, index_dir, _ = qanet_index
    status, _, err = run_cli(["ask", QUESTION, "--index", str(index_dir), "--k", "2",
                              "--checkpoint", str(export)], capsys)
    assert status != 0 and "--k 2" in err and "split is fixed" in err and "--k 1" in err
    assert "Traceback" not in err
