"""An open-domain index folder: passages, their BM25 index, their windows, passage caches.

    index/
      index.json         split strategy, lengths, tokenizer, passage fingerprint, counts
      passages.jsonl     one Passage per line (id, source document id, title, text, offsets)
      windows.npz        which cache rows (windows of `p_window [SEP]`) belong to which passage
      bm25/              the BM25 index (dil_jax.odqa.retrieval)
      cache-k{k}-{model}/  one passage cache per (reader weights, k) (dil_jax.odqa.cache)

Passages longer than `max_passage_len - 1` tokens are read in strided windows exactly as SQuAD
contexts are (`dil_jax.data.features.window_contexts`), so a passage's answer is the same as the
SQuAD predict path gives for that (question, passage).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dil_jax.atomic import staged_directory
from dil_jax.data.features import window_contexts
from dil_jax.errors import DilJaxError
from dil_jax.odqa.cache import (
    PassageCache,
    build_passage_cache,
    reader_manifest,
    texts_fingerprint,
    tokenizer_fingerprint,
)
from dil_jax.odqa.corpus import Passage
from dil_jax.odqa.retrieval import BM25Retriever

INDEX_FORMAT = "dil_jax.odqa_index/1"


class OpenDomainIndexError(DilJaxError, ValueError):
    """An index folder is missing, incomplete or built with other settings; names the field."""


@dataclasses.dataclass
class PassageWindows:
    """Cache rows of each passage: rows first[i] .. first[i] + count[i] - 1 are passage i's.

    passage_of_row: [n_rows] passage index of each cache row.
    """

    first: np.ndarray
    count: np.ndarray
    passage_of_row: np.ndarray

    def rows_of(self, passages: Sequence[int]) -> np.ndarray:
        """Cache rows of these passages, in order."""
        if not len(passages):
            return np.zeros(0, np.int64)
        passages = np.asarray(passages)
        return np.concatenate([np.arange(self.first[p], self.first[p] + self.count[p])
                               for p in passages])


@dataclasses.dataclass
class OpenDomainIndex:
    directory: Path
    settings: dict[str, Any]
    passages: list[Passage]
    retriever: BM25Retriever
    windows: PassageWindows

    def cache_dir(self, manifest: dict[str, Any]) -> Path:
        return self.directory / f"cache-k{manifest['num_lower_layers']}-{manifest['model'][:8]}"

    def open_cache(self, config, params, tokenizer, dtype: str = "float32") -> PassageCache:
        """The passage cache for this reader; a mismatch is an error naming the field."""
        manifest = self.reader_manifest(config, params, tokenizer, dtype)
        return PassageCache.open(self.cache_dir(manifest), manifest)

    def reader_manifest(self, config, params, tokenizer, dtype: str = "float32"
                        ) -> dict[str, Any]:
        tokenizer_id = tokenizer_fingerprint(tokenizer)
        if tokenizer_id != self.settings["tokenizer"]:
            raise OpenDomainIndexError(
                f"{self.directory / 'index.json'}: index tokenized with "
                f"{self.settings['tokenizer']}, reader tokenizer is {tokenizer_id}")
        return reader_manifest(config, params, tokenizer_id, self.settings["max_passage_len"],
                               self.settings["passages"], dtype)


def build_index(directory: str | os.PathLike, passages: Sequence[Passage], tokenizer, *,
                max_passage_len: int, doc_stride: int, split: dict[str, Any]) -> OpenDomainIndex:
    """Writes passages, windows and BM25 (atomically: staging folder, then rename)."""
    directory = Path(directory).absolute()
    if not passages:
        raise OpenDomainIndexError("no passages to index (is the corpus empty?)")
    texts = [p.text for p in passages]
    windows = window_contexts(tokenizer, texts, max_passage_len=max_passage_len,
                              doc_stride=doc_stride)
    settings = dict(format=INDEX_FORMAT, split=split, max_passage_len=max_passage_len,
                    doc_stride=doc_stride, tokenizer=tokenizer_fingerprint(tokenizer),
                    passages=texts_fingerprint(texts), num_passages=len(passages),
                    num_windows=int(windows.ids.shape[0]))
    with staged_directory(directory) as staging:
        with (staging / "passages.jsonl").open("w", encoding="utf-8") as out:
            for passage in passages:
                out.write(json.dumps(dataclasses.asdict(passage), ensure_ascii=False) + "\n")
        np.savez(staging / "windows.npz", first=windows.first_window, count=windows.counts,
                 passage_of_row=windows.context_index, ids=windows.ids, mask=windows.mask,
                 offsets=windows.offsets, max_context=windows.max_context)
        BM25Retriever.build(texts).save(staging / "bm25", fingerprint=settings["passages"])
        (staging / "index.json").write_text(json.dumps(settings, indent=2))
    return open_index(directory)


def open_index(directory: str | os.PathLike) -> OpenDomainIndex:
    directory = Path(directory)
    settings_path = directory / "index.json"
    if not settings_path.is_file():
        raise OpenDomainIndexError(f"{directory}: not an open-domain index (no index.json); "
                                   "build one with `dil-jax index`")
    settings = json.loads(settings_path.read_text())
    if settings.get("format") != INDEX_FORMAT:
        raise OpenDomainIndexError(f"{settings_path}: format {settings.get('format')!r}, expected "
                          f"{INDEX_FORMAT!r}")
    with (directory / "passages.jsonl").open(encoding="utf-8") as lines:
        passages = [Passage(**json.loads(line)) for line in lines]
    if len(passages) != settings["num_passages"]:
        raise OpenDomainIndexError(f"{directory / 'passages.jsonl'}: {len(passages)} passages, "
                                   f"index.json says {settings['num_passages']}")
    retriever = BM25Retriever.load(directory / "bm25", fingerprint=settings["passages"])
    with np.load(directory / "windows.npz") as arrays:
        windows = PassageWindows(arrays["first"], arrays["count"], arrays["passage_of_row"])
    return OpenDomainIndex(directory, settings, passages, retriever, windows)


def window_arrays(index: OpenDomainIndex) -> dict[str, np.ndarray]:
    """ids, mask, offsets, max_context of every window (what a passage cache is built from)."""
    with np.load(index.directory / "windows.npz") as arrays:
        return {name: arrays[name] for name in ("ids", "mask", "offsets", "max_context")}


def build_reader_cache(index: OpenDomainIndex, config, params, tokenizer, *,
                       encode: Callable[[np.ndarray, np.ndarray], np.ndarray] | None,
                       dtype: str = "float32", chunk_passages: int = 256,
                       progress: Callable[[int], None] | None = None) -> PassageCache:
    """Builds (or resumes, or just opens) the passage cache of this reader over the index.

    encode: (ids, mask) -> lower states; None for k = 0 (the cache then holds tokens only).
    """
    manifest = index.reader_manifest(config, params, tokenizer, dtype)
    arrays = window_arrays(index)
    return build_passage_cache(index.cache_dir(manifest), manifest, arrays["ids"],
                               arrays["mask"], arrays["offsets"], encode, config.hidden_size,
                               chunk_passages=chunk_passages, progress=progress)
