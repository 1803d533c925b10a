"""`dil-jax serve` with a QANet or a BiDAF export (the character-level readers,
`CharPairGrid`; every test runs for both): a tiny random-init reader over a tiny index of the
sample passages (its cache built by `dil-jax index --k 1`), served by uvicorn on loopback.

References, each an independent path: `/v1/answer` against what `dil-jax ask` prints for
the same question and index (a local ask loads its own reader, no serve code); `/v1/read`
against the whole reader's plain call on `predict`'s inputs (`featurize` windows,
`squad_characters`), scored by the pipeline rule; no program compiled after `/readyz`,
counted by the `jax.monitoring` listener as tests/serve/test_serve.py counts them.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from dil_jax.client import Client, ServiceError
from dil_jax.errors import UsageError
from dil_jax.open_domain.pruning import WindowPruning
from dil_jax.samples import SAMPLE_PASSAGES
from dil_jax.serve.loading import ReaderSpec, ReadSettings, default_specs, load_served_readers

from tests.helpers import free_port, run_cli
from tests.helpers.qanet import tiny_char_index

Q_LEN, P_LEN, STRIDE = 16, 48, 24
# Batches of 4 questions: their passage rows (12) hold the warm-up's context of several
# windows (9 on this index); batches of 1 get their own padding (3 rows).
SETTINGS = ReadSettings(top_p=3, batch_size=4, chunk_size=4, max_question_len=Q_LEN,
                        batch_shapes=(1,))
QUESTIONS = ("Who wrote Pride and Prejudice?", "What is the capital of France?",
             "When did Apollo 11 land on the Moon?")
LONG_CONTEXT = " ".join(SAMPLE_PASSAGES[:3])  # several 48-token windows


@pytest.fixture(scope="module", params=["qanet", "bidaf"])
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def char_reader(tmp_path_factory, tokenizer, kind):
    """(export folder, index folder) of a tiny reader of this kind and its index."""
    export, index, _ = tiny_char_index(tmp_path_factory.mktemp(f"serve_{kind}"), tokenizer,
                                       Q_LEN, P_LEN, STRIDE, kind)
    return export, index


@pytest.fixture(scope="module")
def server(char_reader):
    """The reader served as the delayed reader (alone: a full reader's warm-up would cost
    ~30 s more): (client, engine)."""
    from dil_jax.serve.engine import Engine
    from dil_jax.serve.metrics import ServeMetrics
    from dil_jax.serve.schemas import Limits

    from tests.helpers.serving import serving

    export, index = char_reader
    readers = load_served_readers(str(index), [ReaderSpec("delayed", str(export), None)],
                                  SETTINGS)
    # A long gathering deadline, so that concurrent requests meet in one batch.
    engine = Engine(readers, Limits(max_p=3), ServeMetrics(), max_batch=4, max_wait_s=0.3)
    with serving(engine) as url:
        worker = engine.worker
        deadline = time.monotonic() + 600
        while not worker.ready.wait(0.5) and worker.failure is None:  # fails fast if it failed
            assert time.monotonic() < deadline, "the server was not ready after 600 s"
        assert worker.failure is None, f"the server failed to start: {worker.failure!r}"
        yield Client(url, timeout=120), engine


def _without_time(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("   time:")]


def test_answers_are_what_a_local_ask_prints(server, char_reader, capsys):
    """`ask --server` (the reference client) prints, but for the time line, what `ask` prints
    reading the same index with the same export in this process; the JSON has the documented
    fields."""
    client, _ = server
    export, index = char_reader
    for question in QUESTIONS[:2]:
        payload = client.answer(question, reader="delayed", top_k=2)
        assert {"question", "reader", "k", "p", "span_score", "use_ir", "mu", "no_answer",
                "no_answer_reason", "threshold", "answers", "batch_size",
                "timings_ms"} <= set(payload)
        assert (payload["reader"], payload["k"], payload["p"]) == ("delayed", 1, 3)
        assert payload["answers"] and len(payload["answers"]) <= 2
        for answer in payload["answers"]:
            assert set(answer) == {"text", "start", "end", "passage_id", "title", "passage",
                                   "bm25_rank", "reader_score", "bm25_score", "fused_score"}
            assert answer["passage"][answer["start"]:answer["end"]] == answer["text"]
        status, served, err = run_cli(["ask", question, "--server", client.url, "--top-p", "3",
                                       "--k", "1"], capsys)
        assert status == 0, err
        status, local, err = run_cli(["ask", question, "--index", str(index), "--checkpoint",
                                      str(export), "--k", "1", "--top-p", "3",
                                      "--max-question-len", str(Q_LEN), "--batch-size", "4",
                                      "--chunk-size", "4"], capsys)
        assert status == 0, err
        assert _without_time(served) == _without_time(local)
        assert f"A: {payload['answers'][0]['text']}" in local.splitlines()


def test_info_names_the_kind(server, kind):
    client, _ = server
    info = client.info()["readers"]["delayed"]
    assert (info["kind"], info["k"]) == (kind, 1)
    assert info["pruning"] is None and info["pruned_requests"] is None


def test_warm_up_enumerates_the_char_grids_programs(server):
    """2 question widths (8, 16) x 2 passage widths (32, 48) x every chunk row count, nothing
    hoisted, per shape; the widest one (most rows, 16 x 48) before ready, and the one-row
    one of a one-window context at those widths."""
    from dil_jax.serve.shapes import warm_up_plan

    _, engine = server
    served = engine.readers["delayed"]
    for count, shaped in served.shapes.items():
        plan = warm_up_plan(shaped, count)
        rows = shaped.grid.chunk_row_choices()
        assert (plan.question_widths, plan.passage_widths, plan.size) == (
            [8, 16], [32, 48], 4 * len(rows))
        assert plan.ready_count == 2
        assert [(program.rows, program.q_width, program.p_width)
                for program in plan.programs[:2]] == [(rows[-1], 16, 48), (rows[0], 16, 48)]


def test_nothing_compiles_after_ready(server):
    """No request compiles (the idle warm-up's compiles are counted apart)."""
    client, engine = server
    before = engine.metrics.compiles_by_requests()
    questions = [*QUESTIONS, "Paris?", "zzzz qqqq",  # one token; no BM25 hit
                 "What does photosynthesis release, and where do the plants store the energy "
                 "they take from light, according to the passage?"]  # truncated to 16 tokens
    with ThreadPoolExecutor(4) as pool:  # read in batches of up to 4 (the whole batch's shape)
        together = list(pool.map(lambda q: client.answer(q, p=2, top_k=2), questions))
    assert max(payload["batch_size"] for payload in together) > 1
    for question, payload in zip(questions, together):  # alone: the 1-question shape
        alone = client.answer(question, p=2, top_k=2)
        assert [a["text"] for a in alone["answers"]] == [a["text"] for a in payload["answers"]]
    client.read("Who landed on the Moon?", LONG_CONTEXT, top_k=3)
    client.read("Who wrote it?", "Jane Austen wrote it.")
    with ThreadPoolExecutor(3) as pool:  # contexts read together
        list(pool.map(lambda context: client.read("Who?", context),
                      [LONG_CONTEXT, SAMPLE_PASSAGES[0], SAMPLE_PASSAGES[5]]))
    assert engine.metrics.compiles_by_requests() == before, \
        "a request compiled a program after /readyz"


def test_read_route_is_the_whole_reader_on_predicts_inputs(server, tokenizer):
    """/v1/read (windows padded to the server's rows, chunks trimmed, passage states from the
    grid's lower program) against the whole reader's plain call on each window of `predict`'s
    featurization and characters, scored by the same pipeline rule."""
    import jax

    from dil_jax.data.characters import squad_characters
    from dil_jax.data.features import featurize
    from dil_jax.data.squad import SquadExample
    from dil_jax.serve.pipeline import window_spans

    client, engine = server
    question = QUESTIONS[2]
    served = client.read(question, LONG_CONTEXT, top_k=1)
    assert LONG_CONTEXT[served["start"]:served["end"]] == served["answer"]
    reader = engine.readers["delayed"].reader.reader
    example = SquadExample("q", "t", LONG_CONTEXT, question)
    features = featurize([example], tokenizer, max_question_len=Q_LEN,
                         max_passage_len=P_LEN, doc_stride=STRIDE)
    chars = squad_characters([example], features, tokenizer)
    n = features.p_ids.shape[0]
    assert n > 1
    whole = jax.jit(reader.outputs)  # one program, not op by op
    out = whole(reader.params, {
        "q_ids": np.repeat(features.q_ids, n, 0), "q_chars": np.repeat(chars.q_chars, n, 0),
        "q_mask": np.repeat(features.q_mask, n, 0), "p_ids": features.p_ids,
        "p_chars": chars.p_chars[chars.p_source], "p_mask": features.p_mask})
    best = max(((w, *span) for w in range(n) for span in window_spans(
        np.asarray(out.start_logits[w]), np.asarray(out.end_logits[w]),
        float(out.null_start_logits[w]), float(out.null_end_logits[w]),
        features.offsets[w, :, 0] >= 0, 1, 15)[0]), key=lambda found: found[3])
    window, start, end, score = best
    assert served["score"] == pytest.approx(score, rel=1e-4, abs=1e-6)
    # The served span is the reference's tokens widened to whole words.
    assert served["start"] <= features.offsets[window, start, 0]
    assert served["end"] >= features.offsets[window, end, 1]


def test_handle_impossible_answer_is_refused_by_name(server, kind):
    """A QANet or a BiDAF has no no-answer score: a 422 naming the field, the reader and why (as
    `predict` refuses --null-threshold for one), never a 500."""
    client, _ = server
    with pytest.raises(ServiceError) as refused:
        client.read("Who wrote it?", "Jane Austen wrote it.", handle_impossible_answer=True)
    error = refused.value
    assert (error.status, error.field) == (422, "handle_impossible_answer")
    assert f"delayed reader is a {kind} reader" in error.message
    assert "no no-answer score" in error.message


def test_a_k_other_than_the_fixed_split_is_refused(char_reader, capsys):
    export, index = char_reader
    with pytest.raises(UsageError) as refused:
        load_served_readers(str(index), [ReaderSpec("delayed", str(export), 2)], SETTINGS)
    message = str(refused.value)
    assert f"--k 2 with --delayed-checkpoint {export}" in message
    assert "split is fixed" in message and "pass --k 1" in message
    # As the full reader (read at k = 0), through the command line: one line, no trace.
    status, _, err = run_cli(["serve", "--index", str(index), "--full-checkpoint", str(export),
                              "--delayed-checkpoint", str(export), "--port", str(free_port())],
                             capsys)
    assert status != 0 and "Traceback" not in err
    assert f"--full-checkpoint {export}, read at k = 0" in err
    assert "serve it as --delayed-checkpoint" in err
    full, delayed = default_specs(str(export), str(export), 2)
    assert (full.k_flag, delayed.k_flag) == (None, "--k")


def test_serve_loads_a_full_reader_beside_a_char_reader(char_reader, kind, tmp_path,
                                                        monkeypatch, capsys):
    """`dil-jax serve --full-checkpoint BUNDLED --delayed-checkpoint READER` (a QANet or a
    BiDAF) over an index with both caches loads both (the server itself is not started:
    `serve` is replaced), and refuses `--k 2` for it."""
    from dil_jax.commands import serve as serve_command
    from dil_jax.defaults import bundled_reader

    from tests.helpers.index import build_sample_index

    full = bundled_reader("full")
    if full is None:
        pytest.skip("needs the bundled full reader")
    export, _ = char_reader
    index, _ = build_sample_index(tmp_path, "--checkpoint", str(full), str(export),
                                  "--max-passage-len", str(P_LEN), "--doc-stride", str(STRIDE),
                                  "--max-question-len", str(Q_LEN), ks=("0", "1"))
    loaded = {}

    def capture(readers, limits, args, api_key, sockets=None) -> int:
        loaded.update(readers)
        return 0

    monkeypatch.setattr(serve_command, "serve", capture)
    common = ["serve", "--index", str(index), "--full-checkpoint", str(full),
              "--delayed-checkpoint", str(export), "--max-question-len", str(Q_LEN),
              "--top-p", "3", "--port", str(free_port())]
    status, _, err = run_cli(common, capsys)
    assert status == 0, err
    assert [(name, r.kind, r.k) for name, r in loaded.items()] == [("full", "encoder", 0),
                                                                   ("delayed", kind, 1)]
    # --prune-windows calibrated (the default): the bundled full reader's H was calibrated at
    # p = 29, so at --top-p 3 it reads with the exact stop; a char reader cannot prune (no
    # LayerNorm-bounded span head) and reads every window.
    assert loaded["full"].pruning == WindowPruning() and loaded["full"].pruned
    assert loaded["delayed"].pruning is None and loaded["delayed"].pruned == {}
    assert f"a {kind} reader does not end with" in loaded["delayed"].pruning_reason
    status, _, err = run_cli([*common, "--prune-windows", "stop"], capsys)
    assert status != 0 and "Traceback" not in err
    assert f"--prune-windows stop: the delayed reader ({export}): window pruning" in err, err
    status, _, err = run_cli([*common, "--k", "2"], capsys)
    assert status != 0 and "--k 2 with --delayed-checkpoint" in err and "pass --k 1" in err
