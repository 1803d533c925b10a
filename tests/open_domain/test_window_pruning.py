"""Window pruning (`dil_jax.open_domain.pruning`): the bound on a span head, the settle test, and
the reader's pruned read on random grids (a stand-in pair program) against reading every window.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dil_jax.open_domain.pruning import (
    WindowPruning,
    WindowPruningError,
    answer_settled,
    largest_std,
    layer_norm_logit_bounds,
    reader_score_bounds,
    settled_questions,
    span_head_bounds,
)
from dil_jax.open_domain.reader import OpenDomainReader, RetrievedPairs
from dil_jax.open_domain.scoring import best_pair_of_each_hit, fusion_scores
from dil_jax.reading.pairs import SpanScores

# ----------------------------------------------------------------------------- the bound


def _layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    centred = x - x.mean(axis=-1, keepdims=True)
    return centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + eps) * scale + bias


@pytest.mark.parametrize("seed", range(5))
def test_layer_norm_logit_bounds_hold_and_are_reached(seed):
    """Random LayerNorm and head: the outputs of random inputs (large and tiny ones, which eps
    shrinks) lie inside the bounds, and the input along the head's centred weights reaches the
    upper one (so the bound is the tightest of its kind, not merely true)."""
    rng = np.random.default_rng(seed)
    hidden, eps = 24, 1e-12
    scale, bias = rng.normal(1, 0.3, hidden), rng.normal(0, 0.2, hidden)
    kernel, head_bias = rng.normal(0, 0.5, (hidden, 2)), rng.normal(0, 0.1, 2)
    low, high = layer_norm_logit_bounds(scale, bias, kernel, head_bias)
    x = np.concatenate([rng.normal(0, 10, (500, hidden)), rng.normal(0, 1e-7, (50, hidden))])
    logits = _layer_norm(x, scale, bias, eps) @ kernel + head_bias
    assert (logits >= low - 1e-9).all() and (logits <= high + 1e-9).all()
    for out in range(2):
        aligned = kernel[:, out] * scale
        best = _layer_norm(aligned[None], scale, bias, eps) @ kernel[:, out] + head_bias[out]
        np.testing.assert_allclose(best, high[out], rtol=1e-9)


def test_reader_score_bounds_by_rule():
    bounds = (np.array([-2.0, -3.0]), np.array([4.0, 5.0]))
    assert reader_score_bounds(bounds, "logits") == (-2.5, 4.5)
    assert reader_score_bounds(bounds, "margin") == (-7.0, 7.0)
    with pytest.raises(WindowPruningError, match="unknown span score rule 'prob'"):
        reader_score_bounds(bounds, "prob")


@pytest.mark.parametrize("seed", range(20))
def test_largest_std_is_the_largest_over_every_corner(seed):
    """Brute force over every assignment of the unknowns to the interval's ends and a grid
    inside it: none has a larger std, and one has this std."""
    rng = np.random.default_rng(seed)
    low, high = -6.0, 7.0
    known = rng.uniform(-5, 5, int(rng.integers(1, 7)))
    unknown = int(rng.integers(0, 5))
    largest = largest_std(known, unknown, low, high)
    stds = [np.concatenate([known, values]).std()
            for values in itertools.product(np.linspace(low, high, 5), repeat=unknown)]
    assert max(stds) <= largest + 1e-9
    assert max(stds) == pytest.approx(largest)


# ----------------------------------------------------------------------------- the settle test


def test_reader_alone_never_settles_under_the_bound():
    """Without fusion an unread passage may reach the bound, above any read score."""
    assert not answer_settled(np.array([4.0, 1.0]), np.array([9.0, 8.0]), np.array([1.0]),
                              (-5.0, 5.0), None)
    assert answer_settled(np.array([4.0, 1.0]), np.array([9.0, 8.0]), np.array([]),
                          (-5.0, 5.0), None)


def test_a_clear_bm25_lead_settles_with_fusion():
    """Two passages read far ahead of the rest in BM25, the first also the reader's best: no
    unread one can overtake it; without the BM25 lead it is not settled."""
    read_r, read_b = np.array([4.0, 1.0]), np.array([30.0, 29.0])
    assert answer_settled(read_r, read_b, np.array([5.0, 4.0, 3.0]), (-5.0, 5.0), 0.5)
    assert not answer_settled(read_r, read_b, np.array([28.5, 28.0, 3.0]), (-5.0, 5.0), 0.5)


def test_ties_are_never_settled():
    assert not answer_settled(np.array([3.0, 3.0]), np.array([9.0, 9.0]), np.array([]),
                              (-5.0, 5.0), 0.5)


# ----------------------------------------------------------------------------- random grids

P_LEN = 4


class Grid:
    """A random retrieval: per question, passages (BM25 scores, best first, some tied) of 1-3
    windows, each window with a reader score in [low, high] (some tied, many at an end)."""

    def __init__(self, seed: int, bounds: tuple[float, float]):
        rng = np.random.default_rng(seed)
        self.hits, self.window_score, row = [], {}, 0
        for question in range(int(rng.integers(1, 5))):
            count = int(rng.integers(1, 9))
            bm25 = np.sort(np.round(rng.gamma(2.0, 3.0, count), 1))[::-1]
            question_hits = []
            for rank in range(count):
                windows = list(range(row, row + int(rng.integers(1, 4))))
                row = windows[-1] + 1
                for window in windows:
                    # Often at the bound's ends: where an unread passage moves the fused ranking
                    # most (the std of the reader scores at its largest).
                    score = rng.choice([rng.uniform(*bounds), *bounds], p=[0.5, 0.25, 0.25])
                    self.window_score[question, window] = round(score, 0 if seed % 3 else 2)
                question_hits.append(Hit(float(bm25[rank]), windows))
            self.hits.append(question_hits)

    @property
    def pairs(self) -> RetrievedPairs:
        pairs = RetrievedPairs([], [], [])
        for question, question_hits in enumerate(self.hits):
            for rank, hit in enumerate(question_hits):
                pairs.question += [question] * len(hit.rows)
                pairs.row += hit.rows
                pairs.hit += [(question, rank)] * len(hit.rows)
        return pairs


class Hit:
    def __init__(self, score: float, rows: list[int]):
        self.score, self.rows = score, rows


def _stand_in_reader(grid: Grid, pruning: WindowPruning, logit_bounds, chunk_size: int = 8
                     ) -> OpenDomainReader:
    """An OpenDomainReader whose pair program is a lookup of the grid's window scores (carried
    in the null start logit) and whose reader score is that value: `_read_until_settled` runs
    as it is. Records the pairs read, round by round, in `reader.rounds`."""
    from types import SimpleNamespace

    reader = object.__new__(OpenDomainReader)
    reader.pruning, reader._logit_bounds, reader.span_score = pruning, logit_bounds, "logits"
    reader.grid = SimpleNamespace(chunk_size=chunk_size, mesh=SimpleNamespace(devices=np.zeros(1)))
    reader.offsets = np.zeros((1, P_LEN, 2))
    reader.rounds = []

    def read_pairs(q_lower, q_mask, pairs, positions):
        reader.rounds.append(list(zip(pairs.question, pairs.row)))
        values = np.asarray([grid.window_score[q, r] for q, r in zip(pairs.question, pairs.row)],
                            np.float32)
        scores = SpanScores.full(len(values), P_LEN, 0.0, 0.0)
        scores.null_start_logits[:] = values
        return scores, np.full(len(values), 7)

    reader._read_pairs = read_pairs
    reader._reader_scores = lambda rows, scores: np.asarray(scores.null_start_logits, np.float64)
    return reader


def _answer(grid: Grid, pairs: RetrievedPairs, values: np.ndarray, question: int,
            mu: float | None) -> tuple[int, int] | None:
    """(rank, window) the reader answers with from these pairs: each hit's best window, then
    `fusion_scores`' argmax, as `OpenDomainReader._candidates` and `pick_answer` pick."""
    mine = [i for i, q in enumerate(pairs.question) if q == question]
    if not mine:
        return None
    best = best_pair_of_each_hit(values[mine], [pairs.hit[i] for i in mine])
    chosen = [mine[i] for i in sorted(best.values())]
    scores = fusion_scores(values[chosen],
                           [grid.hits[question][pairs.hit[i][1]].score for i in chosen], mu)
    pick = chosen[int(np.argmax(scores))]
    return pairs.hit[pick][1], pairs.row[pick]


