"""BiDAF's config (`BiDAFConfig`), beside the BERT family's (`model/encoder_config.py`) and
QANet's (`model/qanet_config.py`): the reader's shape, with the paper's defaults, and the run
settings a trained one may change (`RUN_SETTINGS`). The model is `model/bidaf.py`.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, ClassVar

from dil_jax.defaults import CPU_MAX_QUESTION_LEN
from dil_jax.model.encoder_config import ConfigError
from dil_jax.model.qanet_config import check_question_len, check_word_scale
from dil_jax.model.qanet_inputs import CHAR_VOCAB_SIZE, MAX_CHARS


@dataclasses.dataclass(frozen=True)
class BiDAFConfig:
    """BiDAF's shape; defaults from the paper (section 4: 100 1D filters of width 5 over 8-d
    character embeddings, hidden size d = 100, dropout 0.2) but the words (MiniLM's table)."""

    vocab_size: int = 30522
    word_dim: int = 384
    char_vocab_size: int = CHAR_VOCAB_SIZE
    max_chars: int = MAX_CHARS
    char_dim: int = 8
    char_filters: int = 100
    char_kernel: int = 5
    hidden: int = 100
    dropout: float = 0.2
    char_dropout: float = 0.2
    max_question_len: int = CPU_MAX_QUESTION_LEN  # a reading setting, as QANetConfig's
    train_word_table: bool = False  # as QANetConfig's (`model.word_table`)
    word_scale: float = 1.0  # as QANetConfig's

    # As `QANetConfig.RUN_SETTINGS`: what a trained BiDAF may be read or trained further with.
    RUN_SETTINGS: ClassVar[frozenset[str]] = frozenset({"dropout", "char_dropout",
                                                        "max_question_len"})

    def __post_init__(self) -> None:
        check_question_len(self.max_question_len)
        check_word_scale(self.word_scale)
        if not isinstance(self.train_word_table, bool):
            raise ConfigError(f"train_word_table must be true or false, got "
                              f"{self.train_word_table!r}")
        for field in dataclasses.fields(self):
            if field.name in ("train_word_table", "word_scale"):
                continue
            value = getattr(self, field.name)
            if field.name.endswith("dropout"):
                if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
                        0 <= value < 1):
                    raise ConfigError(f"{field.name} must be a rate in [0, 1), got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ConfigError(f"{field.name} must be a positive integer, got {value!r}")
        if self.char_kernel % 2 == 0:
            raise ConfigError(f"char_kernel must be odd, got {self.char_kernel}")

    # What a passage cache records of a reader (as `QANetConfig`'s): BiDAF's fixed split is its
    # contextual layer (one BiLSTM), its passage states 2 x hidden wide.
    architecture = "bidaf"
    num_lower_layers = 1
    num_layers = 4  # the contextual, the two modelling and the output BiLSTMs

    @property
    def hidden_size(self) -> int:
        return 2 * self.hidden

    def cached_state_settings(self) -> dict[str, Any]:
        """As `QANetConfig.cached_state_settings`: the word scale, when not 1."""
        return {"word_scale": self.word_scale} if self.word_scale != 1.0 else {}

    def replace(self, **changes: Any) -> BiDAFConfig:
        return dataclasses.replace(self, **changes)
