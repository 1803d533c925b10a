"""The passage cache: tokenized passages and their lower states, computed once, read by subset.

Layout of a cache folder:

  manifest.json   what the states were computed with (model fingerprint, k, tokenizer, lengths,
                  dtype, passages fingerprint); opening a cache that does not match the reader is
                  an error, never silently wrong answers
  ids.npy         [num_passages, passage_len] int32   `p [SEP]` token ids
  mask.npy        [num_passages, passage_len] int32
  offsets.npy     [num_passages, passage_len, 2] int32 character offsets in the passage text
  states.npy      [num_passages, passage_len, hidden]  lower states (float32, or bfloat16 stored
                  as uint16 bits); absent for k = 0, whose passage states depend on the question

The arrays are plain `.npy` files opened as memory maps, so reading the states of the top-p
passages of a question touches only those rows. Building is resumable and atomic: everything is
written into `.<name>.partial/` with a progress record updated after each flushed chunk, and the
folder is renamed into place only when complete.

Opening checks what can be checked cheaply: the manifest parses, every array loads with the shape
the manifest implies (a truncated `.npy` fails here), and — where the caller can encode — a few
stored states equal a fresh `encode_lower` of their passages (`check_states`), so a cache whose
manifest claims another k is refused. A cache that fails these is `CacheBrokenError`; `dil-jax
index` rebuilds such a cache instead of failing on it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from dil_jax.atomic import write_atomic
from dil_jax.checkpoints.fingerprint import params_fingerprint, short_sha256
from dil_jax.errors import DilJaxError

log = logging.getLogger(__name__)

CACHE_FORMAT = "dil_jax.passage_cache/1"
_MANIFEST = "manifest.json"
_PROGRESS = "progress.json"
# Fields a reader must agree with; anything else in the manifest is informational.
MATCHED_FIELDS = ("model", "architecture", "num_lower_layers", "hidden_size", "tokenizer",
                  "max_passage_len", "dtype", "passages")


class CacheMismatchError(DilJaxError, ValueError):
    """A cache was built for another model, k, tokenizer or passage set; names the field."""


class CacheBrokenError(CacheMismatchError):
    """A cache file is unreadable, truncated, or holds states its manifest does not describe.

    `build_passage_cache` (`dil-jax index`) rebuilds such a cache; opening one names the file.
    """


# Rows compared by `check_states`: first and last are enough to catch another k or model (every
# state of a row changes), and cost one tiny encoder call.
CHECKED_ROWS = 2
# Mean |stored - fresh| / mean |fresh| above which the stored states are not this encoder's.
# Re-encoding in float32 differs by ~1e-6; bfloat16 storage rounds by ~0.4%; another k or model
# differs by tens of percent.
STATES_TOLERANCE = {"float32": 1e-3, "bfloat16": 2e-2}


def cache_name(manifest: dict[str, Any]) -> str:
    """The folder name of a cache inside an index: one per (k, reader weights)."""
    return f"cache-k{manifest['num_lower_layers']}-{manifest['model'][:8]}"


def _broken(path: Path, problem: str) -> CacheBrokenError:
    return CacheBrokenError(f"{path}: broken passage cache ({problem}); rerun `dil-jax index` "
                            "with the same --out and reader to rebuild it")


def tokenizer_fingerprint(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    return f"{type(tokenizer).__name__}:{short_sha256([json.dumps(vocab).encode()])}"


def texts_fingerprint(texts: Sequence[str]) -> str:
    return short_sha256([json.dumps(list(texts)).encode()])


def _write_json_atomic(path: Path, value: Any) -> None:
    write_atomic(path, json.dumps(value, indent=2))


class PassageCache:
    """An opened cache (read-only memory maps)."""

    def __init__(self, directory: Path, manifest: dict[str, Any]):
        """Maps the arrays; one missing, truncated or of the wrong shape is CacheBrokenError."""
        self.directory = directory
        self.manifest = manifest
        try:
            rows, length = int(manifest["num_passages"]), int(manifest["max_passage_len"])
            hidden, k = int(manifest["hidden_size"]), int(manifest["num_lower_layers"])
        except (KeyError, TypeError, ValueError) as error:
            raise _broken(directory / _MANIFEST, f"field {error} missing or not a number"
                          ) from error
        self.ids = _load_array(directory / "ids.npy", (rows, length))
        self.mask = _load_array(directory / "mask.npy", (rows, length))
        self.offsets = _load_array(directory / "offsets.npy", (rows, length, 2))
        states = directory / "states.npy"
        if k == 0:
            self.states = None
        else:
            self.states = _load_array(states, (rows, length, hidden))
            if self.states.dtype != (np.uint16 if manifest.get("dtype") == "bfloat16"
                                     else np.float32):
                raise _broken(states, f"dtype {self.states.dtype} does not match the "
                                      f"manifest's {manifest.get('dtype')!r}")

    def __len__(self) -> int:
        return self.ids.shape[0]

    @classmethod
    def open(cls, directory: str | os.PathLike,
             expected: dict[str, Any] | None = None) -> PassageCache:
        """Opens a finished cache; `expected` fields (see MATCHED_FIELDS) must match exactly."""
        directory = Path(directory)
        manifest_path = directory / _MANIFEST
        if not manifest_path.is_file():
            if directory.is_dir():
                # A finished cache always has its manifest: this folder was damaged.
                raise _broken(manifest_path, "the file is missing")
            partial = directory.with_name(f".{directory.name}.partial")
            hint = " (an unfinished build exists: rerun it to resume)" if partial.exists() else ""
            raise CacheMismatchError(f"{directory}: no passage cache here{hint}")
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise _broken(manifest_path, f"not readable JSON: {error}") from error
        if not isinstance(manifest, dict):
            raise _broken(manifest_path, f"expected a JSON object, got {type(manifest).__name__}")
        if manifest.get("format") != CACHE_FORMAT:
            raise CacheMismatchError(f"{manifest_path}: format {manifest.get('format')!r}, "
                                     f"expected {CACHE_FORMAT!r}")
        if (directory.name.startswith("cache-k") and isinstance(manifest.get("model"), str)
                and "num_lower_layers" in manifest and directory.name != cache_name(manifest)):
            # The folder name was derived from the manifest when it was written.
            raise _broken(manifest_path, f"it says k={manifest.get('num_lower_layers')}, model "
                                         f"{str(manifest['model'])[:8]}, but the folder is "
                                         f"{directory.name}; was it edited?")
        for field, value in (expected or {}).items():
            if manifest.get(field) != value:
                raise CacheMismatchError(
                    f"{manifest_path}: cache built with {field} = {manifest.get(field)!r}, but "
                    f"the reader has {field} = {value!r}; rebuild the cache (dil-jax index)")
        return cls(directory, manifest)

    def passage_side(self, indices: Sequence[int]) -> np.ndarray:
        """What pairs read of those passages (`PairGrid.passage_side`, from the cache): the
        ids [len(indices), passage_len] for a k = 0 cache (it holds no states), else
        `read_states` [len(indices), passage_len, hidden]."""
        if self.states is None:
            return np.asarray(self.ids[np.asarray(indices)])
        return self.read_states(indices)

    def read_states(self, indices: Sequence[int]) -> np.ndarray:
        """[len(indices), passage_len, hidden] float32 lower states of those passages only."""
        if self.states is None:
            raise CacheMismatchError(f"{self.directory}: a k = 0 cache holds no lower states")
        rows = self.states[np.asarray(indices)]
        if self.manifest["dtype"] == "bfloat16":
            return rows.view(ml_dtypes.bfloat16).astype(np.float32)
        return np.asarray(rows, dtype=np.float32)


def _load_array(path: Path, shape: tuple[int, ...]) -> np.ndarray:
    """The .npy at `path` as a read-only memory map of exactly `shape`, else CacheBrokenError."""
    if not path.is_file():
        raise _broken(path, "the file is missing")
    try:
        array = np.load(path, mmap_mode="r")
    except (OSError, ValueError, EOFError) as error:  # a truncated file fails here
        raise _broken(path, f"unreadable, truncated? ({error})") from error
    if array.shape != shape:
        raise _broken(path, f"shape {array.shape}, the manifest implies {shape}")
    return array


def check_states(cache: PassageCache,
                 encode: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
    """Refuses (CacheBrokenError) a cache whose stored states are not `encode`'s.

    Re-encodes CHECKED_ROWS sampled rows (the first and the last) and compares them with the
    stored ones, so a manifest edited to claim another k (or model) is caught on open. A k = 0
    cache holds no states: nothing to compare.

    encode: (ids, mask) [rows, passage_len] -> [rows, passage_len, hidden] lower states.
    """
    if cache.states is None or not len(cache):
        return
    rows = sorted({0, len(cache) - 1})[:CHECKED_ROWS]
    fresh = np.asarray(encode(np.asarray(cache.ids[rows]), np.asarray(cache.mask[rows])),
                       dtype=np.float32)
    stored = cache.read_states(rows)
    mask = np.asarray(cache.mask[rows], bool)
    # Only real tokens: padding states are never read.
    scale = float(np.abs(fresh[mask]).mean()) or 1.0
    difference = float(np.abs(stored[mask] - fresh[mask]).mean()) / scale
    if not difference <= STATES_TOLERANCE.get(cache.manifest["dtype"], 1e-3):
        k = cache.manifest["num_lower_layers"]
        raise CacheBrokenError(
            f"{cache.directory}: the stored states do not match k={k} of this reader (mean "
            f"relative difference {difference:.3g} on {len(rows)} sampled passages): the cache "
            "was built by another model or k, or its manifest was edited; rerun `dil-jax index` "
            "with the same --out and reader to rebuild it")


def build_passage_cache(directory: str | os.PathLike, manifest: dict[str, Any],
                        ids: np.ndarray, mask: np.ndarray, offsets: np.ndarray,
                        encode: Callable[[np.ndarray, np.ndarray], np.ndarray] | None,
                        hidden_size: int, chunk_passages: int = 256,
                        progress: Callable[[int], None] | None = None) -> PassageCache:
    """Builds (or resumes building) a cache; returns it opened.

    An existing cache is reused when it matches `manifest` (and, with `encode`, `check_states`);
    a broken one (CacheBrokenError) is removed and rebuilt, with a warning; one built for other
    settings is refused, naming the field. The caller must hold the index's lock
    (`dil_jax.open_domain.index_lock.index_lock`): this removes and renames folders inside the
    index.

    Args:
      manifest: MATCHED_FIELDS values (and anything informational) describing the encoder.
      ids, mask: [num_passages, passage_len]; offsets: [num_passages, passage_len, 2].
      encode: (ids, mask) chunk -> [chunk, passage_len, hidden] lower states, or None for k = 0.
      progress: called with the number of passages finished after each chunk.
    """
    directory = Path(directory).absolute()
    manifest = dict(manifest, format=CACHE_FORMAT, num_passages=int(ids.shape[0]))
    if directory.exists():
        try:
            cache = PassageCache.open(directory, {f: manifest[f] for f in MATCHED_FIELDS
                                                  if f in manifest})
            if encode is not None:
                check_states(cache, encode)
            return cache
        except CacheBrokenError as error:
            log.warning("%s -- rebuilding it", error)
            shutil.rmtree(directory)
        except CacheMismatchError as error:
            raise CacheMismatchError(
                f"{error}. This run would build a different cache under the same name: delete "
                f"{directory} to rebuild it with this run's settings, or use another --out"
            ) from error
    staging = directory.with_name(f".{directory.name}.partial")
    done = _resume_point(staging, manifest)
    if done is None:
        _start_fresh(staging, manifest, ids, mask, offsets, encode is not None, hidden_size)
        done = 0
    if encode is not None:
        states = np.load(staging / "states.npy", mmap_mode="r+")
        for start in range(done, ids.shape[0], chunk_passages):
            stop = min(start + chunk_passages, ids.shape[0])
            chunk = np.asarray(encode(ids[start:stop], mask[start:stop]), dtype=np.float32)
            if manifest["dtype"] == "bfloat16":
                chunk = chunk.astype(ml_dtypes.bfloat16).view(np.uint16)
            states[start:stop] = chunk
            states.flush()  # data on disk before the progress record says so
            _write_json_atomic(staging / _PROGRESS, {"done": stop})
            if progress:
                progress(stop)
        del states
    (staging / _PROGRESS).unlink(missing_ok=True)
    (staging / "plan.json").unlink(missing_ok=True)
    _write_json_atomic(staging / _MANIFEST, manifest)
    os.replace(staging, directory)
    return PassageCache.open(directory)


def _resume_point(staging: Path, manifest: dict[str, Any]) -> int | None:
    """Passages already done in a compatible partial build, or None to start over."""
    try:
        planned = json.loads((staging / "plan.json").read_text())
        done = json.loads((staging / _PROGRESS).read_text())["done"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None
    return int(done) if planned == manifest else None


def _start_fresh(staging: Path, manifest: dict[str, Any], ids: np.ndarray, mask: np.ndarray,
                 offsets: np.ndarray, with_states: bool, hidden_size: int) -> None:
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    np.save(staging / "ids.npy", ids.astype(np.int32))
    np.save(staging / "mask.npy", mask.astype(np.int32))
    np.save(staging / "offsets.npy", offsets.astype(np.int32))
    if with_states:
        dtype = np.uint16 if manifest["dtype"] == "bfloat16" else np.float32
        np.lib.format.open_memmap(staging / "states.npy", mode="w+", dtype=dtype,
                                  shape=(ids.shape[0], ids.shape[1], hidden_size)).flush()
    _write_json_atomic(staging / "plan.json", manifest)
    _write_json_atomic(staging / _PROGRESS, {"done": 0})


def reader_manifest(config, params: Any, tokenizer_id: str, max_passage_len: int,
                    passages_id: str, dtype: str = "float32") -> dict[str, Any]:
    """The MATCHED_FIELDS of a reader: what a cache must have been built with to serve it."""
    if dtype not in ("float32", "bfloat16"):
        raise CacheMismatchError(f"cache dtype must be float32 or bfloat16 (--cache-dtype), "
                                 f"got {dtype!r}")
    return dict(model=params_fingerprint(params), architecture=config.architecture,
                num_lower_layers=config.num_lower_layers, hidden_size=config.hidden_size,
                tokenizer=tokenizer_id, max_passage_len=max_passage_len, dtype=dtype,
                passages=passages_id)
