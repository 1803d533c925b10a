"""Reading the files of a Hugging Face checkpoint folder; a damaged file is named, not traced.

Weights come from `model.safetensors` (or its shards, read with `safetensors` and numpy, no
torch needed), else from `dil_jax_partial.safetensors` (a dil_jax export that leaves tensors to a
base checkpoint), else from `pytorch_model.bin` (read with torch when it is installed).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from dil_jax.errors import CheckpointError

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_FILE = "pytorch_model.bin"
# The weights of an export that leaves tensors to a base checkpoint (its manifest's `from_base`:
# the bundled readers' word embeddings). A name transformers never looks for, on purpose: under
# model.safetensors, transformers loaded such a folder with random word embeddings and one
# "MISSING" line, and answered wrongly. Now it refuses the folder (no weights file), and
# `dil-jax export --format hf` writes the complete folder transformers reads.
PARTIAL_SAFETENSORS_FILE = "dil_jax_partial.safetensors"

# The fix for any file that exists but cannot be read, appended to its error.
DAMAGED_FIX = ("it is damaged or incomplete (an interrupted download or copy?); re-download "
               "the checkpoint, or re-export it from the run that trained it")


def read_json(path: Path, what: str) -> Any:
    """A JSON file's value; invalid JSON or an unreadable file is a CheckpointError naming it."""
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{path}: not a readable {what} (not valid JSON: {error}); "
                              f"{DAMAGED_FIX}") from error


def _load_safetensors(path: Path) -> dict[str, np.ndarray]:
    """One safetensors file -> {name: array}; a truncated or corrupt file is named, not traced."""
    from safetensors.numpy import load_file

    if not path.is_file():
        raise CheckpointError(f"{path}: missing (named by {SAFETENSORS_INDEX}); re-download the "
                              "checkpoint")
    try:
        return dict(load_file(path))
    except Exception as error:  # SafetensorError, OSError, a bad dtype in the header...
        raise CheckpointError(f"{path}: cannot read the weights ({type(error).__name__}: "
                              f"{error}); {DAMAGED_FIX}") from error


def shard_names(folder: Path) -> list[str]:
    """The shard files the folder's safetensors index names, sorted, each once."""
    index_path = folder / SAFETENSORS_INDEX
    index = read_json(index_path, "safetensors index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(shard, str) for shard in weight_map.values()):
        raise CheckpointError(f"{index_path}: no 'weight_map' object of tensor name -> shard "
                              f"file; {DAMAGED_FIX}")
    return sorted(set(weight_map.values()))


def _load_sharded_safetensors(folder: Path) -> dict[str, np.ndarray]:
    """Every shard the folder's safetensors index names, merged into one {name: array}."""
    state: dict[str, np.ndarray] = {}
    for shard in shard_names(folder):
        state.update(_load_safetensors(folder / shard))
    return state


def weights_files(folder: str | os.PathLike) -> list[str]:
    """Names of the files `read_state_dict` reads the folder's weights from (same precedence):
    model.safetensors, else the safetensors index and its shards, else a partial export's
    dil_jax_partial.safetensors, else pytorch_model.bin."""
    folder = Path(folder)
    if (folder / SAFETENSORS_FILE).is_file():
        return [SAFETENSORS_FILE]
    if (folder / SAFETENSORS_INDEX).is_file():
        return [SAFETENSORS_INDEX, *shard_names(folder)]
    if (folder / PARTIAL_SAFETENSORS_FILE).is_file():
        return [PARTIAL_SAFETENSORS_FILE]
    if (folder / TORCH_FILE).is_file():
        return [TORCH_FILE]
    return []


def _load_torch(path: Path) -> dict[str, np.ndarray]:
    """A `pytorch_model.bin` state dict as float32 numpy arrays (needs torch)."""
    try:
        import torch
    except ImportError as error:
        raise CheckpointError(
            f"{path} needs torch to read; install it with "
            "`pip install 'dil_jax[torch]'` or convert the folder to safetensors") from error
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        return {name: tensor.float().numpy() for name, tensor in state.items()}
    except Exception as error:  # truncated zip, pickle error, not a state dict...
        raise CheckpointError(f"{path}: cannot read the weights "
                              f"({type(error).__name__}: {error}); {DAMAGED_FIX}") from error


def read_state_dict(folder: str | os.PathLike) -> dict[str, np.ndarray]:
    """Tensors of a Hugging Face folder: safetensors (sharded too), else a partial export's
    safetensors (the tensors it left to a base are not among them: `with_base_tensors`), else
    pytorch_model.bin.

    Returns {Hugging Face tensor name: array in the file's layout}. Raises CheckpointError
    naming the file when one is missing, truncated or corrupt.
    """
    folder = Path(folder)
    if (folder / SAFETENSORS_FILE).is_file():
        return _load_safetensors(folder / SAFETENSORS_FILE)
    if (folder / SAFETENSORS_INDEX).is_file():
        return _load_sharded_safetensors(folder)
    if (folder / PARTIAL_SAFETENSORS_FILE).is_file():
        return _load_safetensors(folder / PARTIAL_SAFETENSORS_FILE)
    if (folder / TORCH_FILE).is_file():
        return _load_torch(folder / TORCH_FILE)
    raise CheckpointError(f"{folder}: no {SAFETENSORS_FILE}, {SAFETENSORS_INDEX}, "
                          f"{PARTIAL_SAFETENSORS_FILE} or {TORCH_FILE}")