LOGIT_BOUNDS = (np.array([-3.0, -4.0]), np.array([4.0, 5.0]))   # reader scores in [-3.5, 4.5]


@pytest.mark.parametrize("seed", range(300))
def test_exact_stop_never_drops_the_window_the_full_read_picks(seed):
    """Random grids with every window's score within the bound: the pruned read's answer is
    the full read's (same passage and window), so the window that read picks is always read;
    and it reads no pair twice. (Each seed draws its fusion weight and stage.)"""
    mu = [None, 0.2, 0.5, 0.8, 1.0][seed % 5]
    stage, chunk_size = 1 + seed // 5 % 3, [1, 4, 8][seed // 15 % 3]
    grid = Grid(seed, reader_score_bounds(LOGIT_BOUNDS, "logits"))
    pruning = WindowPruning(stage=stage, mu=mu)
    reader = _stand_in_reader(grid, pruning, LOGIT_BOUNDS, chunk_size)
    every = grid.pairs
    every_value = np.asarray([grid.window_score[q, r] for q, r in zip(every.question, every.row)],
                             np.float32).astype(np.float64)
    read, scores, tokens = reader._read_until_settled(None, None, every, None, grid.hits, {
        "pair_upper": 0.0, "prune": 0.0})
    read_value = np.asarray(scores.null_start_logits, np.float64)
    flat = [pair for round_pairs in reader.rounds for pair in round_pairs]
    assert len(flat) == len(set(flat)) == len(read.row) and (tokens == 7).all()
    for question in range(len(grid.hits)):
        full = _answer(grid, every, every_value, question, mu)
        assert _answer(grid, read, read_value, question, mu) == full
        assert (question, full[1]) in flat


