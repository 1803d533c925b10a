"""benchmarks/serve.py's pure parts: which servers it may load, the peer's windows, how answers
are compared, the refused-items bookkeeping of a level (against the fake service). No timing."""

from __future__ import annotations

import argparse
import json
import threading

import pytest

from dil_jax.serve.app import AppSettings
from dil_jax.serve.schemas import Limits

from tests.helpers import load_script
from tests.helpers.serving import FakeEngine, serving

bench = load_script("benchmarks/serve.py")


def test_only_loopback_servers_and_their_names():
    assert bench.server_arg("on=http://127.0.0.1:8771/") == bench.Server(
        "on", "http://127.0.0.1:8771")
    assert bench.server_arg("http://localhost:9000") == bench.Server("9000",
                                                                     "http://localhost:9000")
    with pytest.raises(argparse.ArgumentTypeError, match="only a loopback"):
        bench.server_arg("x=http://10.0.0.1:8000")


def test_peer_windows_are_the_servers(tmp_path):
    # A 192-token window (191 context tokens + [SEP]) every 96 tokens, 32 question tokens
    # ([CLS] + 30 + [SEP]): the pipeline's sequence is 32 + 192 = 224 tokens, and with a
    # 30-token question its 224 - 30 - 3 = 191 context tokens overlap by 191 - 96 = 95.
    from dil_jax.open_domain.index.files import IndexSettings

    settings = IndexSettings(split={}, max_passage_len=192, doc_stride=96, tokenizer="t",
                             passages="p", num_passages=1, num_windows=1)
    (tmp_path / "index.json").write_text(json.dumps(settings.to_json()))
    assert bench.peer_settings(str(tmp_path), 32) == {
        "max_seq_len": 224, "doc_stride": 95, "max_question_len": 32, "context_tokens": 191}


def test_exact_windows_fit_max_seq_len_to_the_question():
    serve_peer = load_script("benchmarks/serve_peer.py")

    settings = serve_peer.PipelineSettings(224, 95, 32)
    # [CLS] + 9 question tokens + [SEP] + 191 context tokens + [SEP] = 203; a question past
    # the server's 30 tokens is cut to 30, as the server cuts it: 224.
    assert settings.for_question(9).max_seq_len == 203
    assert settings.for_question(40).max_seq_len == 224


def test_agreement_counts_same_text_and_same_span():
    ours = {"0": {"answer": "Paris", "start": 3, "end": 8},
            "1": {"answer": "1600 ", "start": 0, "end": 4},
            "2": {"answer": "Austen", "start": 10, "end": 16},
            "3": None}  # not answered: not compared
    theirs = [{"answer": "Paris", "start": 3, "end": 8},
              {"answer": "1600", "start": 1, "end": 5},
              {"answer": "Jane Austen", "start": 5, "end": 16},
              {"answer": "x", "start": 0, "end": 1}]
    agreed = bench.agreement(ours, theirs)
    assert (agreed["compared"], agreed["same_text"], agreed["same_span"]) == (3, 2, 1)
    assert agreed["same_text_rate"] == pytest.approx(2 / 3)
    assert [d["item"] for d in agreed["differing"]] == ["2"]


def test_a_level_past_the_queue_limit_counts_only_refusals_with_retry_after():
    # The fake holds every job until the gate opens: 1 job in the worker's hands + 2 queued,
    # the other 5 of 8 clients are refused at once.
    engine = FakeEngine(Limits(max_p=5), max_batch=1, max_wait_s=0.0, max_queue=2)
    engine.gate = threading.Event()
    items = [bench.Item(f"q{i}?", "") for i in range(8)]
    with serving(engine, AppSettings(request_timeout_s=30)) as url:
        opener = threading.Timer(2.0, engine.gate.set)
        opener.start()
        level = bench.run_level(bench.Server("fake", url), "answer", items, 8, {"p": 5}, 60)
    assert level["sent"] == 8 and level["answered"] + level["statuses"].get("503", 0) == 8
    assert set(level["statuses"]) == {"200", "503"}
    assert level["retry_after"] == level["statuses"]["503"] >= 1 and level["crossed"] == 0
    # Each answered item got its own answer (the fake upper-cases the question).
    assert all(answer["answer"] == f"Q{key}?" for key, answer in level["answers"].items())


