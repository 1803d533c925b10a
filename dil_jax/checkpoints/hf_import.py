"""Reading a Hugging Face checkpoint folder (local, "default" or a hub id) into Flax params.

The folder's `config.json` gives the EncoderConfig (`hf_config`), its weights file the tensors
(`files`), `name_map` turns them into params (`hf_tensors`), and a dil_jax manifest, when there
is one, adds the reader split it was exported with and tensors it left to a base checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

from dil_jax.checkpoints.files import CONFIG_FILE, read_state_dict
from dil_jax.checkpoints.hf_config import encoder_config_from_hf
from dil_jax.checkpoints.hf_tensors import ImportReport, convert_state_dict, strip_backbone_prefix
from dil_jax.checkpoints.integrity import check_weights
from dil_jax.checkpoints.manifest import MANIFEST_FILE
from dil_jax.checkpoints.resolved import HF_FORMAT, ResolvedCheckpoint
from dil_jax.errors import CheckpointError
from dil_jax.hub import resolve_checkpoint
from dil_jax.model.delayed import Params
from dil_jax.model.encoder_config import NO_OVERRIDES, EncoderConfig, ReaderOverrides

# One logger for the whole package: its warnings are silenced by that name
# (prescreening.prescreener).
log = logging.getLogger(__package__)


def load_hf_checkpoint(name_or_path: str | os.PathLike,
                       overrides: ReaderOverrides = NO_OVERRIDES, *,
                       rng: jax.Array | None = None
                       ) -> tuple[EncoderConfig, Params, ImportReport]:
    """Reads a Hugging Face checkpoint (a folder, "default" or a hub id) into (config, params,
    report); `load_hf_folder` of it, resolved here."""
    name = str(name_or_path)
    checkpoint = ResolvedCheckpoint(name, resolve_checkpoint(name), HF_FORMAT)
    return load_hf_folder(checkpoint, overrides, rng=rng)


def load_hf_folder(checkpoint: ResolvedCheckpoint, overrides: ReaderOverrides = NO_OVERRIDES,
                   *, rng: jax.Array | None = None
                   ) -> tuple[EncoderConfig, Params, ImportReport]:
    """Reads a resolved Hugging Face checkpoint into (config, params, report).

    The weights files must match the digests the folder's manifest records, if it records any
    (`integrity.check_weights`), and every tensor must be finite (`convert_state_dict`): a
    damaged file is a CheckpointError naming it, never a reader that answers worse.

    `overrides` set reader fields the checkpoint does not hold, e.g.
    `ReaderOverrides(num_lower_layers=4, max_question_len=64, dtype="bfloat16")`.
    """
    folder = checkpoint.folder
    config_path = folder / CONFIG_FILE
    hf_config = _read_hf_config(folder)
    # A reader exported by dil_jax records the split it was trained for; overrides still win.
    config = encoder_config_from_hf(hf_config, str(config_path),
                                    overrides.over(checkpoint.manifest.reader_defaults))
    recorded = checkpoint.manifest.weights
    if recorded:  # an export's digests: the bytes must be the exported ones (~1.5% of a load)
        check_weights(folder, recorded, folder / MANIFEST_FILE)
    state = with_base_tensors(checkpoint, read_state_dict(folder), config.architecture)
    params, report = convert_state_dict(state, config, rng, source=str(folder))
    for line in report.summary().splitlines()[1:]:
        log.warning(line)
    return config, params, report


def _read_hf_config(folder: Path) -> dict[str, Any]:
    """The folder's `config.json` as a dict; CheckpointError if it is missing or not an object."""
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"{folder}: no {CONFIG_FILE}")
    try:
        hf_config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{config_path}: not valid JSON ({error})") from error
    if not isinstance(hf_config, dict):
        raise CheckpointError(f"{config_path}: expected a JSON object of model settings, got "
                              f"{type(hf_config).__name__}")
    return hf_config


def with_base_tensors(checkpoint: ResolvedCheckpoint, state: dict[str, np.ndarray],
                      architecture: str) -> dict[str, np.ndarray]:
    """Fills in tensors a folder deliberately left out, from the base checkpoint its manifest
    names (`{"base_checkpoint": "default", "from_base": [tensor names]}`); both name the
    backbone's tensors as `architecture` does (a reader and its base share it).

    A fine-tuned reader whose word embeddings were frozen ships without them: they are the base
    model's, bit for bit, and installing the base package already puts them on disk.
    """
    manifest_path = checkpoint.folder / MANIFEST_FILE
    names = checkpoint.manifest.from_base
    if not names:
        return state
    base_name = checkpoint.manifest.base_checkpoint
    base_state = read_state_dict(resolve_checkpoint(base_name))
    base = {strip_backbone_prefix(name, architecture): value
            for name, value in base_state.items()}
    merged = dict(state)
    for name in names:
        key = strip_backbone_prefix(name, architecture)
        if key not in base:
            raise CheckpointError(f"{manifest_path}: tensor {name!r} is to come from base "
                                  f"{base_name!r}, which has no {key!r}")
        merged[name] = base[key]
    return merged
