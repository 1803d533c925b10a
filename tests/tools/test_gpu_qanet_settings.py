"""tools/gpu_qanet_squad.py --set: config overrides of one reader or of all, checked by name."""

from __future__ import annotations

import pytest

from tests.helpers import load_script


def test_set_targets_one_reader_or_all_and_keeps_colons_in_values():
    tool = load_script("tools/gpu_qanet_squad.py")
    settings = tool.config_settings(
        ["qanet:model.reader.word_scale=18", "optim.learning_rate=5e-4",
         "data.squad_file=/a:b/train.json"], ["qanet", "bidaf"])
    assert settings == {
        "qanet": ["--config.model.reader.word_scale=18", "--config.optim.learning_rate=5e-4",
                  "--config.data.squad_file=/a:b/train.json"],
        "bidaf": ["--config.optim.learning_rate=5e-4", "--config.data.squad_file=/a:b/train.json"]}


@pytest.mark.parametrize("value,message", [
    ("model.reader.word_scale", "want [READER:]KEY=VALUE"),
    ("qanet:=3", "want [READER:]KEY=VALUE"),
    ("--config.x=1", "want [READER:]KEY=VALUE"),
    ("qanet_lsh:model.reader.word_scale=18", "qanet_lsh is not one of --readers (qanet, bidaf)"),
])
def test_malformed_settings_are_named(value, message):
    tool = load_script("tools/gpu_qanet_squad.py")
    with pytest.raises(SystemExit, match=message.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)")):
        tool.config_settings([value], ["qanet", "bidaf"])
