"""Where a checkpoint name points: the embedded default, a local folder, or a hub id.

Both the checkpoint readers (`dil_jax.checkpoints`) and the tokenizer loader
(`dil_jax.tokenization`) take names in these three forms, so the resolution lives here, below
both: neither has to import the other to find a folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from dil_jax.defaults import default_checkpoint_dir
from dil_jax.errors import CheckpointError

# A Hugging Face hub id: "name" or "owner/name" (letters, digits, '_', '.', '-').
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
# What is fetched from the hub: configs, weights and tokenizer files (never torch pickles).
_HUB_PATTERNS = ["config.json", "*.safetensors", "*.json", "*.txt", "*.model"]


def resolve_checkpoint(name_or_path: str | os.PathLike) -> Path:
    """A local folder, the embedded default ("default"), or a hub id fetched when online.

    Raises CheckpointError when the name is a file, a missing path, or a hub id that cannot be
    fetched (both readings of the name are given).
    """
    name = str(name_or_path)
    if name in ("default", "minilm"):
        return default_checkpoint_dir()
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"checkpoint {name!r} is a file; expected a folder with "
                              "config.json and model.safetensors")
    is_hub_id = _HUB_ID.fullmatch(name) is not None
    if not is_hub_id or name.startswith((".", "/", "~")):
        raise CheckpointError(f"checkpoint folder not found: {name!r}")
    try:
        from huggingface_hub import snapshot_download
        fetched = snapshot_download(name, allow_patterns=_HUB_PATTERNS)
    except Exception as error:  # offline, unknown id, ...: say both readings of the name
        raise CheckpointError(
            f"checkpoint {name!r}: no such local folder, and fetching it from the Hugging Face hub "
            f"failed ({type(error).__name__}: {error})") from error
    return Path(fetched)
