"""Where a passage cache is: a local folder, or a URL of an object store that tensorstore's
kvstore opens.

    Location.of("runs/index/cache-k2-acfc4806")          a local folder (a path)
    Location.of("gs://bucket/index/cache-k2-acfc4806")   Google Cloud Storage (kvstore `gcs`)
    Location.of("s3://bucket/index/cache-k2-acfc4806")   Amazon S3 and compatible (`s3`)
    Location.of("file:///data/index/cache-k2-acfc4806")  a local folder read through the
                                                        kvstore (`file`), as an object store

A cache's arrays are zarr v3 arrays under it (`dil_jax.open_domain.cache.zarr_store`); its
manifests and digests are read through `read_bytes` and `objects`, so a reader needs no
file system for a cache at a URL. Only local folders and file:// URLs are tested here; writing
(`dil-jax index`) is to local folders (a staging folder renamed into place).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from pathlib import Path

from dil_jax.open_domain.cache.digests import KvObjects, LocalObjects, Objects

_URL = re.compile(r"^[a-z][a-z0-9+.-]*://")


@functools.lru_cache(maxsize=64)
def _kvstore(url: str):
    """The tensorstore KvStore of a folder URL (one per URL: opening one costs a round trip)."""
    import tensorstore as ts

    return ts.KvStore.open(url).result()


@dataclasses.dataclass(frozen=True)
class Location:
    """A cache folder: `path` (local) or `url` (no trailing `/`), exactly one of them."""

    path: Path | None = None
    url: str | None = None

    @classmethod
    def of(cls, value: str | os.PathLike | Location) -> Location:
        if isinstance(value, Location):
            return value
        text = os.fspath(value)
        if _URL.match(text):
            return cls(url=text.rstrip("/"))
        return cls(path=Path(text))

    @property
    def is_local(self) -> bool:
        return self.path is not None

    def __truediv__(self, name: str) -> Location:
        if self.path is not None:
            return Location(path=self.path / name)
        return Location(url=f"{self.url}/{name}")

    def __str__(self) -> str:
        return str(self.path) if self.path is not None else str(self.url)

    @property
    def name(self) -> str:
        """The last component (a cache's folder name)."""
        return self.path.name if self.path is not None else self.url.rsplit("/", 1)[-1]

    def kvstore(self) -> dict | str:
        """The tensorstore kvstore spec of this folder (a zarr array's `kvstore`)."""
        if self.path is not None:
            return {"driver": "file", "path": f"{self.path.absolute()}/"}
        return f"{self.url}/"

    def read_bytes(self, name: str) -> bytes | None:
        """The bytes of the file `name` in this folder; None when it is missing."""
        if self.path is not None:
            try:
                return (self.path / name).read_bytes()
            except FileNotFoundError:
                return None
        result = _kvstore(f"{self.url}/").read(name).result()
        return None if result.state == "missing" else bytes(result.value)

    def exists(self, name: str) -> bool:
        """Whether the file `name` is in this folder."""
        if self.path is not None:
            return (self.path / name).is_file()
        return self.read_bytes(name) is not None

    def objects(self) -> Objects:
        """Its files, for the digest checks (`cache.digests`)."""
        return LocalObjects(self.path) if self.path is not None else KvObjects(self.url)