def test_level_work_and_batch_mean_come_from_the_metrics_page_difference():
    from dil_jax.serve.metrics import ServeMetrics

    metrics = ServeMetrics()

    def page():
        return bench.metric_totals(metrics.text().decode())

    metrics.phases.labels("delayed", "pair_upper").observe(2.0)
    metrics.batch_size.labels("answer", "delayed").observe(1)
    before = page()
    # The level: two batches of the delayed reader (3 and 1 questions), a full-reader batch
    # (another level's reader) and queue waits (not work).
    for pairs_s, question_s in ((1.5, 0.25), (0.5, 0.25)):
        metrics.phases.labels("delayed", "pair_upper").observe(pairs_s)
        metrics.phases.labels("delayed", "question_lower").observe(question_s)
    metrics.phases.labels("delayed", "queue").observe(7.0)
    metrics.phases.labels("full", "pair_upper").observe(4.0)
    metrics.batch_size.labels("answer", "delayed").observe(3)
    metrics.batch_size.labels("answer", "delayed").observe(1)
    metrics.batch_size.labels("read", "delayed").observe(8)
    after = page()
    work = bench.level_work(before, after, "delayed")
    assert work == pytest.approx({"pair_upper": 2.0, "question_lower": 0.5})
    assert bench.pair_share(work) == pytest.approx(0.8)
    assert bench.level_work(before, after, None) == pytest.approx(
        {"pair_upper": 6.0, "question_lower": 0.5})
    assert bench.batch_mean(before, after, "answer") == pytest.approx(2.0)
    assert bench.batch_mean(before, after, "read") == pytest.approx(8.0)
    assert bench.batch_mean(after, after, "answer") is None
    assert bench.pair_share({}) is None


def test_a_keyed_server_is_read_and_loaded_with_its_key(monkeypatch):
    """benchmarks/serve.py read /v1/info (and sent its requests) without a key, so against a
    server started with --api-key it failed (401)."""
    monkeypatch.delenv(bench.API_KEY_ENV, raising=False)
    engine = FakeEngine(Limits(max_p=5), max_batch=4, max_wait_s=0.0)
    items = [bench.Item(f"q{i}?", "") for i in range(3)]
    with serving(engine, AppSettings(api_key="s3cret", request_timeout_s=30)) as url:
        server = bench.Server("keyed", url)
        assert bench.server_info(server, "s3cret")["api_key_required"] is True
        level = bench.run_level(server, "answer", items, 2, {"p": 5}, 60, api_key="s3cret")
        # Without the key: one line naming the server and the flag, before any level.
        with pytest.raises(SystemExit, match=r"HTTP 401: api_key: .*give its key: --api-key"):
            bench.main(["--url", f"keyed={url}", "--clients", "1", "--requests", "1"])
    assert level["statuses"] == {"200": 3} and level["answered"] == 3
    recorded = bench.recorded_command(["python3", "benchmarks/serve.py", "--api-key", "s3cret",
                                       "--api-key=s3cret", "--clients", "1"])
    assert "s3cret" not in recorded and recorded.endswith("--api-key *** --api-key=*** "
                                                          "--clients 1")


def test_the_rss_sampler_reads_the_server_process_and_a_gone_one_as_none():
    """The load test's "flat memory" column: VmRSS of the given process, sampled while a level
    runs; a process that is gone reads as None, not as an error mid-level."""
    import os
    import subprocess
    import time

    with open(f"/proc/{os.getpid()}/status") as status:
        kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    assert abs(bench.resident_mib(os.getpid()) - kib / 1024) < 64  # this process, same moment
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert bench.resident_mib(gone.pid) is None
    with bench.RssSampler(os.getpid(), every_s=0.01) as rss:
        time.sleep(0.1)
    summary = rss.summary()
    assert summary["samples"] >= 2 and summary["first_mib"] <= summary["max_mib"]
    with bench.RssSampler(None) as nothing:
        pass
    assert nothing.summary() is None


def test_answer_scores_are_the_official_rules_by_hand():
    """EM / F1 of answered items against their SQuAD answers: "Paris" is exact (100 / 100);
    "the city of Paris" normalises to city of paris, 1 of 3 tokens right: EM 0, F1
    2 x (1/3 x 1) / (1/3 + 1) = 50; an empty answer scores 0 / 0; an item without answers is
    not scored, nor one not answered."""
    items = [bench.Item("q0?", "", ("Paris",)), bench.Item("q1?", "", ("Paris", "Lyon")),
             bench.Item("q2?", "", ("Rome",)), bench.Item("q3?", ""),
             bench.Item("q4?", "", ("Oslo",))]
    answers = {0: {"answer": "Paris"}, 1: {"answer": "the city of Paris"}, 2: None,
               3: {"answer": "x"}}
    scores = bench.answer_scores(items, answers)
    assert scores["scored"] == 3
    assert scores["EM"] == pytest.approx(100 / 3) and scores["F1"] == pytest.approx(150 / 3)
    assert bench.answer_scores([bench.Item("q?", "")], {0: {"answer": "x"}}) is None
