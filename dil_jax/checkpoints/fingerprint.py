"""Short content hashes: of a model's params, and of any byte chunks.

Caches and saved artefacts record the fingerprint of the weights they were computed with
(`odqa.cache`: a passage index; `sep.prescreener`: its sentence encoder) and refuse to mix
with other weights.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
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
