"""`CharPairGrid`: QANet / BiDAF read as delayed readers (questions and distinct passages once
through `encode_lower`, every pair through `encode_upper`, in fixed-size chunks on a mesh).

The reference is the whole reader on aligned pairs (`QANetModel.__call__`, both segments in one
apply: tested against a NumPy reference in tests/model/test_qanet.py). Chunks cut to their real
tokens and a reader compiled at another batch shape round differently, so the tolerance is the
model tests' float32 bound for a whole reader, relative to the largest real logit.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from dil_jax.model.bidaf import BiDAFModel
from dil_jax.model.bidaf_config import BiDAFConfig
from dil_jax.model.char_reader import CharModel, char_model
from dil_jax.model.delayed import InputError
from dil_jax.model.qanet_inputs import QANetSegment
from dil_jax.reading.char_grid import CharPairGrid

from tests.helpers import REPO, subprocess_env
from tests.helpers.qanet import perturb, segment, tiny_config, tiny_variables

# A whole tiny reader's logits against the same reader compiled at another shape: float32
# rounding (2^-24 per op) over a few hundred ops of O(1) values stays far below this.
RTOL = 1e-4

# 3 questions (real lengths 7, 3, 5 of 7 slots) x 4 passages (12, 5, 9, 12 of 12 slots).
Q_PADS, P_PADS = (0, 4, 2), (0, 7, 3, 0)


def _bidaf_reader():
    config = BiDAFConfig(vocab_size=40, word_dim=12, max_chars=6, char_dim=4, char_filters=6,
                         char_kernel=3, hidden=8, dropout=0.0, char_dropout=0.0)
    model = BiDAFModel(config)
    variables = model.init(jax.random.key(3))
    return config, {"params": perturb(variables["params"], 7), "frozen": variables["frozen"]}


def _reader(kind: str, **changes):
    if kind == "bidaf":
        config, variables = _bidaf_reader()
    else:
        config = tiny_config(**changes)
        variables = tiny_variables(config)
    return char_model(config), variables


def _whole_pairs(model: CharModel, variables, question: QANetSegment,
                 passage: QANetSegment, q_index: np.ndarray, p_index: np.ndarray):
    """The reference: every pair through the whole reader (one apply per batch)."""
    def rows(seg, index):
        return QANetSegment(seg.ids[index], seg.chars[index], seg.mask[index])

    out = model(variables, rows(question, q_index), rows(passage, p_index))
    return np.asarray(out.start_logits), np.asarray(out.end_logits)


@pytest.mark.parametrize("kind", ["qanet", "bidaf"])
@pytest.mark.parametrize("trim", [True, False])
def test_grid_reads_every_pair_as_the_whole_reader(kind, trim):
    model, variables = _reader(kind)
    config = model.config
    question = segment(1, 3, 7, Q_PADS, config)
    passage = segment(2, 4, 12, P_PADS, config)
    # Chunks of 5 over 12 pairs: three chunks, the last one padded; batches of 2 over 3 / 4
    # segments: the last question batch padded.
    grid = CharPairGrid(model, batch_size=2, chunk_size=5, trim_padding=trim)
    assert grid.trim_padding is trim
    q_state = grid.encode_questions(variables, question)
    p_state = grid.encode_passages(variables, passage)
    assert q_state.shape == (3, 7, grid_width(model)) and p_state.shape[:2] == (4, 12)
    scores = grid.read_grid(variables, q_state, question.mask, p_state, passage.mask)
    q_index, p_index = (a.ravel() for a in np.meshgrid(np.arange(3), np.arange(4),
                                                       indexing="ij"))
    start, end = _whole_pairs(model, variables, question, passage, q_index, p_index)
    real = passage.mask[p_index] > 0
    scale = np.abs(start[real]).max()
    for got, want in ((scores.start_logits.reshape(12, 12), start),
                      (scores.end_logits.reshape(12, 12), end)):
        np.testing.assert_allclose(got[real], want[real], rtol=0, atol=RTOL * scale)
        # Padding (cut off by trimming, or masked) never becomes a span.
        assert (got[~real] < -1e8).all()
    assert not np.isnan(scores.start_logits).any()


def grid_width(model: CharModel) -> int:
    return getattr(model.config, "d_model", None) or 2 * model.config.hidden


def test_a_listed_subset_of_pairs_comes_back_in_list_order():
    model, variables = _reader("qanet")
    config = model.config
    question = segment(1, 3, 7, Q_PADS, config)
    passage = segment(2, 4, 12, P_PADS, config)
    grid = CharPairGrid(model, batch_size=4, chunk_size=2)
    q_state = grid.encode_questions(variables, question)
    p_state = grid.encode_passages(variables, passage)
    q_index, p_index = np.array([2, 0, 2, 1, 0]), np.array([1, 3, 1, 0, 2])
    scores = grid.read_pairs(variables, q_state, question.mask, p_state, passage.mask, q_index,
                             p_index)
    start, _ = _whole_pairs(model, variables, question, passage, q_index, p_index)
    real = passage.mask[p_index] > 0
    np.testing.assert_allclose(scores.start_logits[real], start[real], rtol=0,
                               atol=RTOL * np.abs(start[real]).max())
    # The same pair listed twice reads the same.
    np.testing.assert_array_equal(scores.start_logits[0], scores.start_logits[2])
    # Called as a PairGrid is called: what only that grid reads (kept tokens, hoisted
    # first-upper-block arrays) is refused, not silently dropped.
    with pytest.raises(InputError, match="whole windows with nothing hoisted"):
        grid.read_pairs(variables, q_state, question.mask, p_state, passage.mask, q_index,
                        p_index, positions=np.zeros((5, 4), np.int32))


def test_lsh_in_the_model_encoder_reads_whole_windows():
    """LSH buckets follow the sequence length: cutting a chunk to its real tokens would change
    the answer, so the grid does not (the embedding encoder's LSH does not matter: its states
    are computed at the stored width)."""
    model, _ = _reader("qanet", lsh_encoders=("model",), lsh_bucket_size=4)
    assert CharPairGrid(model, trim_padding=True).trim_padding is False
    model, _ = _reader("qanet", lsh_encoders=("embedding",), lsh_bucket_size=4)
    assert CharPairGrid(model, trim_padding=True).trim_padding is True


GRID_SCRIPT = """
import sys
import numpy as np
from dil_jax.model.char_reader import char_model
from dil_jax.reading.char_grid import CharPairGrid
from tests.helpers.qanet import segment, tiny_config, tiny_variables

