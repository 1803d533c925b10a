"""A ragged cache's arrays on tensorstore: zarr v3 arrays, chunked along tokens, sharded.

Each array is a zarr v3 array (a folder, or a prefix at a URL: `zarr.json`, then `c/<i>/0`, one
file per shard) whose first axis is the token (or, for `token_starts`, the row). It is cut along
that axis by a `TokenGrid`:

  shard_tokens  tokens per shard: one file (object) each, zarr v3's sharding codec
                (`sharding_indexed`); what a build holds of an array before writing it
  chunk_tokens  tokens per inner chunk of a shard: what a read decodes at least (reading one
                row reads the chunks its tokens lie in, nothing else)

Inside a shard every inner chunk, and the shard's index of them, ends with its crc32c (zarr's
`crc32c` codec), which tensorstore checks on every read: a chunk damaged on disk is refused when
it is read, naming the file. Token arrays (ids, offsets, token_starts) are zstd-compressed inside
the chunk; stored states are left as the storage scheme wrote them (quantized codes compress
little, and a read should not pay for it).

Every array of one cache shares one grid, sized by the widest array's bytes per token
(`TokenGrid.for_bytes`), so shard boundaries fall on the same tokens in all of them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from dil_jax.open_domain.cache.errors import broken
from dil_jax.open_domain.cache.location import Location

# Target bytes of one inner chunk of the widest array (a row read reads at least its chunks),
# and of one shard of it (a file; a build buffers one shard per array before writing it).
CHUNK_BYTES = 1 << 17
SHARD_BYTES = 1 << 27
MIN_CHUNK_TOKENS = 16
# Bytes a reading process keeps of recently read chunks and shard indexes: bounded, so memory
# does not grow with the cache.
READ_CACHE_BYTES = 32 << 20
ZARR_FILE = "zarr.json"


def _floor_pow2(value: float) -> int:
    return 1 << max(0, int(np.floor(np.log2(max(value, 1.0)))))


@dataclasses.dataclass(frozen=True)
class TokenGrid:
    """chunk_tokens and shard_tokens (module docstring); shard_tokens is a multiple of
    chunk_tokens."""

    chunk_tokens: int
    shard_tokens: int

    def __post_init__(self):
        if self.chunk_tokens < 1 or self.shard_tokens % self.chunk_tokens:
            raise ValueError(f"a token grid needs shard_tokens ({self.shard_tokens}) a multiple "
                             f"of chunk_tokens ({self.chunk_tokens}) >= 1")

    @classmethod
    def for_bytes(cls, bytes_per_token: int, num_tokens: int | None = None) -> TokenGrid:
        """The grid whose chunks and shards of an array of `bytes_per_token` are about
        CHUNK_BYTES and SHARD_BYTES (powers of two tokens), no larger than needed for
        `num_tokens` (a shard's index has an entry per chunk of a whole shard, and a last
        chunk is stored whole: a small cache gets small ones)."""
        chunk = max(MIN_CHUNK_TOKENS, _floor_pow2(CHUNK_BYTES / max(bytes_per_token, 1)))
        shard = max(chunk, _floor_pow2(SHARD_BYTES / max(bytes_per_token, 1)))
        if num_tokens is not None:
            enough = max(MIN_CHUNK_TOKENS, 2 * _floor_pow2(max(num_tokens - 1, 1)))
            shard, chunk = min(shard, enough), min(chunk, enough)
        return cls(chunk, shard)


def array_metadata(shape: tuple[int, ...], dtype: np.dtype, grid: TokenGrid,
                   compress: bool) -> dict[str, Any]:
    """zarr v3 metadata of an array [shape[0] tokens, ...] cut along axis 0 by `grid`."""
    tail = list(shape[1:])
    inner = [{"name": "bytes", "configuration": {"endian": "little"}}]
    if compress:
        inner.append({"name": "zstd", "configuration": {"level": 3}})
    inner.append({"name": "crc32c"})
    return {
        "shape": list(shape), "data_type": np.dtype(dtype).name,
        "chunk_grid": {"name": "regular",
                       "configuration": {"chunk_shape": [grid.shard_tokens, *tail]}},
        "codecs": [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [grid.chunk_tokens, *tail], "codecs": inner,
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                             {"name": "crc32c"}],
            "index_location": "end"}}],
    }


def _read_context():
    """One tensorstore context for every array a process reads: a cache pool of
    READ_CACHE_BYTES shared by all of them."""
    import tensorstore as ts

    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = ts.Context({"cache_pool": {"total_bytes_limit": READ_CACHE_BYTES}})
    return _CONTEXT


_CONTEXT = None


def create_array(location: Location, name: str, shape: tuple[int, ...], dtype,
                 grid: TokenGrid, compress: bool = False):
    """A new, empty zarr v3 array `name` under `location` (one there is replaced)."""
    import tensorstore as ts

    spec = {"driver": "zarr3", "kvstore": (location / name).kvstore(),
            "metadata": array_metadata(shape, dtype, grid, compress),
            "create": True, "delete_existing": True}
    try:
        return ts.open(spec).result()
    except ValueError as error:
        raise _write_failure(location / name, error) from error


def _write_failure(where: Location, error: ValueError) -> Exception:
    """A tensorstore write error as the one-line disk error (`cache.disk.write_failure`: a full
    or read-only disk, a file-size limit) naming the array; at a URL, as a store's refusal
    (`location.store_failure`); else as it came."""
    from dil_jax.errors import DISK_REFUSALS
    from dil_jax.open_domain.cache.disk import write_failure
    from dil_jax.open_domain.cache.location import store_failure

    if not where.is_local:
        return store_failure(where, error)

    for number, words in DISK_REFUSALS.items():
        if words in str(error):
            failure = write_failure(where.path or Path(str(where)), OSError(number, words))
            if failure is not None:
                return failure
    return error


def open_array(location: Location, name: str, shape: tuple[int, ...], dtype,
               writable: bool = False):
    """The zarr v3 array `name` under `location`, for reading (and writing: a build's, with no
    cache of what it read); CacheBrokenError naming it when it is missing, unreadable, or not
    of `shape` and `dtype` (what the manifest implies)."""
    import tensorstore as ts

    where = location / name
    try:
        spec = {"driver": "zarr3", "kvstore": where.kvstore(), "open": True}
        array = (ts.open(spec, read=True, write=True) if writable else
                 ts.open(spec, context=_read_context(), read=True)).result()
    except ValueError as error:
        problem = ("the array is missing" if "NOT_FOUND" in str(error)
                   else f"unreadable ({error})")
        raise broken(where / ZARR_FILE, problem) from error
    if tuple(array.shape) != tuple(shape) or array.dtype.numpy_dtype != np.dtype(dtype):
        raise broken(where / ZARR_FILE, f"shape {tuple(array.shape)} {array.dtype.numpy_dtype}, "
                                        f"the manifest implies {tuple(shape)} {np.dtype(dtype)}")
    return array


def grid_of(array) -> TokenGrid:
    """The TokenGrid an array was created with (a resumed build writes on it)."""
    layout = array.chunk_layout
    return TokenGrid(int(layout.read_chunk.shape[0]), int(layout.write_chunk.shape[0]))


def read_tokens(array, index: np.ndarray, where: Location) -> np.ndarray:
    """array[index] ([len(index), ...]) for int64 positions along axis 0; a chunk that fails its
    crc32c, or a file that cannot be read, is CacheBrokenError naming `where` and the file."""
    index = np.asarray(index, np.int64)
    try:
        if not len(index):
            return np.zeros((0, *array.shape[1:]), array.dtype.numpy_dtype)
        return np.asarray(array[index].read().result())
    except ValueError as error:
        raise broken(where, f"unreadable ({error})") from error


def read_all(array, where: Location) -> np.ndarray:
    """The whole of a small array (a PCA basis), CacheBrokenError as `read_tokens`."""
    try:
        return np.asarray(array.read().result())
    except ValueError as error:
        raise broken(where, f"unreadable ({error})") from error


def write_tokens(array, start: int, values: np.ndarray, where: Location) -> None:
    """values [n, ...] -> array[start:start + n]; a full disk names the array."""
    try:
        array[start:start + len(values)].write(values).result()
    except ValueError as error:
        raise _write_failure(where, error) from error

