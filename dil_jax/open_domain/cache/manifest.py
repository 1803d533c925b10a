"""A passage cache's `manifest.json` as values: `CacheKey` (what a reader expects of a cache)
and `CacheManifest` (the whole file), each with `to_json` / `from_json`.

The file's field names are kept as every earlier build wrote them, so older caches read as
before; one differs from its value's name here: the storage scheme is `storage` (a
`cache.storage.Storage`) in code and `"dtype"` in the file (`STORAGE_FIELD`), where it has been
since the first cache format.

    CacheKey       model fingerprint, architecture, k, hidden size, tokenizer fingerprint,
                   window length, storage, passages fingerprint: MATCHED_FIELDS, all of which
                   a reader must agree with (`dil_jax.open_domain.cache.check.reader_cache_key`)
    CacheManifest  the key, plus what the files hold: format, rows, the first-upper-block
                   arrays (`reuse`, `num_heads`), the shards of a sharded cache (`chunk_passages`,
                   `shards`) or a shard's own place (`shard`), a ragged store's real tokens and
                   pad id (`num_tokens`, `pad_id`), and the file digests (`digests`:
                   `dil_jax.open_domain.cache.digests`)

Formats (`format`), each its own name so that code which knows only the older ones refuses the
newer as another format instead of taking it for a broken cache and deleting it:

    CACHE_FORMAT    /1  padded .npy arrays [rows, p_len, ...] in one folder (read, not written)
    SHARDED_FORMAT  /2  a folder of /1 shards (read, not written)
    RAGGED_FORMAT   /3  real tokens only, zarr v3 arrays on tensorstore, unsharded or sharded
                        (`shards`): what every build writes
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from dil_jax.open_domain.cache.storage import Storage

CACHE_FORMAT = "dil_jax.passage_cache/1"
# A cache of several shards. Its own format name (not a field of /1): code that knows only /1
# refuses it as another format instead of taking it for a broken /1 cache and deleting it.
SHARDED_FORMAT = "dil_jax.passage_cache/2"
# Real tokens only (no padding slots), zarr v3 arrays read by rows (`cache.store`).
RAGGED_FORMAT = "dil_jax.passage_cache/3"
FORMATS = (CACHE_FORMAT, SHARDED_FORMAT, RAGGED_FORMAT)
MANIFEST_FILE = "manifest.json"
SHARDS_DIR = "shards"
# The file's name of the storage scheme (the first format called it the cache's dtype).
STORAGE_FIELD = "dtype"
# Fields a reader must agree with, in the order a mismatch is looked for; anything else in the
# manifest is informational.
MATCHED_FIELDS = ("model", "architecture", "num_lower_layers", "hidden_size", "tokenizer",
                  "max_passage_len", STORAGE_FIELD, "passages")
# The fields recording the files' digests (`cache.digests.digest_fields`).
DIGEST_FIELDS = ("digest_sample", "files")


class ManifestFieldError(ValueError):
    """A manifest field is missing or of the wrong type; the message names it (the caller says
    which file: `dil_jax.open_domain.cache.store` turns it into a CacheBrokenError)."""


def _field(value: Mapping[str, Any], name: str, kind: type) -> Any:
    """value[name] as `kind` (int: a number, str: a string), else ManifestFieldError."""
    try:
        return int(value[name]) if kind is int else kind(value[name])
    except (KeyError, TypeError, ValueError) as error:
        what = "a number" if kind is int else "a string"
        raise ManifestFieldError(f"field {error} missing or not {what}") from error


@dataclasses.dataclass(frozen=True)
class CacheKey:
    """What a cache's states were computed with, as a reader expects it (MATCHED_FIELDS)."""

    model: str  # params fingerprint of the reader's weights
    architecture: str
    num_lower_layers: int  # k
    hidden_size: int
    tokenizer: str  # tokenizer fingerprint
    max_passage_len: int
    storage: Storage
    passages: str  # fingerprint of the index's passage texts

    def to_json(self) -> dict[str, Any]:
        """The MATCHED_FIELDS as the file writes them (the storage by its name)."""
        return {field: (self.storage.name if field == STORAGE_FIELD else getattr(self, field))
                for field in MATCHED_FIELDS}

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> CacheKey:
        """The key of a manifest's fields; ManifestFieldError or CacheStorageError (a scheme
        unknown, or a PCA wider than the hidden size) naming the field."""
        hidden = _field(value, "hidden_size", int)
        return cls(model=_field(value, "model", str),
                   architecture=_field(value, "architecture", str),
                   num_lower_layers=_field(value, "num_lower_layers", int), hidden_size=hidden,
                   tokenizer=_field(value, "tokenizer", str),
                   max_passage_len=_field(value, "max_passage_len", int),
                   storage=Storage.parse(str(value.get(STORAGE_FIELD)), hidden),
                   passages=_field(value, "passages", str))

    @property
    def folder_name(self) -> str:
        """The folder of this cache inside an index: one per (k, reader weights)."""
        return cache_name(self.num_lower_layers, self.model)