@pytest.mark.parametrize("seed", range(100))
def test_approximate_stop_reads_what_its_rule_says(seed):
    """With an assumed highest score (stop:H, scores above it in the grid): each question reads
    exactly its passages up to the first depth of its rounds (`round_depths`, tested by hand
    below) at which the settle test, applied to that prefix under the assumption, holds, or all
    of them; recomputed here from the rule."""
    from dil_jax.open_domain.reader import round_depths

    mu, stage, chunk_size = [None, 0.5][seed % 2], 1 + seed // 2 % 2, [1, 3, 8][seed // 4 % 3]
    high = float(np.random.default_rng(seed).uniform(-1, 3))
    grid = Grid(seed, reader_score_bounds(LOGIT_BOUNDS, "logits"))
    pruning = WindowPruning(high=high, stage=stage, mu=mu)
    reader = _stand_in_reader(grid, pruning, LOGIT_BOUNDS, chunk_size)
    low = reader_score_bounds(LOGIT_BOUNDS, "logits")[0]
    read, _, _ = reader._read_until_settled(None, None, grid.pairs, None, grid.hits, {
        "pair_upper": 0.0, "prune": 0.0})

    def settled(question: int, depth: int) -> bool:
        hits = grid.hits[question]
        best = [max(grid.window_score[question, r] for r in hit.rows) for hit in hits[:depth]]
        return depth >= len(hits) or answer_settled(
            np.asarray(best, np.float64), [h.score for h in hits[:depth]],
            [h.score for h in hits[depth:]], (low, high), mu)

    windows = np.zeros((len(grid.hits), max(map(len, grid.hits))), np.int64)
    for question, hits in enumerate(grid.hits):
        windows[question, :len(hits)] = [len(hit.rows) for hit in hits]
    depth = np.zeros(len(grid.hits), np.int64)
    unsettled = list(range(len(grid.hits)))
    while unsettled:
        depth = round_depths(depth, unsettled, windows, stage, chunk_size)
        unsettled = [q for q in unsettled if not settled(q, depth[q])]
    for question, question_hits in enumerate(grid.hits):
        expected = {(question, r) for hit in question_hits[:depth[question]] for r in hit.rows}
        assert {(q, r) for q, r in zip(read.question, read.row) if q == question} == expected


