"""dil_jax's own checkpoint format: converted params (orbax) beside `encoder_config.json`.

Training saves readers this way (`save_params`); `load_params` reads them back with any
reader setting (`ReaderOverrides`: another k, say) set over the stored config.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import numpy as np

from dil_jax.atomic import staged_directory
from dil_jax.checkpoints.files import DAMAGED_FIX, read_json
from dil_jax.errors import CheckpointError
from dil_jax.model.delayed import DelayedInteractionModel, Params
from dil_jax.model.encoder_config import NO_OVERRIDES, ConfigError, EncoderConfig, ReaderOverrides

ENCODER_CONFIG_FILE = "encoder_config.json"
PARAMS_DIR = "params"
# What a training run's export records beside the params: the steps, and for a SQuAD v2.0 run
# the null threshold its evaluator chose on training questions ("null_threshold").
TRAINED_FROM_FILE = "trained_from.json"


def save_params(directory: str | os.PathLike, params: Params, config: EncoderConfig) -> Path:
    """Writes converted params (orbax) and the encoder config to `directory`, atomically.

    Everything is written to a sibling temporary folder first and renamed into place, so a reader
    never sees a half-written checkpoint.
    """
    import orbax.checkpoint as ocp

    directory = Path(directory).absolute()
    if directory.exists():
        raise CheckpointError(f"{directory} already exists; refusing to overwrite it")
    with staged_directory(directory, overwrite=False) as staging:
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(staging / PARAMS_DIR, jax.tree.map(np.asarray, params))
        checkpointer.wait_until_finished()
        (staging / ENCODER_CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=2))
    return directory


def load_params(directory: str | os.PathLike, overrides: ReaderOverrides = NO_OVERRIDES
                ) -> tuple[EncoderConfig, Params]:
    """Reads what `save_params` wrote, `overrides` (another k, say) set over its config."""
    import orbax.checkpoint as ocp

    directory = Path(directory).absolute()
    config_path = directory / ENCODER_CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"{directory}: not a dil_jax checkpoint (no {ENCODER_CONFIG_FILE})")
    values = read_json(config_path, "dil_jax encoder config")
    if not isinstance(values, dict):
        raise CheckpointError(f"{config_path}: expected a JSON object of EncoderConfig fields, "
                              f"got {type(values).__name__}")
    try:
        config = overrides.config_of(values)
    except ConfigError as error:
        raise CheckpointError(f"{config_path}: {error}") from error
    abstract = jax.eval_shape(DelayedInteractionModel(config).init, jax.random.key(0))
    if not (directory / PARAMS_DIR).is_dir():
        raise CheckpointError(f"{directory / PARAMS_DIR}: missing; {DAMAGED_FIX}")
    try:
        params = ocp.StandardCheckpointer().restore(directory / PARAMS_DIR, abstract)
    except Exception as error:  # orbax/tensorstore: truncated array files, shape mismatch...
        raise CheckpointError(f"{directory / PARAMS_DIR}: cannot restore the params "
                              f"({type(error).__name__}: {str(error)[:500]}); {DAMAGED_FIX}"
                              ) from error
    return config, params