config = tiny_config()
model, variables = char_model(config), tiny_variables(config)
question = segment(1, 3, 7, (0, 4, 2), config)
passage = segment(2, 4, 12, (0, 7, 3, 0), config)
grid = CharPairGrid(model, batch_size=2, chunk_size=6)
q_state = grid.encode_questions(variables, question)
p_state = grid.encode_passages(variables, passage)
scores = grid.read_grid(variables, q_state, question.mask, p_state, passage.mask)
import jax
np.savez(sys.argv[1], devices=jax.device_count(), start=scores.start_logits,
         chunk=grid.chunk_size)
"""


def test_the_grid_splits_chunks_over_every_device(tmp_path: Path):
    """4 forced host devices: batches and chunks rounded up to a multiple of 4, each device
    reading its slice; the scores are the one-device grid's."""
    script = tmp_path / "char_grid.py"
    script.write_text(GRID_SCRIPT)
    results = {}
    for devices in (1, 4):
        out = tmp_path / f"grid-{devices}.npz"
        env = subprocess_env(devices, PYTHONPATH=str(REPO))
        subprocess.run([sys.executable, str(script), str(out)], check=True, env=env, cwd=REPO)
        with np.load(out) as arrays:
            results[devices] = dict(arrays)
    assert int(results[4]["devices"]) == 4 and int(results[4]["chunk"]) == 8
    real = np.broadcast_to(segment(2, 4, 12, P_PADS, tiny_config()).mask[None] > 0,
                           (3, 4, 12))
    one, four = results[1]["start"], results[4]["start"]
    np.testing.assert_allclose(four[real], one[real], rtol=0,
                               atol=RTOL * np.abs(one[real]).max())