@pytest.mark.parametrize("depth, unsettled, stage, chunk_size, expected", [
    # A lone question, 1 window a passage, chunks of 16: 1 passage (1 row), then 1 more
    # (doubling 1 -> 2: 1 row), then 2 (2 rows), 4, 8; capped at its 20 passages.
    ([0], [0], 1, 16, [1]), ([1], [0], 1, 16, [2]), ([2], [0], 1, 16, [4]),
    ([4], [0], 1, 16, [8]), ([16], [0], 1, 16, [20]),
    # stage 3: 3 pairs run at 4 rows, so a 4th passage rides in the padding row.
    ([0], [0], 3, 16, [4]),
    # chunks of 3: 3 pairs are one whole chunk, nothing to fill.
    ([0], [0], 3, 3, [3]),
])
def test_round_depths_by_hand_lone_question(depth, unsettled, stage, chunk_size, expected):
    from dil_jax.open_domain.reader import round_depths

    windows = np.ones((1, 20), np.int64)
    assert round_depths(np.array(depth), unsettled, windows, stage,
                        chunk_size).tolist() == expected


def test_round_depths_by_hand_fills_the_rows_in_turn():
    """Three questions; passages of 2, 1, 3 windows (question 0), 1, 1, 1, ... (question 1),
    question 2 settled. Chunks of 8. Doubling: q0 reads 1 passage (2 pairs), q1 1 (1 pair): 3
    pairs run at 4 rows; the filling round gives q0 its next (1 pair: 4 <= 4), then q1's next
    would be 5 > 4: stop. Depths [2, 1, 0]. From depths [2, 1]: q0 reads its last passage
    (3 pairs: it has 3 passages, the 4th has no windows), q1 1 more: 4 pairs at 4 rows, and q1's
    next does not fit."""
    from dil_jax.open_domain.reader import round_depths

    windows = np.array([[2, 1, 3, 0], [1, 1, 1, 1], [1, 1, 1, 1]])
    first = round_depths(np.zeros(3, np.int64), [0, 1], windows, 1, 8)
    assert first.tolist() == [2, 1, 0]
    assert round_depths(first, [0, 1], windows, 1, 8).tolist() == [3, 2, 0]


def test_round_depths_after_prescreening_reads_past_an_empty_passage():
    """A passage left with no windows (prescreening kept none of its sentences) in the middle
    is passed, for free; one past the last with windows is not there."""
    from dil_jax.open_domain.reader import round_depths

    windows = np.array([[1, 0, 0, 1, 0, 0]])
    assert round_depths(np.zeros(1, np.int64), [0], windows, 1, 8).tolist() == [3]
    assert round_depths(np.array([3]), [0], windows, 1, 8).tolist() == [4]


def test_settled_questions_counts_a_partly_read_passage_as_unread():
    """Passage 0 has two windows, one read: its best may be the unread one, so with the
    reader alone (no bound can be beaten) question 0 is not settled; read whole and with no
    passage left, it is."""
    question, rank = np.zeros(3, int), np.array([0, 0, 1])
    scores, bm25 = np.array([2.0, -np.inf, 1.0]), np.array([5.0, 5.0, 4.0])
    partly = np.array([True, False, True])
    assert settled_questions(question, rank, scores, bm25, partly, (-5.0, 5.0), None, [0]) == []
    whole = np.array([True, True, True])
    assert settled_questions(question, rank, scores, bm25, whole, (-5.0, 5.0), None, [0]) == [0]


# ----------------------------------------------------------------------------- the setting


@pytest.mark.parametrize("text, expected", [
    ("all", None), ("stop", WindowPruning()), ("stop:5", WindowPruning(high=5.0)),
    (" stop:-1.5 ", WindowPruning(high=-1.5))])
