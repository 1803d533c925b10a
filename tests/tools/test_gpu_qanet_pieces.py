"""tools/gpu_qanet_squad.py: a QANet export packed on the device and unpacked here is the same
reader. A trained word table travels among the params (no base table is read back for it)."""

from __future__ import annotations

import jax
import numpy as np

from dil_jax.checkpoints.char_readers import save_char_reader
from dil_jax.readers import load_reader

from tests.helpers import load_script
from tests.helpers.qanet import tiny_config, tiny_variables


def test_a_trained_word_table_round_trips_through_the_pieces(tmp_path):
    tool = load_script("tools/gpu_qanet_squad.py")
    config = tiny_config(train_word_table=True)
    variables = tiny_variables(config)
    assert "word_table" in variables["params"] and "frozen" not in variables
    export = save_char_reader(tmp_path / "device" / "params", variables, config)
    (tmp_path / "out").mkdir()
    pieces = tool.pack_char_reader(export, tmp_path / "out", "qanet_scratch")
    unpacked = tool.unpack_char_reader(pieces[0], tmp_path / "here" / "params", base=None)
    reader = load_reader(unpacked, kind="qanet", with_tokenizer=False)
    assert reader.config == config and set(reader.params) == {"params"}
    for got, want in zip(jax.tree.leaves(reader.params), jax.tree.leaves(variables),
                         strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
