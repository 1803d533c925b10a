"""A tiny open-domain index over the sample passages, shared by the index tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from dil_jax.samples import SAMPLE_PASSAGES


def build_sample_index(root: Path, *flags: str, ks: tuple[str, ...] = ("0", "1")
                       ) -> tuple[Path, str]:
    """(index folder, corpus source) of an index of the sample passages (one document each)
    with caches for each k of `ks` (default k = 0 and k = 1), built in `root` by `dil-jax
    index` with `flags`."""
    from dil_jax.cli import main

    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"doc{i}", "title": f"T{i}", "text": text})
                              + "\n" for i, text in enumerate(SAMPLE_PASSAGES)))
    index = root / "index"
    assert main(["index", "--out", str(index), "--corpus", f"jsonl:{corpus}", "--k", *ks,
                 *flags]) == 0
    return index, f"jsonl:{corpus}"


def private_copy(index: Path, tmp_path: Path) -> Path:
    """A copy of `index` in `tmp_path` (copytree keeps modification times, as `cp -a` does)."""
    copy = tmp_path / "index"
    shutil.copytree(index, copy)
    return copy


def zarr_array(folder: Path):
    """The whole zarr v3 array in `folder` (one array of a ragged passage cache), read with
    tensorstore, as numpy."""
    import numpy as np
    import tensorstore as ts

    return np.asarray(ts.open({"driver": "zarr3", "kvstore": {
        "driver": "file", "path": f"{folder}/"}}).result().read().result())


def cache_folder(index: Path, k: int) -> Path:
    """The one passage-cache folder of split `k` in `index` (`cache-k<k>-<digest>`)."""
    (folder,) = index.glob(f"cache-k{k}-*")
    return folder


def shard_dirs(cache_dir: Path) -> list[Path]:
    """The shard folders of a sharded ragged cache, in order."""
    return sorted((cache_dir / "shards").iterdir())


def array_names(folder: Path) -> list[str]:
    """The zarr arrays of a ragged cache folder (its folders, shards/ aside)."""
    return sorted(path.name for path in folder.iterdir()
                  if path.is_dir() and path.name != "shards")


def assert_same_arrays(sharded: Path, single: Path) -> None:
    """Every array of the one-process cache `single` equals, byte for byte, the concatenation
    of the shards' of `sharded` (the token arrays; token_starts with each shard's first token
    added), or each shard's copy (a PCA basis, a pq rotation and codebook). Values are
    compared, not files: the files' grids follow each folder's token count."""
    import numpy as np

    shards = shard_dirs(sharded)
    names = array_names(single)
    assert names and all(array_names(shard) == names for shard in shards)
    for name in names:
        expected = zarr_array(single / name)
        parts = [zarr_array(shard / name) for shard in shards]
        if ".pca_" in name or ".pq_" in name:
            assert all(part.tobytes() == expected.tobytes() for part in parts), name
            continue
        if name == "token_starts":
            firsts = np.cumsum([0] + [part[-1] for part in parts[:-1]])
            parts = [part[:-1] + first for part, first in zip(parts, firsts, strict=True)]
            parts.append(np.asarray([firsts[-1] + zarr_array(shards[-1] / name)[-1]]))
        joined = np.concatenate(parts)
        assert joined.dtype == expected.dtype and joined.shape == expected.shape, name
        assert joined.tobytes() == expected.tobytes(), f"{name} differs"
