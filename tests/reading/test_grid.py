"""The pair grid: equals a direct per-pair forward, and is the same on 1 and 8 devices."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import REPO, subprocess_env

# A 3-block encoder, small enough for a subprocess per device count.
TINY_ENCODER = dict(vocab_size=50, hidden_size=32, num_layers=3, num_heads=4,
                    intermediate_size=40, embedding_size=32, max_question_len=8,
                    max_position_embeddings=64, initializer_range=0.2)

GRID_SCRIPT = textwrap.dedent("""
    import json
    import sys
    import jax
    import numpy as np
    from dil_jax.model.encoder_config import EncoderConfig
    from dil_jax.reading.grid import PairGrid
    from dil_jax.reading.pairs import kept_positions
    from dil_jax.model.delayed import DelayedInteractionModel

    k, out = int(sys.argv[1]), sys.argv[2]
    config = EncoderConfig(**json.loads(sys.argv[3]), num_lower_layers=k)
    model = DelayedInteractionModel(config)
    params = model.init(jax.random.key(0))
    rng = np.random.default_rng(0)
    q_ids = rng.integers(1, 50, (3, 8)).astype(np.int32)
    q_mask = (np.arange(8)[None] < np.array([[5], [8], [3]])).astype(np.int32)
    p_ids = rng.integers(1, 50, (5, 16)).astype(np.int32)
    p_mask = (np.arange(16)[None] < np.array([[16], [9], [4], [12], [16]])).astype(np.int32)
    reader = PairGrid(model, batch_size=4, chunk_size=8)
    q_lower = reader.encode_questions(params, q_ids, q_mask)
    p_source = p_ids if k == 0 else reader.encode_passages(params, p_ids, p_mask)
    grid = reader.read_grid(params, q_lower, q_mask, p_source, p_mask)
    qi, pi = (a.ravel() for a in np.meshgrid(np.arange(3), np.arange(5), indexing="ij"))
    direct = model(params, q_ids[qi], q_mask[qi], p_ids[pi], p_mask[pi])
    # Reading only some tokens of each pair (sentence prescreening), sharded the same way.
    keep = np.random.default_rng(1).random((15, 16)) < 0.5
    kept_start = np.zeros((15, 16), np.float32)
    for pairs, outputs in reader.iter_pair_chunks(params, q_lower, q_mask, p_source, p_mask,
                                                  qi, pi, kept_positions(keep, bucket=4)):
        kept_start[pairs] = np.asarray(outputs[0])[:len(pairs)]
    np.savez(out, devices=jax.device_count(), start=grid.start_logits, end=grid.end_logits,
             kept_start=kept_start,
             null_start=grid.null_start_logits, direct_start=np.asarray(direct.start_logits),
             direct_null=np.asarray(direct.null_start_logits))
