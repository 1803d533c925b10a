"""When an index has no passage cache for a reader: what it has instead, and the command that
builds the missing one.

`PassageCache.open` (`cache.store`) only knows the one folder it was asked for; a user
who asked `dil-jax ask` a question needs to see the caches the index does hold (reader, k,
storage) and a command to copy. The commands wrap that error with `MissingCacheError`, built from
the pure functions below (a cache folder's manifest is plain JSON: nothing here loads a model).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dil_jax.defaults import OPEN_DOMAIN_DOC_STRIDE, OPEN_DOMAIN_MAX_PASSAGE_LEN
from dil_jax.open_domain.cache.manifest import STORAGE_FIELD
from dil_jax.open_domain.cache.storage import CacheStorageError, Storage, default_storage
from dil_jax.open_domain.cache.store import CacheMismatchError

# Folder names of an index's caches: cache-k{k}-{first 8 hex digits of the model fingerprint}
# (dil_jax.open_domain.cache.manifest.cache_name).
CACHE_PREFIX = "cache-k"
# How the listing names a cache computed with the weights of the reader that asked.
THIS_READER = "this reader's weights"
# `dil-jax demo` builds its index with 2,000 distractor articles unless told otherwise.
DEMO_DISTRACTORS = 2000


class MissingCacheError(CacheMismatchError):
    """The index has no passage cache for this reader (k, weights, storage); the message lists
    the caches it has and the command that builds the missing one."""


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """One cache of an index, as its manifest describes it (None where the manifest is
    unreadable: the listing still names the folder)."""

    folder: str
    k: int | None
    storage: Storage | None
    model: str | None


def read_cache_entry(folder: Path) -> CacheEntry:
    """The entry of one cache folder, from its manifest.json (fields None if unreadable).

    Read field by field, not as a CacheManifest: a listing names what it can of a damaged or
    foreign manifest."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        manifest = {}
    if not isinstance(manifest, dict):
        manifest = {}
    k = manifest.get("num_lower_layers")
    try:
        storage = Storage.parse(str(manifest[STORAGE_FIELD]))
    except (KeyError, CacheStorageError):
        storage = None
    return CacheEntry(folder=folder.name, k=k if isinstance(k, int) else None,
                      storage=storage, model=manifest.get("model"))


def index_caches(index_dir: Path) -> list[CacheEntry]:
    """Every finished cache of an index, by folder name (staging folders start with a dot)."""
    if not index_dir.is_dir():
        return []
    return [read_cache_entry(path) for path in sorted(index_dir.iterdir())
            if path.is_dir() and path.name.startswith(CACHE_PREFIX)]


def describe_cache(entry: CacheEntry, names: Mapping[str, str]) -> str:
    """"cache-k2-acfc4806: k = 2, float32, model acfc4806 (this reader's weights)"."""
    if entry.k is None:
        return f"{entry.folder}: manifest unreadable"
    model = (entry.model or "?")[:8]
    name = names.get(entry.model or "", "")
    return (f"{entry.folder}: k = {entry.k}, {_name(entry.storage)}, model {model}"
            + (f" ({name})" if name else ""))


def _name(storage: Storage | None) -> str:
    return "?" if storage is None else storage.name


def build_command(index_dir: str, split: Mapping[str, Any], length: int, stride: int,
                  checkpoint: str, k: int, storage: Storage, tokenizer: str | None = None) -> str:
    """The command that adds the cache of (checkpoint, k, storage) to this index.

    An index keeps the corpus and split it was built with in index.json (`split`; its windows:
    `length` tokens every `stride`), so the same `dil-jax index` run with only this reader
    reopens it and builds the one cache; a demo index (its split records `distractors`) is
    rebuilt the way `dil-jax demo` builds it.
    """
    split = split or {}
    if "distractors" in split:
        words = ["dil-jax", "demo", "--index", index_dir]
        if split["distractors"] != DEMO_DISTRACTORS:
            words += ["--distractors", str(split["distractors"])]
        if (length, stride) != (OPEN_DOMAIN_MAX_PASSAGE_LEN, OPEN_DOMAIN_DOC_STRIDE):
            words += ["--max-passage-len", str(length), "--doc-stride", str(stride)]
        words += (["--full-checkpoint", checkpoint] if k == 0
                  else ["--delayed-checkpoint", checkpoint, "--k", str(k)])
        if storage != default_storage(k):
            words += ["--cache-dtype", storage.name]
        return shlex.join(words)
    words = ["dil-jax", "index", "--out", index_dir]
    for source in split.get("sources", []):
        words += ["--corpus", str(source)]
    if split.get("limit") is not None:
        words += ["--corpus-limit", str(split["limit"])]
    if split.get("strategy", "paragraphs") != "paragraphs":
        words += ["--split", str(split["strategy"])]
    words += ["--max-passage-len", str(length), "--doc-stride", str(stride),
              "--checkpoint", checkpoint, "--k", str(k)]
    if tokenizer:
        words += ["--tokenizer", tokenizer]
    if storage != default_storage(k):
        words += ["--cache-dtype", storage.name]
    return shlex.join(words)


def missing_cache_message(index_dir: str, wanted_folder: str, reader: str, k: int,
                          storage: Storage, caches: Sequence[CacheEntry],
                          names: Mapping[str, str], command: str, partial: bool = False) -> str:
    """The whole message: what is missing, what the index has, how to build it."""
    lines = [f"{index_dir}: no passage cache here for the reader {reader} at k = {k}, "
             f"{storage.name} (it would be {wanted_folder})"]
    if partial:
        lines.append(f"  an unfinished build of it exists ({index_dir}/.{wanted_folder}.partial):"
                     " rerun the command below to resume it")
    if caches:
        lines.append("  the index has:")
        lines += [f"    {describe_cache(entry, names)}" for entry in caches]
    else:
        lines.append("  the index has no passage cache at all")
    same_weights = [c for c in caches if c.model and c.model in names and c.k is not None]
    for entry in same_weights:
        if names[entry.model] == THIS_READER:
            stored = _name(entry.storage)
            lines.append(f"  this reader's weights are cached at k = {entry.k}, {stored}: "
                         f"read with --k {entry.k} --cache-dtype {stored} to use it")
    lines.append(f"  build it with: {command}")
    return "\n".join(lines)