def test_parse(text, expected):
    assert WindowPruning.parse(text) == expected


@pytest.mark.parametrize("text, message", [
    ("stop:x", "H must be a number"), ("stop:inf", "H must be finite"),
    ("top:8", "expected 'all'"), ("all:3", "expected 'all'"), ("", "expected 'all'")])
def test_parse_refuses(text, message):
    with pytest.raises(WindowPruningError, match=message):
        WindowPruning.parse(text)


def test_settings_checked():
    with pytest.raises(WindowPruningError, match="stage 0"):
        WindowPruning(stage=0)
    with pytest.raises(WindowPruningError, match="mu 2"):
        WindowPruning(mu=2)
    assert WindowPruning(high=5.0).label == "stop:5" and WindowPruning().exact
    assert WindowPruning().with_mu(None).mu is None


def test_parse_setting_takes_calibrated_and_names_it_when_refusing():
    from dil_jax.open_domain.pruning import CALIBRATED, parse_setting

    assert parse_setting(" calibrated ") is CALIBRATED and CALIBRATED.label == "calibrated"
    assert parse_setting("stop:5") == WindowPruning(high=5.0)
    with pytest.raises(WindowPruningError, match="expected 'all'.*or 'calibrated'"):
        parse_setting("calibrated:3")


# ----------------------------------------------------------------------------- calibration

CALIBRATION = {"logits": 4.75, "margin": 7, "mu": 0.5, "top_p": 29,
               "calibrated_on": "593 questions", "recall": {"logits": 0.9966}}


def test_calibration_reads_back_and_covers_one_rule_mu_and_depth():
    from dil_jax.open_domain.pruning import PruningCalibration

    calibration = PruningCalibration.from_manifest({"window_pruning": CALIBRATION})
    assert calibration.highs == {"logits": 4.75, "margin": 7.0}
    assert calibration.to_json() == {**CALIBRATION, "margin": 7.0}
    assert PruningCalibration.from_manifest({"abstention": {}}) is None  # written before it
    assert calibration.high_for("margin", 0.5, 29)[0] == 7.0
    assert calibration.high_for("logits", 0.7, 29) == (
        None, "H calibrated at mu 0.5, p 29; this reads at mu 0.7, p 29")
    assert calibration.high_for("logits", 0.5, 10)[0] is None
    only = PruningCalibration.from_manifest({"window_pruning": {"logits": 5, "mu": 0.5,
                                                                 "top_p": 29}})
    assert only.high_for("margin", 0.5, 29) == (None, "no H recorded for the 'margin' rule")


@pytest.mark.parametrize("change, message", [
    ({"logits": float("nan"), "margin": None}, "'window_pruning.logits' must be a finite"),
    ({"logits": None, "margin": None}, "'window_pruning' records no H"),
    ({"mu": 2}, r"'window_pruning.mu' must be a finite number within \[0, 1\], got 2"),
    ({"top_p": 0}, "'window_pruning.top_p' must be a positive integer, got 0"),
    ({"recall": {"logits": 99.7}}, "'window_pruning.recall.logits' must be a finite number "
                                   r"within \[0, 1\]"),
    ({"recall": [0.99]}, "'window_pruning.recall' must be an object"),
    ({"calibrated_on": 3}, "'window_pruning.calibrated_on' must be a string"),
])
def test_a_bad_calibration_record_is_named(change, message):
    from dil_jax.errors import CheckpointError
    from dil_jax.open_domain.pruning import PruningCalibration

    record = {key: value for key, value in {**CALIBRATION, **change}.items()
              if value is not None}
    with pytest.raises(CheckpointError, match=f"^reader/manifest.json: {message}"):
        PruningCalibration.from_manifest({"window_pruning": record}, "reader/manifest.json")


