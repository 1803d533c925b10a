"""One `Reader` protocol, two families: the families are told apart in their own modules only.

The BERT family (`readers/encoder.py`) and QANet / BiDAF (`readers/char.py`) each implement the
protocol once; everything else asks a reader (its methods, its capabilities), never which
family it is. These tests keep it so: no family check anywhere else in the package, a registry
entry for every model kind a manifest records, and every method of the protocol implemented by
both families.
"""

from __future__ import annotations

import inspect
import re

import pytest

from dil_jax.model.char_reader import READER_KINDS
from dil_jax.readers import (
    READER_FAMILIES,
    CharReader,
    EncoderReader,
    Reader,
    ReaderCapabilities,
    TokenRows,
    reader_family,
)
from dil_jax.readers.protocol import FixedSplitError

from tests.helpers import REPO

# The protocol's two implementations: the only modules that may know which family is which.
IMPLEMENTATIONS = {"dil_jax/readers/encoder.py", "dil_jax/readers/char.py"}
# What telling the families apart by hand looked like (64 times in 19 modules before the
# protocol), and asking a reader's class instead of the reader.
FAMILY_CHECKS = re.compile(r"is_char_reader|CharReaderModel|isinstance\([^)]*"
                           r"(EncoderReader|CharReader)\b")


def family_checks() -> list[str]:
    """`path:line: text` of each family check in dil_jax outside the two implementations."""
    found = []
    for path in sorted((REPO / "dil_jax").rglob("*.py")):
        relative = str(path.relative_to(REPO))
        if relative in IMPLEMENTATIONS:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if FAMILY_CHECKS.search(line):
                found.append(f"{relative}:{number}: {line.strip()}")
    return found


def test_no_module_outside_the_two_implementations_tells_the_families_apart():
    assert family_checks() == []


def test_the_check_would_see_a_family_test():
    assert FAMILY_CHECKS.search("if reader.is_char_reader:")
    assert FAMILY_CHECKS.search("isinstance(model, CharReaderModel)")
    assert FAMILY_CHECKS.search("isinstance(reader, (EncoderReader, Foo))")
    assert not FAMILY_CHECKS.search("if not reader.capabilities.null_score:")


def test_every_model_kind_has_its_family():
    assert set(READER_FAMILIES) == set(READER_KINDS)
    assert reader_family("encoder") is EncoderReader
    assert reader_family("qanet") is reader_family("bidaf") is CharReader
    with pytest.raises(Exception, match="model kind 'gpt'"):
        reader_family("gpt")


@pytest.mark.parametrize("family", [EncoderReader, CharReader])
def test_each_family_implements_the_whole_protocol(family):
    """Nothing abstract is left (the class can be made), and each method keeps the protocol's
    parameters, so a call site written against `Reader` works for both."""
    assert not inspect.isabstract(family)
    assert isinstance(family.capabilities, ReaderCapabilities)
    for name, member in vars(Reader).items():
        if not getattr(member, "__isabstractmethod__", False) or isinstance(member, property):
            continue
        wanted = list(inspect.signature(getattr(Reader, name)).parameters)
        got = list(inspect.signature(getattr(family, name)).parameters)
        assert got[:len(wanted)] == wanted, (family.__name__, name)


def test_the_families_differ_where_their_capabilities_say():
    bert, char = EncoderReader.capabilities, CharReader.capabilities
    assert bert.null_score and bert.prescreening and bert.chosen_k and bert.pair_reuse
    assert bert.hugging_face_export and not bert.reads_characters
    assert not (char.null_score or char.prescreening or char.chosen_k or char.pair_reuse
                or char.hugging_face_export)
    assert char.reads_characters


def test_token_rows_take_pad_and_join():
    import numpy as np

    rows = TokenRows(np.arange(6).reshape(3, 2), np.ones((3, 2), np.int32))
    picked = rows.take(np.array([2, 0]), 4)
    assert picked.ids.tolist() == [[4, 5], [0, 1], [0, 0], [0, 0]] and picked.chars is None
    chars = TokenRows(rows.ids, rows.mask, np.ones((3, 2, 5), np.uint16))
    joined = TokenRows.join([chars, chars.take(slice(0, 1), 1)])
    assert len(joined) == 4 and joined.chars.shape == (4, 2, 5)


def test_a_fixed_split_names_its_reader_and_split():
    error = FixedSplitError("runs/qanet/params", "qanet", 1, "embedding encoder", 3)
    assert (error.kind, error.split, error.k) == ("qanet", 1, 3)
    assert "runs/qanet/params: a qanet reader's split is fixed" in str(error)
