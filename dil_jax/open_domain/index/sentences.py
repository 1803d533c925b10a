"""Sentence embeddings of every passage, stored beside the passage caches of an index.

    index/sentences-{encoder}/
      manifest.json    format, sentence encoder (name, weight fingerprint, token limit), the
                       passages fingerprint; opening a store for another encoder or passage set
                       is an error naming the field
      first.npy        [num_passages + 1] int64: passage i's sentences are rows first[i]..first[i+1]
      spans.npy        [num_sentences, 2] int32 [start, end) characters in the passage text
      embeddings.npy   [num_sentences, dim] float32 unit vectors (opened as a memory map)

Like the passage states, a sentence's embedding depends only on the passage, so it is computed
once, offline (`dil-jax index --prescreen ...`); a question then costs one sentence-encoder pass
and one prescreener pass over its retrieved passages' stored sentences.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from dil_jax.atomic import staged_directory
from dil_jax.errors import DilJaxError
from dil_jax.file_array import FileArray, npy_rows
from dil_jax.prescreening.sentences import split_sentences

log = logging.getLogger(__name__)

STORE_FORMAT = "dil_jax.sentence_store/1"
_MANIFEST = "manifest.json"
_REBUILD = "rerun `dil-jax index` with the same --out and --prescreen to rebuild it"


class SentenceStoreError(DilJaxError, ValueError):
    """A sentence store that is missing or was built for another encoder or passage set."""


def store_dir(index_dir: str | Path, encoder_fingerprint: str) -> Path:
    return Path(index_dir) / f"sentences-{encoder_fingerprint[:8]}"


def _expected(prescreener, passages_fingerprint: str) -> dict:
    return dict(format=STORE_FORMAT, encoder=prescreener.encoder_name,
                encoder_fingerprint=prescreener.encoder_fingerprint,
                max_sentence_len=prescreener.max_sentence_len, passages=passages_fingerprint)


class SentenceStore:
    """An opened store (its arrays read by rows from their files)."""

    def __init__(self, directory: Path, manifest: dict | None = None):
        """Loads the arrays; a missing, truncated or inconsistent one is SentenceStoreError."""
        self.directory = directory
        # Read by rows (`dil_jax.file_array`): a question reads its passages' entries only.
        self.first = _load(directory / "first.npy")
        self.spans = _load(directory / "spans.npy")
        self.embeddings = _load(directory / "embeddings.npy")
        sentences = int(self.first[-1]) if self.first.ndim == 1 and len(self.first) else -1
        if (self.first.ndim != 1 or self.spans.shape != (sentences, 2)
                or self.embeddings.ndim != 2 or self.embeddings.shape[0] != sentences
                or (manifest is not None and len(self.first) != manifest.get("num_passages", 0)
                    + 1)):
            raise SentenceStoreError(
                f"{directory}: broken sentence store (first.npy {self.first.shape}, spans.npy "
                f"{self.spans.shape}, embeddings.npy {self.embeddings.shape} disagree); "
                f"{_REBUILD}")

    @classmethod
    def open(cls, index, prescreener) -> SentenceStore:
        directory = store_dir(index.directory, prescreener.encoder_fingerprint)
        manifest_path = directory / _MANIFEST
        if not manifest_path.is_file():
            raise SentenceStoreError(
                f"{directory}: no sentence embeddings for this encoder in the index; build them "
                f"with `dil-jax index --out {index.directory} --prescreen ...`")
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise SentenceStoreError(f"{manifest_path}: not readable JSON ({error}); {_REBUILD}"
                                     ) from error
        if not isinstance(manifest, dict):
            raise SentenceStoreError(f"{manifest_path}: expected a JSON object; {_REBUILD}")
        for field, value in _expected(prescreener, index.settings.passages).items():
            if field != "encoder" and manifest.get(field) != value:
                raise SentenceStoreError(f"{manifest_path}: built with {field} = "
                                         f"{manifest.get(field)!r}, the prescreener has {value!r}")
        return cls(directory, manifest)

    def spans_of(self, passages: Sequence[int], max_sentences: int | None = None
                 ) -> list[list[tuple[int, int]]]:
        """The sentence spans of these passages (the first max_sentences of each), in order."""
        return [[tuple(span) for span in
                 np.asarray(self.spans[self.first[p]:self.first[p + 1]])[:max_sentences].tolist()]
                for p in np.asarray(passages, np.int64)]

    def matrix(self, passages: Sequence[int], max_sentences: int
               ) -> tuple[np.ndarray, np.ndarray]:
        """([n, max_sentences, dim] embeddings, [n, max_sentences] mask) of these passages."""
        passages = np.asarray(passages, np.int64)
        counts = np.minimum(self.first[passages + 1] - self.first[passages], max_sentences)
        slots = np.arange(max_sentences)[None]
        mask = slots < counts[:, None]
        rows = np.where(mask, self.first[passages][:, None] + slots, 0)
        vectors = np.asarray(self.embeddings[rows.reshape(-1)]).reshape(
            len(passages), max_sentences, -1) * mask[..., None]
        return vectors.astype(np.float32), mask.astype(np.int32)


def _load(path: Path) -> FileArray:
    """The .npy at `path`, read by rows; SentenceStoreError naming it when missing or bad."""
    try:
        return npy_rows(path)
    except FileNotFoundError as error:
        raise SentenceStoreError(f"{path}: missing from the sentence store; {_REBUILD}"
                                 ) from error
    except (OSError, ValueError, EOFError) as error:  # truncated or not an array
        raise SentenceStoreError(f"{path}: unreadable ({error}); {_REBUILD}") from error


def build_sentence_store(index, prescreener, *, chunk: int = 4096,
                         progress: Callable[[int, int], None] | None = None) -> SentenceStore:
    """Splits and embeds every passage's sentences (or opens the store when it exists and is
    sound; a broken or mismatched one is rebuilt), holding the index's lock."""
    from dil_jax.open_domain.index.lock import index_lock

    with index_lock(index.directory):
        return _build_sentence_store(index, prescreener, chunk, progress)


