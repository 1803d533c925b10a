"""`dil-jax serve` with the bundled readers over a tiny index, through a real uvicorn server
on loopback: answers routed to the request that asked under concurrency, batched reads equal
single reads, no compilation after /readyz, `/v1/read` against the model's plain call, the
reference client, window pruning (the exact stop: a pruned request's answer is its unpruned
read's).

One server for the module (loading and warming two readers takes ~40 s on 2 busy cores).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from dil_jax.cli import main
from dil_jax.client import Client, ServiceError, format_answer
from dil_jax.defaults import bundled_reader
from dil_jax.open_domain.pruning import WindowPruning
from dil_jax.samples import SAMPLE_PASSAGES
from dil_jax.serve.metrics import CompileCounter

from tests.helpers import free_port

pytestmark = pytest.mark.skipif(bundled_reader("full") is None or bundled_reader("delayed") is None,
                                reason="needs the bundled readers")

# Each question, and the sample passage (title) its answer is in.
QUESTIONS = {"Who wrote Pride and Prejudice?": "T1",
             "What is the capital of France?": "T0",
             "When did Apollo 11 land on the Moon?": "T3",
             "What is the largest coral reef system?": "T4"}
LONG_CONTEXT = " ".join(SAMPLE_PASSAGES[:4])  # ~120 tokens: several 48-token windows
# Questions BM25 finds 2-3 passages for (the ones above find one): read 4 together by the exact
# stop, a round reads 2 passages each (`round_passages`), and some settle after it.
SPREAD_QUESTIONS = ("Who wrote Pride and Prejudice, in Paris or on the Moon?",
                    "Which city is the capital of France, near the coral reef or the Moon?",
                    "When did Apollo 11 land on the Moon, and what does photosynthesis release?",
                    "What is the largest coral reef system, near Paris or BERT?")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import uvicorn

    from dil_jax.serve.app import AppSettings, create_app, server_config
    from dil_jax.serve.engine import Engine
    from dil_jax.serve.loading import ReadSettings, default_specs, load_served_readers
    from dil_jax.serve.metrics import ServeMetrics
    from dil_jax.serve.schemas import Limits

    root = tmp_path_factory.mktemp("serve")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"doc{i}", "title": f"T{i}", "text": text})
                              + "\n" for i, text in enumerate(SAMPLE_PASSAGES)))
    index = root / "index"
    assert main(["index", "--out", str(index), "--corpus", f"jsonl:{corpus}", "--k", "0", "2",
                 "--checkpoint", str(bundled_reader("full")), str(bundled_reader("delayed")),
                 "--max-question-len", "16", "--max-passage-len", "48",
                 "--doc-stride", "24"]) == 0
    # The exact stop: a request the pruning settles (the defaults: use_ir, logits, p = 3,
    # top_k 1) is read pruned, every other one unpruned (test_pruned_requests_...).
    readers = load_served_readers(str(index), default_specs(None, None, None),
                                  ReadSettings(top_p=3, batch_size=4, chunk_size=8,
                                               max_question_len=16, batch_shapes=(1,),
                                               pruning=WindowPruning(), mu=0.5))
    # A long gathering deadline, so that concurrent requests meet in one batch here.
    engine = Engine(readers, Limits(max_p=3), ServeMetrics(), max_batch=4, max_wait_s=0.3)
    app = create_app(engine, AppSettings(request_timeout_s=120))
    port = free_port()
    uvicorn_server = uvicorn.Server(server_config(app, "127.0.0.1", port))
    thread = threading.Thread(target=uvicorn_server.run, daemon=True)
    thread.start()
    client = Client(f"http://127.0.0.1:{port}", timeout=120)
    client.wait_ready(timeout=600)
    yield client, engine
    uvicorn_server.should_exit = True
    thread.join(60)


def test_concurrent_questions_each_get_their_own_answer(server):
    client, engine = server
    asks = [(question, reader) for question in QUESTIONS for reader in ("full", "delayed")]
    with ThreadPoolExecutor(len(asks)) as pool:
        together = list(pool.map(lambda ask: client.answer(ask[0], reader=ask[1]), asks))
    for (question, reader), payload in zip(asks, together):
        assert payload["question"] == question and payload["reader"] == reader
        assert payload["answers"][0]["title"] == QUESTIONS[question], payload
    assert max(payload["batch_size"] for payload in together) > 1  # read together
    # A lone question is read with its own smaller padding (--batch-shapes 1), a batch with
    # the whole batch's: both must give the same answers (below).
    delayed = engine.readers["delayed"]
    assert delayed.for_questions(1).passage_rows < delayed.reader.passage_rows
    # Read alone, each question gets the same answer as in its batch.
    for (question, reader), payload in zip(asks, together):
        alone = client.answer(question, reader=reader)
        assert alone["answers"][0]["text"] == payload["answers"][0]["text"]
        assert alone["answers"][0]["reader_score"] == pytest.approx(
            payload["answers"][0]["reader_score"], abs=1e-4)


def test_nothing_compiles_after_ready(server):
    """No request compiles: the widest chunk programs compiled before /readyz hold every
    chunk, whatever the idle warm-up has compiled since (its compiles are counted apart)."""
    client, engine = server
    before = engine.metrics.compiles_by_requests()
    questions = [*QUESTIONS, "Paris?", "zzzz qqqq",  # one token; no BM25 hit
                 "What does photosynthesis release, and where do the plants store the energy "
                 "they take from light, according to the passage?"]  # truncated to 16 tokens
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda q: client.answer(q, reader="delayed", p=2, top_k=2), questions))
        list(pool.map(lambda q: client.answer(q, reader="full", use_ir=False), questions))
    for question in questions:  # alone: read with the 1-question shape (--batch-shapes 1)
        for reader in ("full", "delayed"):
            client.answer(question, reader=reader)
    for reader in ("full", "delayed"):
        client.read("Who landed on the Moon?", LONG_CONTEXT, reader=reader, top_k=3)
        client.read("Who wrote it?", "Jane Austen wrote it.", reader=reader,
                    handle_impossible_answer=True)
        with ThreadPoolExecutor(3) as pool:  # contexts read together, in a larger shape
            list(pool.map(lambda context, name=reader: client.read("Who?", context,
                                                                   reader=name),
                          [LONG_CONTEXT, SAMPLE_PASSAGES[0], SAMPLE_PASSAGES[5]]))
    assert engine.metrics.compiles_by_requests() == before, \
        "a request compiled a program after /readyz"


def test_weights_are_on_the_device_once(server):
    """The readers' params are device arrays, shared by every batch shape: a host array would
    be copied to the device at each program call."""
    import jax

    _, engine = server
    for served in engine.readers.values():
        params = served.reader.reader.params
        assert all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(params))
        assert all(shaped.reader.params is params for shaped in served.shapes.values())


def test_a_one_window_context_has_its_one_row_program_before_ready(server):
    """The warm-up compiles, before ready, the one-row program of a one-window context
    (`shapes.ready_programs`), at the widest widths."""
    from dil_jax.serve.shapes import hoist_class_of, warm_up_plan

    _, engine = server
    for served in engine.readers.values():
        for count, shaped in served.shapes.items():
            plan = warm_up_plan(shaped, count)
            grid = shaped.grid
            lone = hoist_class_of(grid.plan, False, grid.batch_size, shaped.passage_rows, 1)
            assert any(program.hoist == lone and program.rows == 1
                       and program.q_width == plan.question_widths[-1]
                       for program in plan.programs[:plan.ready_count])


def test_the_idle_warm_up_compiles_the_narrower_programs_then_stops(server):
    """Between requests the worker compiles the narrower chunk programs (/readyz counts
    them), then compiles nothing more; answers read through them are the same."""
    client, engine = server
    first = client.answer("Who wrote Pride and Prejudice?", reader="delayed")
    deadline = time.monotonic() + 600
    while True:
        background = engine.progress["background"]
        if background["done"] == background["total"] or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert background["total"] > 0 and background["done"] == background["total"], background
    settled = CompileCounter.count
    again = client.answer("Who wrote Pride and Prejudice?", reader="delayed")
    assert CompileCounter.count == settled
    assert again["answers"][0]["text"] == first["answers"][0]["text"]
    assert again["answers"][0]["reader_score"] == pytest.approx(
        first["answers"][0]["reader_score"], abs=1e-4)


def _wait_for_the_idle_warm_up(engine, seconds: float = 600) -> dict:
    """/readyz's background progress once the idle warm-up is done (or `seconds` passed)."""
    deadline = time.monotonic() + seconds
    while True:
        background = engine.progress["background"]
        if background["done"] == background["total"] or time.monotonic() > deadline:
            return background
        time.sleep(1)


