"""tools/train_state_pieces.py: a character reader's training checkpoint, packed without its frozen
word table and unpacked over another machine's table, restores into the trainer's `TrainState`
leaf for leaf (the reference: the state that was saved), empty optimizer states included."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from safetensors.numpy import save_file

from dil_jax.model.qanet_inputs import WORD_TABLE_TENSOR
from dil_jax.train.checkpointing import TrainCheckpointer, abstract_like
from dil_jax.train.step import TrainState

from tests.helpers import load_script

TABLE = np.arange(24, dtype=np.float32).reshape(6, 4) / 7.0


def _state() -> TrainState:
    """A state shaped as a character reader's: trained params and the frozen table in one params
    tree, Adam over the one, nothing over the other (optax's empty state), a step."""
    rng = np.random.default_rng(0)
    params = {"params": {"dense": {"kernel": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
                                   "bias": jnp.asarray(rng.normal(size=(3,)), jnp.float32)}},
              "frozen": {"word_table": jnp.asarray(TABLE)}}
    labels = {"params": {"dense": {"kernel": "trained", "bias": "trained"}},
              "frozen": {"word_table": "frozen"}}
    tx = optax.multi_transform({"trained": optax.adamw(1e-2), "frozen": optax.set_to_zero()},
                               labels)
    opt_state = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    for _ in range(3):  # moments that are not their initial zeros
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    return TrainState(step=jnp.asarray(3, jnp.int32), params=params, opt_state=opt_state)


def test_a_training_state_round_trips_without_its_word_table(tmp_path):
    tool = load_script("tools/train_state_pieces.py")
    state = _state()
    meta = {"step": 3, "epoch": 0, "position_in_epoch": 3, "rng_key": [0, 7]}
    saver = TrainCheckpointer(tmp_path / "run" / "checkpoints", every_steps=1, async_save=False)
    saver.save(3, state, meta, force=True)
    saver.close()
    (tmp_path / "run" / "config.json").write_text("{}")
    (tmp_path / "out").mkdir()
    pieces = tool.pack(tmp_path / "run", tmp_path / "out", "run")
    assert pieces and all(p.name.startswith("run.tar.xz.") for p in pieces)
    members = load_script("tools/reader_pieces.py").read_pieces(tmp_path / "out", "run")
    with np.load(io.BytesIO(members[tool.STATE_MEMBER])) as stored:
        assert tool.TABLE_KEY not in stored.files  # the table stays behind

    base = tmp_path / "base"
    base.mkdir()
    save_file({WORD_TABLE_TENSOR: TABLE}, str(base / "model.safetensors"))
    assert tool.unpack(tmp_path / "out", "run", tmp_path / "there", str(base)) == 3

    # A second unpack over the same step is refused, the checkpoint left as it was.
    with pytest.raises(SystemExit, match="checkpoints/3 exists already"):
        tool.unpack(tmp_path / "out", "run", tmp_path / "there", str(base))

    loader = TrainCheckpointer(tmp_path / "there" / "checkpoints", every_steps=1)
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    restored, restored_meta = loader.restore(3, abstract_like(state, sharding))
    loader.close()
    assert restored_meta == meta
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(state), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_state_without_a_frozen_table_is_refused(tmp_path):
    tool = load_script("tools/train_state_pieces.py")
    state = _state()
    state = TrainState(step=state.step, params={"params": state.params["params"]},
                       opt_state=())
    saver = TrainCheckpointer(tmp_path / "run" / "checkpoints", every_steps=1, async_save=False)
    saver.save(3, state, {"step": 3}, force=True)
    saver.close()
    (tmp_path / "run" / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match="not a character reader's run with a frozen table"):
        tool.pack(tmp_path / "run", tmp_path, "run")
