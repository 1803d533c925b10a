"""Content hashes: of a model's params, of any byte chunks, and of a file.

Caches and saved artefacts record the fingerprint of the weights they were computed with
(`open_domain.cache`: a passage cache; `prescreening.prescreener`: its sentence encoder) and
refuse to mix with other weights.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np


def short_sha256(chunks: Sequence[bytes]) -> str:
    """The first 16 hex digits of the SHA-256 of the chunks, concatenated."""
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()[:16]


def params_fingerprint(params: Any) -> str:
    """Hash of every param's path, shape and float32 bytes (the same weights hash the same)."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    chunks = []
    for path, leaf in sorted(leaves, key=lambda item: jax.tree_util.keystr(item[0])):
        value = np.ascontiguousarray(np.asarray(leaf, dtype=np.float32))
        chunks += [jax.tree_util.keystr(path).encode(), str(value.shape).encode(),
                   value.tobytes()]
    return short_sha256(chunks)


def file_digest(path: str | os.PathLike) -> dict[str, Any]:
    """{"bytes": size, "sha256": full hex digest} of a file, read in 1 MiB blocks.

    The full digest, not `short_sha256`'s 16 digits: it is the record a user compares with
    `sha256sum`, and it names the bytes a reader's answers depend on.
    """
    digest = hashlib.sha256()
    size = 0
    with Path(path).open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return {"bytes": size, "sha256": digest.hexdigest()}