""")


def _tiny_segments(seed: int, p_lens: tuple[int, ...]):
    """2 questions (5 and 8 real tokens of 8) and len(p_lens) passages of 16 token slots."""
    rng = np.random.default_rng(seed)
    q_ids = rng.integers(1, 50, (2, 8)).astype(np.int32)
    q_mask = (np.arange(8)[None] < np.array([[5], [8]])).astype(np.int32)
    p_ids = rng.integers(1, 50, (len(p_lens), 16)).astype(np.int32)
    p_mask = (np.arange(16)[None] < np.array(p_lens)[:, None]).astype(np.int32)
    return q_ids, q_mask, p_ids, p_mask


def _run(tmp_path: Path, k: int, devices: int) -> dict[str, np.ndarray]:
    script = tmp_path / "grid.py"
    script.write_text(GRID_SCRIPT)
    out = tmp_path / f"grid-{k}-{devices}.npz"
    env = subprocess_env(devices)
    subprocess.run([sys.executable, str(script), str(k), str(out),
                    json.dumps(TINY_ENCODER)], check=True, env=env,
                   cwd=REPO)
    with np.load(out) as arrays:
        return dict(arrays)


@pytest.mark.parametrize("k", [0, 2])
def test_grid_on_8_devices_equals_1_device_and_direct(tmp_path, k):
    one, eight = _run(tmp_path, k, 1), _run(tmp_path, k, 8)
    assert one["devices"] == 1 and eight["devices"] == 8
    for name in ("start", "end", "null_start", "kept_start"):
        np.testing.assert_allclose(eight[name], one[name], atol=1e-5, err_msg=name)
    assert np.isneginf(one["kept_start"]).any() and np.isfinite(one["kept_start"]).any()
    for result in (one, eight):
        np.testing.assert_allclose(result["start"].reshape(15, 16), result["direct_start"],
                                   atol=1e-5)
        np.testing.assert_allclose(result["null_start"].ravel(), result["direct_null"],
                                   atol=1e-5)


@pytest.mark.parametrize("k", [0, 2])
def test_reading_kept_tokens_equals_reading_them_alone(k):
    """Sentence prescreening reads a subset of each window's tokens: the grid's gather/scatter
    must equal reading the gathered tokens as the passage (k = 0: the full model over
    `[CLS] q [SEP] kept [SEP]`; k > 0: the cached lower states of those tokens)."""
    import jax

    from dil_jax.model.delayed import DelayedInteractionModel
    from dil_jax.model.encoder_config import EncoderConfig
    from dil_jax.model.span_reader import PASSAGE_SEGMENT, QUESTION_SEGMENT
    from dil_jax.reading.grid import PairGrid
    from dil_jax.reading.pairs import kept_positions

    config = EncoderConfig(**TINY_ENCODER, num_lower_layers=k)
    model = DelayedInteractionModel(config)
    params = model.init(jax.random.key(0))
    q_ids, q_mask, p_ids, p_mask = _tiny_segments(1, (16, 9, 12))
    q_index, p_index = np.array([0, 0, 1, 1]), np.array([0, 1, 1, 2])
    keep = np.zeros((4, 16), bool)
    keep[0, [1, 2, 3, 9, 15]] = True
    keep[1, [0, 8]] = True
    keep[2, 2:9] = True
    keep[3, [5]] = True
    positions = kept_positions(keep, bucket=4)
    assert positions.shape == (4, 8) and positions[1].tolist() == [0, 8] + [16] * 6

    reader = PairGrid(model, batch_size=2, chunk_size=2)
    q_lower = reader.encode_questions(params, q_ids, q_mask)
    p_source = reader.passage_side(params, p_ids, p_mask)
    start = np.zeros((4, 16), np.float32)
    for pairs, outputs in reader.iter_pair_chunks(params, q_lower, q_mask, p_source, p_mask,
                                                  q_index, p_index, positions):
        start[pairs] = np.asarray(outputs[0])[:len(pairs)]
    assert np.all(np.isneginf(start[~keep]))

    for pair in range(4):
        kept = np.nonzero(keep[pair])[0]
        ids = p_ids[p_index[pair], kept][None]
        mask = np.ones_like(ids)
        if k == 0:
            direct = model(params, q_ids[q_index[pair]][None], q_mask[q_index[pair]][None],
                           ids, mask).start_logits
        else:
            p_lower = model.encode_lower(params, p_ids[p_index[pair]][None],
                                         p_mask[p_index[pair]][None], PASSAGE_SEGMENT)
            q_lower_one = model.encode_lower(params, q_ids[q_index[pair]][None],
                                             q_mask[q_index[pair]][None], QUESTION_SEGMENT)
            direct = model.encode_upper(params, q_lower_one, q_mask[q_index[pair]][None],
                                        np.asarray(p_lower)[:, kept], mask).start_logits
        np.testing.assert_allclose(start[pair, kept], np.asarray(direct)[0], atol=2e-5)


def test_projections_are_hoisted_only_for_segments_read_by_several_pairs(monkeypatch):
    """The first upper block's q/k/v are computed per segment when a segment is read by
    several pairs (a grid), inside the pairs when each is read once (SQuAD windows); the
    span scores are the same either way and equal a direct per-pair forward."""
    import jax

    from dil_jax.model.delayed import DelayedInteractionModel
    from dil_jax.model.encoder_config import EncoderConfig
    from dil_jax.reading.grid import PairGrid

    model = DelayedInteractionModel(EncoderConfig(**TINY_ENCODER, num_lower_layers=2))
    params = model.init(jax.random.key(0))
    rng = np.random.default_rng(2)
    q_ids = rng.integers(1, 50, (3, 8)).astype(np.int32)
    q_mask = (np.arange(8)[None] < np.array([[5], [8], [3]])).astype(np.int32)
    p_ids = rng.integers(1, 50, (3, 16)).astype(np.int32)
    p_mask = (np.arange(16)[None] < np.array([[16], [9], [4]])).astype(np.int32)
    reader = PairGrid(model, batch_size=2, chunk_size=4)
    projected = []
    project = reader.project_segments
    monkeypatch.setattr(reader, "project_segments",
                        lambda params, lower: projected.append(lower.shape) or project(params,
                                                                                      lower))
    q_lower = reader.encode_questions(params, q_ids, q_mask)
    p_lower = reader.encode_passages(params, p_ids, p_mask)

    def read(q_index, p_index):
        start = np.zeros((len(q_index), 16), np.float32)
        for pairs, outputs in reader.iter_pair_chunks(params, q_lower, q_mask, p_lower, p_mask,
                                                      q_index, p_index):
            start[pairs] = np.asarray(outputs[0])[:len(pairs)]
        direct = model(params, q_ids[q_index], q_mask[q_index], p_ids[p_index], p_mask[p_index])
        np.testing.assert_allclose(start, np.asarray(direct.start_logits), atol=1e-5)

    grid_q, grid_p = (a.ravel() for a in np.meshgrid(np.arange(3), np.arange(3), indexing="ij"))
    read(grid_q, grid_p)  # 9 pairs, each segment read 3 times: both sides hoisted
    assert projected == [(3, 8, 32), (3, 16, 32)]
    projected.clear()
    read(np.array([0, 1, 2]), np.array([2, 0, 1]))  # each read once: projected in the pairs
    assert projected == []


def test_grid_reads_a_passage_position_offset_like_the_direct_forward():
    """A reader whose passages start at position 5: the grid (cached passage states, hoisted
    projections) reads what the direct forward reads, which test_delayed checks against the
    NumPy reference."""
    import jax

    from dil_jax.model.delayed import DelayedInteractionModel
    from dil_jax.model.encoder_config import EncoderConfig
    from dil_jax.reading.grid import PairGrid

    config = EncoderConfig(**TINY_ENCODER, num_lower_layers=2, passage_position_offset=5)
    model = DelayedInteractionModel(config)
    params = model.init(jax.random.key(0))
    q_ids, q_mask, p_ids, p_mask = _tiny_segments(0, (16, 9, 4))
    reader = PairGrid(model, batch_size=4, chunk_size=8)
    grid = reader.read_grid(params, reader.encode_questions(params, q_ids, q_mask), q_mask,
                            reader.encode_passages(params, p_ids, p_mask), p_mask)
    qi, pi = (a.ravel() for a in np.meshgrid(np.arange(2), np.arange(3), indexing="ij"))
    direct = model(params, q_ids[qi], q_mask[qi], p_ids[pi], p_mask[pi])
    np.testing.assert_allclose(np.asarray(grid.start_logits).reshape(6, 16),
                               np.asarray(direct.start_logits), atol=1e-5)
    unshifted = DelayedInteractionModel(config.replace(passage_position_offset=0))
    plain = unshifted(params, q_ids[qi], q_mask[qi], p_ids[pi], p_mask[pi])
    assert np.abs(np.asarray(plain.start_logits) - np.asarray(direct.start_logits)).max() > 1e-3


def test_chunk_size_defaults_to_the_platform_of_the_mesh():
    """No chunk size given: the platform's default (small on CPU, where this suite runs),
    rounded to the device count like a given one."""
    import jax

    from dil_jax.defaults import (
        ACCELERATOR_PAIR_CHUNK_SIZE,
        PAIR_CHUNK_SIZE,
        default_pair_chunk_size,
    )
    from dil_jax.mesh import data_mesh
    from dil_jax.model.delayed import DelayedInteractionModel
    from dil_jax.model.encoder_config import EncoderConfig
    from dil_jax.reading.grid import PairGrid

    assert default_pair_chunk_size("cpu") == PAIR_CHUNK_SIZE["cpu"]
    assert default_pair_chunk_size("tpu") == default_pair_chunk_size("gpu") \
        == ACCELERATOR_PAIR_CHUNK_SIZE
    model = DelayedInteractionModel(EncoderConfig(**TINY_ENCODER, num_lower_layers=1))
    assert jax.devices()[0].platform == "cpu"
    assert PairGrid(model, data_mesh(jax.devices()[:1])).chunk_size == PAIR_CHUNK_SIZE["cpu"]
    assert PairGrid(model, data_mesh(jax.devices()[:1]), chunk_size=5).chunk_size == 5