def _build_sentence_store(index, prescreener, chunk: int,
                          progress: Callable[[int, int], None] | None) -> SentenceStore:
    try:
        return SentenceStore.open(index, prescreener)
    except SentenceStoreError as error:
        if store_dir(index.directory, prescreener.encoder_fingerprint).exists():
            log.warning("%s -- rebuilding it", error)
    spans = [split_sentences(passage.text) for passage in index.passages]
    first = np.concatenate([[0], np.cumsum([len(s) for s in spans])]).astype(np.int64)
    texts = [passage.text[a:b] for passage, passage_spans in zip(index.passages, spans)
             for a, b in passage_spans]
    flat = np.asarray([span for passage_spans in spans for span in passage_spans],
                      np.int32).reshape(-1, 2)
    directory = store_dir(index.directory, prescreener.encoder_fingerprint)
    with staged_directory(directory) as staging:
        embeddings = np.lib.format.open_memmap(
            staging / "embeddings.npy", mode="w+", dtype=np.float32,
            shape=(len(texts), prescreener.config.embedding_dim))
        for start in range(0, len(texts), chunk):
            embeddings[start:start + chunk] = prescreener.embed(texts[start:start + chunk])
            if progress is not None:
                progress(min(start + chunk, len(texts)), len(texts))
        embeddings.flush()
        del embeddings
        np.save(staging / "first.npy", first)
        np.save(staging / "spans.npy", flat)
        manifest = _expected(prescreener, index.settings.passages) | dict(
            num_passages=len(spans), num_sentences=len(texts))
        (staging / _MANIFEST).write_text(json.dumps(manifest, indent=2))
    return SentenceStore.open(index, prescreener)