def test_metrics_count_no_compilation_while_serving(server):
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    client, _ = server
    client.answer("Who wrote Pride and Prejudice?")
    text = urllib.request.urlopen(client.url + "/metrics").read().decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    compiled = {s.labels["stage"]: s.value for s in families["dil_jax_compilations"].samples}
    assert compiled["startup"] > 0 and compiled["serving"] == 0


def test_depth_p_equals_a_read_at_depth_p(server):
    import copy

    from dil_jax.open_domain.scoring import pick_answer

    client, engine = server
    for question in QUESTIONS:
        served = client.answer(question, reader="delayed", p=1, use_ir=False)
        shallow = copy.copy(engine.readers["delayed"].reader)
        shallow.top_p = 1
        read = shallow.read([question])
        assert served["answers"][0]["text"] == pick_answer(read.candidates[0], None).text


def test_read_route_scores_the_models_own_logits(server):
    """The served /v1/read (windows padded to the server's rows, chunks trimmed, batched
    programs) against the full reader's plain call on each window, scored by the same rule."""
    from dil_jax.data.features import window_contexts
    from dil_jax.serve.pipeline import window_spans
    from dil_jax.tokenization import encode_questions

    client, engine = server
    served = client.read("When did Apollo 11 land on the Moon?", LONG_CONTEXT, reader="full",
                         top_k=1)
    assert LONG_CONTEXT[served["start"]:served["end"]] == served["answer"]
    assert "1969" in served["answer"]
    reader = engine.readers["full"].reader
    windows = window_contexts(reader.reader.tokenizer, [LONG_CONTEXT], max_passage_len=48,
                              doc_stride=24)
    assert windows.ids.shape[0] > 1
    q = encode_questions(reader.reader.tokenizer, ["When did Apollo 11 land on the Moon?"], 16)
    n = windows.ids.shape[0]
    out = reader.reader.model(reader.reader.params, np.repeat(q.ids, n, 0), np.repeat(q.mask, n, 0),
                       windows.ids, windows.mask)
    best = max(window_spans(np.asarray(out.start_logits[w]), np.asarray(out.end_logits[w]),
                            float(out.null_start_logits[w]), float(out.null_end_logits[w]),
                            windows.offsets[w, :, 0] >= 0, 1, 15)[0][0][2] for w in range(n))
    assert served["score"] == pytest.approx(best, abs=1e-4)
    listed = client.read("When did Apollo 11 land on the Moon?", LONG_CONTEXT, top_k=3,
                         handle_impossible_answer=True)
    assert isinstance(listed, list) and len(listed) == 3
    assert [a["score"] for a in listed] == sorted((a["score"] for a in listed), reverse=True)