def test_resolve_pruning_prefers_the_recorded_high_then_the_exact_stop():
    from dil_jax.open_domain.pruning import CALIBRATED, PruningCalibration, resolve_pruning

    calibration = PruningCalibration.from_manifest({"window_pruning": CALIBRATION})
    assert resolve_pruning(CALIBRATED, calibration, "margin", 0.5, 29)[0] == WindowPruning(
        high=7.0)
    for mu, top_p in ((0.4, 29), (0.5, 10)):  # not what H was calibrated at: exact
        assert resolve_pruning(CALIBRATED, calibration, "logits", mu, top_p)[0] == \
            WindowPruning(mu=mu)
    assert resolve_pruning(CALIBRATED, None, "logits", 0.5, 29) == (
        WindowPruning(), "exact: the reader records no calibrated H")
    for mu in (None, 1.0):  # no fusion: the stop reads every window anyway
        assert resolve_pruning(CALIBRATED, calibration, "logits", mu, 29)[0] is None
    # An explicit setting is taken as given, for the fusion weight of the read.
    assert resolve_pruning(WindowPruning(high=2.0), calibration, "logits", 0.3, 29)[0] == \
        WindowPruning(high=2.0, mu=0.3)
    assert resolve_pruning(None, calibration, "logits", 0.5, 29)[0] is None


def test_the_bundled_readers_record_their_calibrated_high():
    """The table of docs/open_domain.md, "Window pruning", in the bundled manifests; the plain
    k = 2 reader, whose manifest was written before the record, has none and still loads."""
    from dil_jax.defaults import bundled_reader
    from dil_jax.open_domain.pruning import calibration_of

    full, k4 = bundled_reader("full"), bundled_reader("delayed", 4)
    if full is None or k4 is None:
        pytest.skip("needs the bundled readers")
    assert calibration_of(full).highs == {"logits": 5.25, "margin": 6.75}
    assert calibration_of(k4).highs == {"logits": 4.75, "margin": 7.0}
    assert (calibration_of(k4).mu, calibration_of(k4).top_p) == (0.5, 29)
    k2_open = bundled_reader("delayed")
    assert calibration_of(k2_open).highs == {"logits": 5.75, "margin": 7.25}
    assert (calibration_of(k2_open).mu, calibration_of(k2_open).top_p) == (0.5, 29)
    assert calibration_of(full.parent / "minilm-squad-k2") is None
    assert calibration_of(None) is None


def test_record_writes_the_calibration_into_a_manifest(tmp_path, capsys):
    """benchmarks/window_pruning.py record: the values given, written atomically beside the
    manifest's other records (which stay as they were); a bad value is refused naming its
    flag, and a folder without a manifest in one line."""
    import json
    import shutil

    from dil_jax.checkpoints import MANIFEST_FILE
    from dil_jax.defaults import bundled_reader
    from dil_jax.open_domain.pruning import calibration_of

    from tests.helpers import load_script

    if bundled_reader("delayed") is None:
        pytest.skip("needs the bundled readers")
    folder = tmp_path / "reader"
    folder.mkdir()
    shutil.copy(bundled_reader("delayed") / MANIFEST_FILE, folder / MANIFEST_FILE)
    before = json.loads((folder / MANIFEST_FILE).read_text())
    script = load_script("benchmarks/window_pruning.py")
    script.main(["record", "--reader", str(folder), "--high", "logits=3.5", "--recall",
                 "logits=0.99", "--mu", "0.4", "--top-p", "10", "--calibrated-on", "a test"])
    after = json.loads((folder / MANIFEST_FILE).read_text())
    assert after["window_pruning"] == {"logits": 3.5, "mu": 0.4, "top_p": 10,
                                       "calibrated_on": "a test", "recall": {"logits": 0.99}}
    assert {key: value for key, value in after.items() if key != "window_pruning"} == \
        {key: value for key, value in before.items() if key != "window_pruning"}
    assert calibration_of(folder).high_for("logits", 0.4, 10)[0] == 3.5
    with pytest.raises(SystemExit):
        script.main(["record", "--reader", str(folder), "--high", "prob=3", "--mu", "0.5",
                     "--top-p", "29", "--calibrated-on", "x"])
    assert "argument --high: 'prob=3': RULE=VALUE with RULE one of" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="not recorded: .*'window_pruning.mu'"):
        script.main(["record", "--reader", str(folder), "--high", "logits=3", "--mu", "1.5",
                     "--top-p", "29", "--calibrated-on", "x"])
    assert json.loads((folder / MANIFEST_FILE).read_text()) == after  # left as it was
    with pytest.raises(SystemExit, match="no dil_jax_manifest.json there"):
        script.main(["record", "--reader", str(tmp_path), "--high", "logits=3", "--mu", "0.5",
                     "--top-p", "29", "--calibrated-on", "x"])


