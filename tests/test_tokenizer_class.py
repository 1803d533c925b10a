"""`load_tokenizer` imports the tokenizer class tokenizer_config.json names instead of going
through AutoTokenizer (whose import costs a CLI command about a second and a half): it must build
the very tokenizer AutoTokenizer(use_fast=True) builds, with the same ids and offsets, and fall
back to AutoTokenizer whenever it cannot name the class."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from dil_jax.tokenization import load_tokenizer, tokenizer_class

from tests.helpers import REPO
from tests.helpers.hf import save_fast_tokenizer

BUNDLED = REPO / "dil_jax" / "assets" / "minilm-squad-full"
TEXTS = ["The Tragedy of Hamlet, Prince of Denmark, is a tragedy by William Shakespeare.",
         "Mount Everest is Earth's highest mountain above sea level, in the Himalayas.",
         "Jupiter is the fifth planet from the Sun and the largest in the Solar System."]


def _assert_same_as_auto(folder: Path) -> None:
    ours = load_tokenizer(folder)
    auto = AutoTokenizer.from_pretrained(str(folder), use_fast=True)
    assert type(ours) is type(auto)
    question, passage = "Who wrote Hamlet, the tragedy?", TEXTS[0]
    a = ours(question, passage, return_offsets_mapping=True)
    b = auto(question, passage, return_offsets_mapping=True)
    assert a["input_ids"] == b["input_ids"]
    assert a["offset_mapping"] == b["offset_mapping"]


def test_the_bundled_readers_tokenizer_is_autotokenizers():
    _assert_same_as_auto(BUNDLED)


@pytest.mark.parametrize("arch", ["roberta", "electra"])
def test_a_trained_tokenizer_is_autotokenizers(arch, tmp_path):
    save_fast_tokenizer(arch, TEXTS * 4, 120, tmp_path)
    _assert_same_as_auto(tmp_path)


@pytest.mark.parametrize("config", [None, {}, {"tokenizer_class": "NoSuchTokenizer"},
                                    {"tokenizer_class": "not a name"}])
def test_anything_unnamed_goes_through_autotokenizer(config, tmp_path):
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert tokenizer_class(tmp_path) is AutoTokenizer


def test_a_damaged_config_goes_through_autotokenizer(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    assert tokenizer_class(tmp_path) is AutoTokenizer