def _read_batches(engine) -> tuple[float, float]:
    """(sum, count) of the worker's /v1/read batch sizes so far, from /metrics' text."""
    from prometheus_client.parser import text_string_to_metric_families

    totals = {"_sum": 0.0, "_count": 0.0}
    for family in text_string_to_metric_families(engine.metrics.text().decode()):
        for sample in family.samples if family.name == "dil_jax_batch_size" else ():
            for suffix in totals:
                if sample.name.endswith(suffix) and sample.labels["kind"] == "read":
                    totals[suffix] += sample.value
    return totals["_sum"], totals["_count"]


@pytest.mark.parametrize("reader", ["full", "delayed"])
def test_concurrent_contexts_are_read_together_each_its_own(server, reader):
    """Concurrent /v1/read requests are read in one pair read (their windows as rows, each
    with its own question) and each gets the answer it gets alone."""
    client, engine = server
    asks = [("Who wrote Pride and Prejudice?", SAMPLE_PASSAGES[1], "Jane Austen"),
            ("What is the capital of France?", SAMPLE_PASSAGES[0], "Paris"),
            ("When did Apollo 11 land on the Moon?", LONG_CONTEXT, "1969"),
            ("What is the largest coral reef system?", SAMPLE_PASSAGES[4], "Great Barrier")]
    batches_before = _read_batches(engine)
    with ThreadPoolExecutor(len(asks)) as pool:
        together = list(pool.map(lambda ask: client.read(ask[0], ask[1], reader=reader), asks))
    batch_sum, batch_count = (after - before for after, before
                              in zip(_read_batches(engine), batches_before))
    assert batch_count < len(asks) and batch_sum == len(asks)  # some read together
    for (question, context, words), payload in zip(asks, together):
        assert words in payload["answer"], (question, payload)
        assert context[payload["start"]:payload["end"]] == payload["answer"]
        alone = client.read(question, context, reader=reader)
        assert alone["answer"] == payload["answer"]
        assert alone["score"] == pytest.approx(payload["score"], abs=1e-4)