def test_with_setting_leaves_a_reader_that_cannot_prune_unpruned_under_calibrated():
    from types import SimpleNamespace

    from dil_jax.open_domain.pruning import CALIBRATED, with_setting

    def refuse(pruning):
        raise WindowPruningError("a bidaf reader does not end with a LayerNorm")

    reader = SimpleNamespace(span_score="logits", top_p=29, with_pruning=refuse)
    assert with_setting(reader, CALIBRATED, None, 0.5) == (
        reader, "a bidaf reader does not end with a LayerNorm")
    with pytest.raises(WindowPruningError, match="bidaf"):
        with_setting(reader, WindowPruning(), None, 0.5)


# ----------------------------------------------------------------------------- the reader


def test_a_reader_without_the_bound_is_refused():
    from types import SimpleNamespace

    for kind, architecture in (("qanet", "qanet"), ("encoder", "xlnet")):
        reader = SimpleNamespace(kind=kind, config=SimpleNamespace(architecture=architecture))
        with pytest.raises(WindowPruningError, match=f"a {architecture} reader does not end"):
            span_head_bounds(reader)


@pytest.fixture(scope="module")
def sample_reader(minilm_dir, tmp_path_factory):
    """The open-domain reader (k = 4, the real MiniLM with a seeded QA head) over the sample
    passages in windows of 32 tokens every 16, reading every passage."""
    import jax

    from dil_jax.open_domain.index.corpus import Document, split_documents
    from dil_jax.open_domain.index.folder import build_index, build_reader_cache
    from dil_jax.readers import load_reader
    from dil_jax.samples import SAMPLE_PASSAGES

    reader = load_reader(minilm_dir, k=4, max_question_len=16, rng=jax.random.key(3))
    documents = [Document(f"d{i}", f"T{i}", text) for i, text in enumerate(SAMPLE_PASSAGES)]
    index = build_index(tmp_path_factory.mktemp("prune") / "index",
                        split_documents(documents, "paragraphs"), reader.tokenizer,
                        max_passage_len=32, doc_stride=16, split={"strategy": "paragraphs"})
    cache = build_reader_cache(index, reader, encode=reader.passage_encoder(batch_size=4))
    return OpenDomainReader(index, reader, cache, top_p=len(index.passages), batch_size=4,
                            chunk_size=8)


def test_pruned_read_gives_the_full_reads_answer(sample_reader):
    """The exact stop over the real reader: the fused answer (text, passage, reader score)
    of every question is the full read's, from no more pairs; an assumed highest score below
    every score (stop:H) reads a BM25 prefix of each question's passages, fewer pairs; the
    pairs and tokens read are counted per question, and the decisions timed."""
    from dil_jax.open_domain.retrieval.engines import bm25_tokenize
    from dil_jax.open_domain.scoring import pick_answer

    passages = sample_reader.index.passages
    every = " ".join(bm25_tokenize(p.text)[0] for p in passages)
    # Each question retrieves every passage, one of them far ahead in BM25.
    questions = [f"{' '.join(bm25_tokenize(p.text)[1:5])} {every}?" for p in passages]
    full = sample_reader.read(questions)
    for mu in (0.5, 0.9, None):
        pruned = sample_reader.with_pruning(WindowPruning(mu=mu)).read(questions)
        assert "prune" in pruned.timings and "prune" not in full.timings
        for ours, theirs in zip(pruned.candidates, full.candidates, strict=True):
            answer, expected = pick_answer(ours, mu), pick_answer(theirs, mu)
            assert (answer.text, answer.passage_index) == (expected.text, expected.passage_index)
            assert answer.reader_score == pytest.approx(expected.reader_score, abs=1e-4)
        assert all(p <= f for p, f in zip(pruned.pairs_read, full.pairs_read, strict=True))
    low = reader_score_bounds(span_head_bounds(sample_reader.reader), "logits")[0]
    guessed = sample_reader.with_pruning(WindowPruning(high=low - 1)).read(questions)
    assert sum(guessed.pairs_read) < sum(full.pairs_read)
    for candidates in guessed.candidates:
        assert [c.rank for c in candidates] == list(range(len(candidates)))  # a BM25 prefix
    windows = sample_reader.index.windows
    assert full.pairs_read == [sum(int(windows.count[h.passage_index]) for h in hits)
                               for hits in full.hits]
    assert all(t > 0 for t in full.tokens_read)
    assert sample_reader.pruning is None  # with_pruning leaves the reader it copies alone


