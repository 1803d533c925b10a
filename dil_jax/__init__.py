"""dil_jax: Delayed Interaction Layers for transformer question answering in JAX/Flax.

The public names below are imported on first use (PEP 562 module `__getattr__`), not here:
`import dil_jax` is what every `dil-jax` command and `dil-jax --help` pay before anything else,
and importing jax/flax alone costs about a second on a small CPU.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> the module that defines it. Kept as strings so that nothing heavy is imported
# until a name is asked for (and so that the import graph sees no package-level cycle).
_PUBLIC = {
    "PASSAGE_SEGMENT": "dil_jax.model.span_reader",
    "QUESTION_SEGMENT": "dil_jax.model.span_reader",
    "ReaderOutput": "dil_jax.model.span_reader",
    "DelayedInteractionModel": "dil_jax.model.delayed",
    "InputError": "dil_jax.model.delayed",
    "ConfigError": "dil_jax.model.encoder_config",
    "EncoderConfig": "dil_jax.model.encoder_config",
    "ReaderOverrides": "dil_jax.model.encoder_config",
    "load_hf_checkpoint": "dil_jax.checkpoints.hf_import",
    "Reader": "dil_jax.readers.protocol",
    "load_reader": "dil_jax.readers.loading",
    "init_reader": "dil_jax.readers.encoder",
    "save_params": "dil_jax.checkpoints.orbax_io",
    "load_params": "dil_jax.checkpoints.orbax_io",
    "export_hf_checkpoint": "dil_jax.checkpoints.export",
    "bundled_reader": "dil_jax.defaults",
    "DilJaxError": "dil_jax.errors",
}

__all__ = sorted(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module_name = _PUBLIC.get(name)
    if module_name is None:
        raise AttributeError(f"module 'dil_jax' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