def test_the_client_names_refusals_and_formats_answers(server):
    client, _ = server
    with pytest.raises(ServiceError) as refused:
        client.answer("Who?", p=4)
    assert refused.value.status == 422 and refused.value.field == "p"
    assert "p 4 is out of range" in refused.value.message
    text = format_answer(client.answer("Who wrote Pride and Prejudice?", top_k=2))
    assert text.startswith("Q: Who wrote Pride and Prejudice?\nA: ") and "Jane Austen" in text
    assert "time: queue" in text
    assert Client("http://127.0.0.1:9", timeout=2).ready() is False
    with pytest.raises(ServiceError, match="cannot reach"):
        Client("http://127.0.0.1:9", timeout=2).answer("Who?")


def test_client_command_line(server, capsys):
    from dil_jax.client import main as client_main

    client, _ = server
    assert client_main(["Who wrote Pride and Prejudice?", "--server", client.url,
                        "--reader", "delayed"]) == 0
    assert "Jane Austen" in capsys.readouterr().out
    assert client_main(["Who?", "--server", client.url, "--reader", "tiny"]) == 1
    assert "reader 'tiny' is not one of" in capsys.readouterr().err


@pytest.mark.parametrize("reader,k", [("full", "0"), ("delayed", "2")])
def test_ask_server_prints_what_a_local_read_prints(server, capsys, reader, k):
    """`dil-jax ask --server` prints, but for the time line, what `ask` prints for a read of
    the same reader at the same depth in this process (`open_domain.reader.format_answer`)."""
    from dil_jax.open_domain.reader import format_answer as local_format_answer

    client, engine = server
    question = "When did Apollo 11 land on the Moon?"
    assert main(["ask", question, "--server", client.url, "--top-p", "3", "--k", k]) == 0
    served = capsys.readouterr().out
    local = engine.readers[reader]
    read = local.reader.read([question])  # the worker is idle: no request is in flight
    expected = local_format_answer(local.reader, question, read.candidates[0], read.hits[0],
                                   read.timings, 0.5, local.abstention)

    def without_time(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith("   time:")]

    assert without_time(served) == without_time(expected)
    assert "Apollo" in served and "BM25 rank" in served


def test_inputs_without_tokens_are_refused_alone(server):
    """A question or context the tokenizer reads as nothing (a zero-width space, control
    characters) is a 422 naming the field, and a question asked beside it is answered."""
    client, _ = server
    with ThreadPoolExecutor(3) as pool:
        blank = pool.submit(client.answer, "\u200b\u200b", reader="delayed")
        fine = pool.submit(client.answer, "Who wrote Pride and Prejudice?", reader="delayed")
        blank_read = pool.submit(client.read, "\x00\x01", "Jane Austen wrote it.")
        assert fine.result()["answers"][0]["title"] == "T1"
        for future, field in ((blank, "question"), (blank_read, "question")):
            with pytest.raises(ServiceError) as refused:
                future.result()
            assert refused.value.status == 422 and refused.value.field == field, refused.value
    with pytest.raises(ServiceError) as refused:
        client.read("Who wrote it?", "\x00\x01\x02")
    assert refused.value.status == 422 and refused.value.field == "context"


def test_readiness_waits(server):
    client, _ = server
    started = time.monotonic()
    client.wait_ready(timeout=5)
    assert time.monotonic() - started < 5