def cache_name(k: int, model: str) -> str:
    """"cache-k{k}-{first 8 hex digits of the weights fingerprint}": a cache's folder name."""
    return f"cache-k{k}-{model[:8]}"


def shard_name(index: int, count: int) -> str:
    """The folder (under shards/) of shard `index` of `count`."""
    return f"shard-{index:05d}-of-{count:05d}"


@dataclasses.dataclass(frozen=True)
class ShardRange:
    """One shard of a sharded cache: its folder (`shards/shard-i-of-n`) and its global rows
    [start, stop)."""

    name: str
    start: int
    stop: int


@dataclasses.dataclass(frozen=True)
class CacheManifest:
    """A cache folder's manifest.json (module docstring).

    num_passages: rows [num_passages, max_passage_len] of every array; reuse: the first upper
    block's arrays are stored, num_heads wide where per head; chunk_passages and shards: a
    sharded cache's grid and shards (SHARDED_FORMAT, or RAGGED_FORMAT with shards); shard: a
    shard's own place ({index, count, start, stop}), in a shard's manifest; num_tokens, pad_id:
    a ragged folder's real tokens (the length of its token arrays) and the id its padding slots
    read back as (RAGGED_FORMAT, not sharded); digests: {digest_sample, files} of a finished
    folder (None: written before digests existed, or not finished yet).
    """

    key: CacheKey
    num_passages: int
    reuse: bool = False
    num_heads: int | None = None
    format: str = CACHE_FORMAT
    chunk_passages: int | None = None
    shards: tuple[ShardRange, ...] = ()
    shard: Mapping[str, int] | None = None
    num_tokens: int | None = None
    pad_id: int | None = None
    digests: Mapping[str, Any] | None = None

    @property
    def is_sharded(self) -> bool:
        """A folder of shards (its rows are in shards/, listed by `shards`)."""
        return self.format == SHARDED_FORMAT or (self.format == RAGGED_FORMAT
                                                 and bool(self.shards))

    @property
    def is_ragged(self) -> bool:
        return self.format == RAGGED_FORMAT

    def to_json(self) -> dict[str, Any]:
        """The file's JSON object, in the order builds have written it."""
        value: dict[str, Any] = dict(self.key.to_json(), format=self.format,
                                     num_passages=self.num_passages, reuse=self.reuse)
        if self.num_heads is not None:
            value["num_heads"] = self.num_heads
        if self.is_sharded:
            value.update(chunk_passages=self.chunk_passages,
                         shards=[dataclasses.asdict(shard) for shard in self.shards])
        if self.shard is not None:
            value["shard"] = dict(self.shard)
        if self.num_tokens is not None:
            value.update(num_tokens=self.num_tokens, pad_id=self.pad_id)
        return dict(value, **(self.digests or {}))

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> CacheManifest:
        """The manifest of a parsed JSON object whose format is one of FORMATS (the caller
        checks it first); ManifestFieldError or CacheStorageError naming a field. A sharded
        manifest's shards are read as listed (`cache.store._shard_ranges_of` checks that they
        tile the rows)."""
        key = CacheKey.from_json(value)
        reuse = bool(value.get("reuse"))
        form = str(value.get("format"))
        shards = ()
        if form == SHARDED_FORMAT or (form == RAGGED_FORMAT and "shards" in value):
            shards = _shards_of(value.get("shards"))
        ragged = form == RAGGED_FORMAT and not shards
        digests = {field: value[field] for field in DIGEST_FIELDS if field in value}
        return cls(key=key, num_passages=_field(value, "num_passages", int), reuse=reuse,
                   num_heads=_field(value, "num_heads", int) if reuse else None,
                   format=form, chunk_passages=value.get("chunk_passages"), shards=shards,
                   shard=value.get("shard"),
                   num_tokens=_field(value, "num_tokens", int) if ragged else None,
                   pad_id=_field(value, "pad_id", int) if ragged else None,
                   digests=digests or None)

    def without_digests(self) -> CacheManifest:
        """The manifest as planned: what a build of these settings writes before its files."""
        return dataclasses.replace(self, digests=None)


def _shards_of(listed: Any) -> tuple[ShardRange, ...]:
    """The `shards` field as ShardRanges; ManifestFieldError when it is not [{name, start,
    stop}, ...]."""
    if not isinstance(listed, list) or not listed:
        raise ManifestFieldError("field 'shards' missing or empty")
    ranges = []
    for number, shard in enumerate(listed):
        try:
            ranges.append(ShardRange(str(shard["name"]), int(shard["start"]),
                                     int(shard["stop"])))
        except (KeyError, TypeError, ValueError) as error:
            raise ManifestFieldError(f"shards[{number}] is not {{name, start, stop}}") from error
    return tuple(ranges)
