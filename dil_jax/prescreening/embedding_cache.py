"""Sentence embeddings cached on disk, written in chunks as they are computed, so a run that is
stopped resumes where it was and a second run (another prescreener config) embeds nothing.

    embed = encoder_cache(Path("runs/prescreen-embeddings"), encoder, max_len=64)
    vectors = embed(texts, "sentences")   # [len(texts), D] float32, as sentence_embeddings

Why: the complete SQuAD training set is ~92k sentences and 87.6k questions; on a loaded 2-core CPU
embedding them takes about an hour, longer than training the prescreener on them.

Each distinct text is embedded once. A list of texts is keyed by the encoder's weight
fingerprint, the token limit and the texts themselves (SHA-256), so a cache entry can never be
read for other weights or other texts. Layout in the folder: `KEY.npy` (the complete [n, D]
array) and `KEY.json` (what it is), or, while being computed, `KEY.parts/NNNNN.npy`, one per
chunk of `chunk_size` texts (each written atomically; the chunks are a fixed partition of the
list, so a resumed run computes exactly the same array).
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dil_jax.atomic import write_atomic
from dil_jax.errors import InputFileError

if TYPE_CHECKING:
    from dil_jax.readers.protocol import Reader

log = logging.getLogger(__name__)

CACHE_FORMAT = "dil_jax.sentence_embeddings/1"


def texts_key(fingerprint: str, max_len: int, texts: Sequence[str]) -> str:
    """24 hex digits naming (encoder weights, token limit, the exact list of texts)."""
    digest = hashlib.sha256(f"{CACHE_FORMAT}\n{fingerprint}\n{max_len}\n{len(texts)}\n".encode())
    for text in texts:
        encoded = text.encode("utf-8")
        # The length first: texts holding newlines cannot make two lists hash alike.
        digest.update(f"{len(encoded)}:".encode())
        digest.update(encoded)
    return digest.hexdigest()[:24]


def unique_texts(texts: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """(distinct texts in first-seen order, [len(texts)] index of each text among them): a
    repeated question or sentence is embedded once."""
    first: dict[str, int] = {}
    inverse = np.fromiter((first.setdefault(text, len(first)) for text in texts), np.int64,
                          count=len(texts))
    return list(first), inverse


def _save_npy(path: Path, array: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.save(buffer, array)
    write_atomic(path, buffer.getvalue())


def _load_npy(path: Path, rows: int, what: str) -> np.ndarray:
    """The float32 [rows, D] array at `path`; a damaged or mismatched file is an InputFileError
    naming it (the key makes a mismatch impossible unless the file was altered)."""
    try:
        array = np.load(path)
    except (OSError, ValueError) as error:
        raise InputFileError(f"{path}: unreadable cached embeddings ({error}); delete it and "
                             "rerun to recompute") from error
    if array.ndim != 2 or len(array) != rows or array.dtype != np.float32:
        raise InputFileError(f"{path}: cached {what} of shape {array.shape} {array.dtype}, "
                             f"expected {rows} float32 rows; delete it and rerun to recompute")
    return array


@dataclasses.dataclass
class EmbeddingCache:
    """A callable (texts, what) -> [n, D] float32 vectors of `compute` (see the module
    docstring); `folder=None` computes without caching. `what` ("sentences") names the texts in
    the log. `encoder_cache` makes one for a sentence encoder."""

    folder: Path | None
    compute: Callable[[Sequence[str]], np.ndarray]
    fingerprint: str  # of the encoder's weights ("" when not caching)
    max_len: int  # tokens per text
    dim: int
    chunk_size: int = 4096

    def __call__(self, texts: Sequence[str], what: str = "texts") -> np.ndarray:
        distinct, inverse = unique_texts(texts)
        if self.folder is None:
            vectors = self.compute(distinct) if distinct else None
        else:
            vectors = self._cached(distinct, what) if distinct else None
        if vectors is None:
            return np.zeros((0, self.dim), np.float32)
        return vectors[inverse]

    def _cached(self, texts: list[str], what: str) -> np.ndarray:
        key = texts_key(self.fingerprint, self.max_len, texts)
        done = self.folder / f"{key}.npy"
        if done.is_file():
            log.info("%s: %d %s from the cache", done, len(texts), what)
            return _load_npy(done, len(texts), what)
        parts = self.folder / f"{key}.parts"
        parts.mkdir(parents=True, exist_ok=True)
        chunks, started, computed = [], time.perf_counter(), 0
        for number, first in enumerate(range(0, len(texts), self.chunk_size)):
            chunk = texts[first:first + self.chunk_size]
            path = parts / f"{number:05d}.npy"
            if path.is_file():
                chunks.append(_load_npy(path, len(chunk), what))
                continue
            chunks.append(self.compute(chunk))
            _save_npy(path, chunks[-1])
            computed += len(chunk)
            log.info("embedded %d / %d %s (%.0f s this run)", first + len(chunk), len(texts),
                     what, time.perf_counter() - started)
        vectors = np.concatenate(chunks)
        _save_npy(done, vectors)
        write_atomic(self.folder / f"{key}.json", json.dumps(dict(
            format=CACHE_FORMAT, what=what, texts=len(texts), dim=int(vectors.shape[1]),
            encoder_fingerprint=self.fingerprint, max_len=self.max_len, computed_this_run=computed,
            seconds_this_run=time.perf_counter() - started), indent=2))
        shutil.rmtree(parts)
        return vectors


def encoder_cache(folder: Path | None, encoder: Reader, max_len: int = 64,
                  chunk_size: int = 4096) -> EmbeddingCache:
    """The EmbeddingCache of a sentence encoder's vectors (`sentence_embeddings`), keyed by
    its weights' fingerprint (computed only when caching) and the token limit."""
    from dil_jax.prescreening.embed import sentence_embeddings
    from dil_jax.prescreening.prescreener import encoder_fingerprint

    def compute(texts: Sequence[str]) -> np.ndarray:
        return sentence_embeddings(encoder, texts, max_len=max_len)

    fingerprint = encoder_fingerprint(encoder) if folder is not None else ""
    return EmbeddingCache(folder, compute, fingerprint, max_len, encoder.config.hidden_size,
                          chunk_size)