# ----------------------------------------------------------------------------- the commands


def test_prune_windows_of_ask_and_odqa_eval(tmp_path, capsys):
    """--prune-windows on `ask` and `odqa-eval` (each reader then evaluated without and with
    it, the pairs a question read in the table); a bad value or --server refused naming it."""
    import json

    from dil_jax.cli import main

    from tests.helpers import run_cli
    from tests.open_domain.test_odqa_cli import COMMON, _write_corpus, _write_squad

    index = tmp_path / "index"
    assert main(["index", "--out", str(index), "--corpus", _write_corpus(tmp_path), "--k", "4",
                 "--max-passage-len", "48", "--doc-stride", "24", *COMMON]) == 0
    status, out, _ = run_cli(["ask", "Who wrote Pride and Prejudice?", "--index", str(index),
                              "--k", "4", "--top-p", "3", "--prune-windows", "stop", *COMMON],
                             capsys)
    assert status == 0 and "Q: Who wrote" in out and "prune" in out
    # "calibrated": the base MiniLM (--checkpoint default) records no H: the exact stop.
    status, out, err = run_cli(["ask", "Who wrote Pride and Prejudice?", "--index", str(index),
                                "--k", "4", "--top-p", "3", "--prune-windows", "calibrated",
                                *COMMON], capsys)
    assert status == 0 and "Q: Who wrote" in out and "prune" in out
    assert "window pruning: stop for DIL k=4 (exact: the reader records no calibrated H)" \
        in err, err
    squad, _ = _write_squad(tmp_path)
    data = json.loads(squad.read_text())
    data["data"][0]["paragraphs"][0]["qas"][0]["question"] = "Who wrote Pride and Prejudice?"
    squad.write_text(json.dumps(data))  # a question BM25 finds passages for
    assert main(["odqa-eval", "--index", str(index), "--data", str(squad), "--k", "4", "--p",
                 "3", "--prune-windows", "stop:2", "--out", str(tmp_path / "eval"),
                 *COMMON]) == 0
    results = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]
    assert set(results) == {"DIL k=4", "DIL k=4 + prune stop:2"}
    pruned, full = results["DIL k=4 + prune stop:2"], results["DIL k=4"]
    assert pruned["pruning"] == "stop:2" and full["pruning"] is None
    assert 1 <= pruned["pairs_per_question"] <= full["pairs_per_question"]
    assert "| pairs / q |" in (tmp_path / "eval" / "results.md").read_text()
    for argv in (["ask", "Who?", "--index", str(index)], ["odqa-eval", "--index", str(index),
                                                          "--data", str(squad)]):
        status, _, err = run_cli([*argv, "--prune-windows", "top:8"], capsys)
        assert status == 2 and "argument --prune-windows: 'top:8': expected 'all'" in err, err
    status, _, err = run_cli(["ask", "Who?", "--server", "http://127.0.0.1:9", "--prune-windows",
                              "stop"], capsys)
    assert status == 1 and "leave out --prune-windows stop" in err, err