def test_pruned_requests_get_the_answer_of_reading_every_window(server):
    """With --prune-windows stop, a request the pruning settles (use_ir, the server's span
    score, p = --top-p, top_k 1) is read pruned: its answer (text, passage, reader score,
    abstention) is the one its unpruned read gives, from no more pairs. Read concurrently, so
    that pruned and unpruned requests of a reader meet in one batch (two reads) and the pruned
    read takes rounds; nothing compiles."""
    client, engine = server
    before = engine.metrics.compiles_by_requests()
    asks = [(question, reader, top_k) for question in (*QUESTIONS, *SPREAD_QUESTIONS)
            for reader in ("full", "delayed") for top_k in (1, 2)]
    with ThreadPoolExecutor(len(asks)) as pool:
        payloads = list(pool.map(lambda ask: client.answer(ask[0], reader=ask[1], top_k=ask[2]),
                                 asks))
    by_ask = {ask[:2] + (ask[2] == 1,): payload for ask, payload in zip(asks, payloads)}
    for question, reader in {(q, r) for q, r, _ in asks}:
        pruned, unpruned = by_ask[question, reader, True], by_ask[question, reader, False]
        assert (pruned["pruning"], unpruned["pruning"]) == ("stop", None)
        ours, theirs = pruned["answers"][0], unpruned["answers"][0]
        assert (ours["text"], ours["passage_id"], ours["start"]) == \
            (theirs["text"], theirs["passage_id"], theirs["start"]), (question, reader)
        assert ours["reader_score"] == pytest.approx(theirs["reader_score"], abs=1e-4)
        assert pruned["no_answer"] == unpruned["no_answer"]
        assert 1 <= pruned["pairs_read"] <= unpruned["pairs_read"]
        assert pruned["retrieved"] == unpruned["retrieved"]
        assert "prune" in pruned["timings_ms"] and "prune" not in unpruned["timings_ms"]
    question = next(iter(QUESTIONS))
    for options in ({"use_ir": False}, {"p": 2}, {"span_score": "margin"}):
        assert client.answer(question, reader="delayed", **options)["pruning"] is None
    assert engine.metrics.compiles_by_requests() == before, \
        "a pruned read compiled a program after /readyz"


def test_a_pruned_batch_reads_fewer_pairs_for_the_same_answers(server):
    """The served readers' pruned copies (the batch's padding, the grid and its compiled
    programs shared) read a batch of questions that retrieve several passages: the same fused
    answers as the unpruned copies, from fewer pairs, compiling nothing. Read here once the
    worker is idle (no request in flight, its idle warm-up done: no two threads read at
    once)."""
    from dil_jax.open_domain.scoring import pick_answer

    _, engine = server
    _wait_for_the_idle_warm_up(engine)
    before = CompileCounter.count
    for served in engine.readers.values():
        count = len(SPREAD_QUESTIONS)
        pruned = served.for_questions(count, pruned=True).read(list(SPREAD_QUESTIONS))
        full = served.for_questions(count).read(list(SPREAD_QUESTIONS))
        for ours, theirs in zip(pruned.candidates, full.candidates, strict=True):
            answer, expected = pick_answer(ours, 0.5), pick_answer(theirs, 0.5)
            assert (answer.text, answer.passage_index) == (expected.text, expected.passage_index)
            assert answer.reader_score == pytest.approx(expected.reader_score, abs=1e-4)
        assert sum(pruned.pairs_read) < sum(full.pairs_read), (served.name, pruned.pairs_read)
    assert CompileCounter.count == before


def test_info_shows_the_pruning(server):
    client, _ = server
    for reader in client.info()["readers"].values():
        assert (reader["pruning"], reader["pruning_exact"]) == ("stop", True)
        assert reader["pruned_requests"] == {"use_ir": True, "mu": 0.5, "span_score": "logits",
                                             "p": 3, "top_k": 1}


def test_info_says_what_the_matmuls_read_and_a_rounded_reader_reads_the_same_cache(server):
    """/v1/info names each reader's --matmul-dtype and why; a reader whose kernels are
    rounded for bfloat16 matmuls (`--matmul-dtype bfloat16`) opens the float32-built cache
    of its weights (caches are keyed by the weights, not their rounding)."""
    client, engine = server
    for name, info in client.info()["readers"].items():
        assert info["matmul_dtype"] == "float32", name
        assert info["matmul_dtype_reason"] == "--matmul-dtype float32 (exact)", name
    served = engine.readers["delayed"].reader
    rounded = served.reader.with_matmul_dtype("bfloat16")
    assert rounded.config.matmul_dtype == "bfloat16"
    cache = served.index.open_cache(rounded)
    assert cache.num_tokens == served.index.open_cache(served.reader).num_tokens
