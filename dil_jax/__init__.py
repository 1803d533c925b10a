"""dil_jax: Delayed Interaction Layers for transformer question answering in JAX/Flax."""

from dil_jax.config import ConfigError, EncoderConfig
from dil_jax.model.delayed import DelayedInteractionModel, InputError
from dil_jax.model.modules import PASSAGE_SEGMENT, QUESTION_SEGMENT, ReaderOutput

__all__ = [
    "PASSAGE_SEGMENT",
    "QUESTION_SEGMENT",
    "ConfigError",
    "DelayedInteractionModel",
    "EncoderConfig",
    "InputError",
    "ReaderOutput",
]
__version__ = "0.1.0"
