"""Where a passage cache is: a local folder, or a URL of an object store that tensorstore's
kvstore opens.

    Location.of("runs/index/cache-k2-acfc4806")          a local folder (a path)
    Location.of("gs://bucket/index/cache-k2-acfc4806")   Google Cloud Storage (kvstore `gcs`)
    Location.of("s3://bucket/index/cache-k2-acfc4806")   Amazon S3 and compatible (`s3`)
    Location.of("file:///data/index/cache-k2-acfc4806")  a local folder read through the
                                                        kvstore (`file`), as an object store

A cache's arrays are zarr v3 arrays under it (`dil_jax.open_domain.cache.zarr_store`); its
manifests and digests are read through `read_bytes` and `objects`, so a reader needs no
file system for a cache at a URL. Only local folders and file:// URLs are tested here.

Writing: `dil-jax index` writes a local cache into a staging folder renamed into place; a cache
at a URL (`dil-jax index --cache-store URL`, `dil_jax.open_domain.cache.store_build`) has no
rename, so it is written object by object (`write_bytes`: each object whole or not at all) and
made visible by its manifest, written last. The drivers meant: `gcs` (gs://, a TPU pod's
bucket), `s3` (s3://, S3 and compatible stores), `file` (file://, a local or mounted folder:
what the tests use as the remote).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from pathlib import Path

from dil_jax.open_domain.cache.digests import KvObjects, LocalObjects, Objects

_URL = re.compile(r"^[a-z][a-z0-9+.-]*://")


def store_failure(where: object, error: ValueError) -> Exception:
    """A store's refusal of a write (tensorstore's ValueError: no such bucket, no credentials,
    a file in the way of a file:// folder) as one error naming the object and what to check."""
    from dil_jax.errors import OutputPathError

    return OutputPathError(f"{where}: cannot write it ({error}); check the store's URL "
                           "(--cache-store) and this machine's credentials for it")


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

    def write_bytes(self, name: str, data: bytes) -> None:
        """Writes the file `name` in this folder whole: a local file by write-then-rename
        (a full disk is named: `cache.disk.write_errors`), an object by one write, which an
        object store shows whole or not at all (tensorstore's file driver, too, writes a
        temporary file and renames it)."""
        if self.path is not None:
            from dil_jax.atomic import write_atomic
            from dil_jax.open_domain.cache.disk import write_errors

            with write_errors(self.path / name):
                write_atomic(self.path / name, data)
            return
        try:
            _kvstore(f"{self.url}/").write(name, data).result()
        except ValueError as error:
            raise store_failure(self / name, error) from error

    def delete(self, name: str) -> None:
        """Removes the file `name` in this folder (nothing if it is missing)."""
        if self.path is not None:
            (self.path / name).unlink(missing_ok=True)
            return
        try:
            _kvstore(f"{self.url}/").write(name, None).result()
        except ValueError as error:
            raise store_failure(self / name, error) from error

    def names(self) -> list[str]:
        """Every file under this folder (objects under its prefix), by `/`-separated path
        inside it, sorted; [] when there is none."""
        if self.path is not None:
            if not self.path.is_dir():
                return []
            return sorted(path.relative_to(self.path).as_posix()
                          for path in self.path.rglob("*") if path.is_file())
        return sorted(key.decode("utf-8") for key in _kvstore(f"{self.url}/").list().result())

    def delete_all(self) -> None:
        """Removes everything under this folder (at a URL: every object under its prefix;
        tensorstore's file driver may leave empty folders, which hold nothing)."""
        if self.path is not None:
            import shutil

            shutil.rmtree(self.path, ignore_errors=True)
            return
        import tensorstore as ts

        try:
            _kvstore(f"{self.url}/").delete_range(ts.KvStore.KeyRange()).result()
        except ValueError as error:
            raise store_failure(self, error) from error

    def objects(self) -> Objects:
        """Its files, for the digest checks (`cache.digests`)."""
        return LocalObjects(self.path) if self.path is not None else KvObjects(self.url)
