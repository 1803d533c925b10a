"""The reader settings as typed values: `ReaderOverrides` (what a load sets over a checkpoint's
config) and the `ReaderRequest` fields that reach it."""

from __future__ import annotations

import pytest

from dil_jax.model.encoder_config import NO_OVERRIDES, EncoderConfig, ReaderOverrides
from dil_jax.readers import ReaderRequest, load_requested


def test_overrides_set_only_what_they_name():
    assert NO_OVERRIDES.fields() == {}
    overrides = ReaderOverrides(num_lower_layers=2, dtype="bfloat16")
    assert overrides.fields() == {"num_lower_layers": 2, "dtype": "bfloat16"}
    # Every field is an EncoderConfig field of the same name: `fields` is handed to it.
    config = EncoderConfig(vocab_size=10, hidden_size=8, num_layers=4, num_heads=2,
                           intermediate_size=8, embedding_size=8, max_position_embeddings=64)
    assert config.replace(**overrides.fields()).num_lower_layers == 2


def test_overrides_over_others_win_where_set():
    """A command's k over the split a manifest records; the manifest's question length stays."""
    recorded = ReaderOverrides(num_lower_layers=4, max_question_len=32)
    asked = ReaderOverrides(num_lower_layers=2)
    assert asked.over(recorded) == ReaderOverrides(num_lower_layers=2, max_question_len=32)
    assert NO_OVERRIDES.over(recorded) == recorded


@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_a_request_reads_at_its_k_question_length_and_dtype(dtype):
    reader = load_requested(ReaderRequest("default", k=2, max_question_len=16, dtype=dtype))
    config = reader.config
    assert (config.num_lower_layers, config.max_question_len) == (2, 16)
    assert config.dtype == (dtype or "float32")  # None: the checkpoint's own


def test_a_reader_not_given_is_the_bundled_one_of_its_role():
    from dil_jax.defaults import bundled_reader

    for role, k in (("full", 0), ("delayed", None)):
        request = ReaderRequest(None, k, bundled=role).resolved()
        assert request.checkpoint == str(bundled_reader(role)) and request.k == k
    assert ReaderRequest(None, 2).resolved().checkpoint == str(bundled_reader("delayed"))


def test_without_a_bundled_reader_the_embedded_one_or_a_refusal(monkeypatch, caplog):
    """One rule for every command: the raw embedded MiniLM, said loudly (a delayed one at the
    bundled delayed reader's k: it records none), or refused where it must not answer."""
    from dil_jax import defaults
    from dil_jax.errors import UsageError

    monkeypatch.setattr(defaults, "bundled_reader", lambda role, k=None: None)
    delayed = ReaderRequest(None, None, bundled="delayed",
                            checkpoint_flag="--delayed-checkpoint").resolved()
    assert (delayed.checkpoint, delayed.k) == ("default", defaults.EMBEDDED_DELAYED_K)
    assert "UNTRAINED" in caplog.text and "--delayed-checkpoint" in caplog.text
    full = ReaderRequest(None, 0, bundled="full").resolved()
    assert (full.checkpoint, full.k) == ("default", 0)
    with pytest.raises(UsageError, match="no bundled full reader in this install: give "
                                         "--full-checkpoint"):
        ReaderRequest(None, 0, bundled="full", embedded_fallback=False,
                      checkpoint_flag="--full-checkpoint").resolved()
