"""File digests of a passage cache: recorded in its manifest at build time, checked on open.

A cache folder's manifest (each shard's own, for a sharded cache) records, for every file it
holds (`files`: name -> record; a name is the file's path in the folder, `states/c/3/0` for a
chunk file of a zarr array, the files of shards/ left to each shard's own manifest):

    bytes           the size
    sha256          of every byte
    sampled_sha256  of DIGEST_SAMPLE["blocks"] blocks of DIGEST_SAMPLE["block_bytes"] spread
                    evenly over the file, first byte to last (`sample_spans`); the whole file
                    when it is no larger than the sample, so small files are checked whole
    mtime_ns        the modification time the file had when the cache was finished

Why two digests: hashing every byte of a cache costs as much as opening an index several times
over (measured in docs/open_domain.md, "Integrity checks"), because opening reads almost none
of the states (they are read by rows).
So opening checks (`verify_folder`, `full=False`):

  - each file's size, and the sampled blocks of up to SAMPLED_FILES of its files (all of them
    in a folder of that many or fewer; else that many, evenly spread over the sorted names):
    catches truncation or growth, a file replaced by another build's (another model, k or
    corpus), and damage that hits a sampled block;
  - each file's modification time: any write through the file system after the build (a
    program writing into the file, an editor, a partial copy over it) changes it, and then that
    file's every byte is hashed before it is used. A copy that does not keep times (`cp -r`)
    costs that full hash on every open until the times are recorded again (`dil-jax index
    --verify`, or a rerun of `dil-jax index`), and says so.

What only the full check (`full=True`: `dil-jax index --verify`) catches: bytes changed without
a write through the file system (a failing disk or memory, bit rot), or with the time put back,
outside the sampled blocks. (In a ragged cache every chunk of a zarr array also carries its
crc32c, which tensorstore checks whenever the chunk is read: such a change in the rows a
question reads is refused then, naming the file.)

The files are read through `Objects`: `LocalObjects` for a folder (sizes and modification times
from the file system), `KvObjects` for a cache at a URL (tensorstore's kvstore: gs://, s3://,
file://), which has no modification time to compare, so there every open checks the sizes and
sampled blocks only.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

# Sampled blocks per file and their size: 32 x 64 KiB = 2 MiB read per file, a few ms warm.
DIGEST_SAMPLE = {"blocks": 32, "block_bytes": 1 << 16}
# Files whose blocks one open samples, per folder: a ragged cache's arrays are many chunk files,
# and sampling every one would read 2 MiB per file on every open.
SAMPLED_FILES = 16
# Files of a cache folder that are not part of the finished cache (the manifest holds the
# records; the plan and progress records exist only while building).
UNRECORDED = frozenset({"manifest.json", "plan.json", "progress.json"})
# The shards of a sharded cache: each records its own files.
SHARDS_DIR = "shards"
_READ_BYTES = 1 << 20


class Objects(Protocol):
    """The files of one cache folder, by name (a path inside the folder, `/`-separated)."""

    def where(self, name: str) -> object:
        """The file's path or URL, for messages."""

    def size_problem(self, name: str, size: int) -> str | None:
        """Why the file is not `size` bytes ("the file is missing", ...), or None if it is."""

    def stamp(self, name: str) -> int | None:
        """Its modification time (ns), None where the store keeps none."""

    def read(self, name: str, offset: int, length: int) -> bytes:
        """`length` bytes from `offset` (fewer at the end)."""


class LocalObjects:
    """The files of a local folder."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def where(self, name: str) -> Path:
        return self.folder / name

    def size_problem(self, name: str, size: int) -> str | None:
        try:
            actual = (self.folder / name).stat().st_size
        except FileNotFoundError:
            return "the file is missing"
        return (None if actual == size else
                f"{actual} bytes, the manifest recorded {size} at build time")

    def stamp(self, name: str) -> int | None:
        return (self.folder / name).stat().st_mtime_ns

    def read(self, name: str, offset: int, length: int) -> bytes:
        with (self.folder / name).open("rb") as stream:
            stream.seek(offset)
            return stream.read(length)


class KvObjects:
    """The objects under a URL that tensorstore's kvstore opens (gs://, s3://, file://)."""

    def __init__(self, url: str):
        import tensorstore as ts

        self.url = url.rstrip("/") + "/"
        self.store = ts.KvStore.open(self.url).result()

    def where(self, name: str) -> str:
        return self.url + name

    def _read(self, name: str, start: int, stop: int):
        return self.store.read(name, byte_range=slice(start, stop)).result()

    def size_problem(self, name: str, size: int) -> str | None:
        # No size without a read: a byte range ending at `size` must exist, one past it not.
        try:
            if self._read(name, 0, 0).state == "missing":
                return "the file is missing"
            if size:
                self._read(name, size - 1, size)
        except ValueError:
            return f"shorter than the {size} bytes the manifest recorded at build time"
        try:
            self._read(name, size, size + 1)
        except ValueError:
            return None  # OUT_OF_RANGE: nothing past `size`
        return f"longer than the {size} bytes the manifest recorded at build time"

    def stamp(self, name: str) -> int | None:
        return None

    def read(self, name: str, offset: int, length: int) -> bytes:
        try:
            return bytes(self._read(name, offset, offset + length).value)
        except ValueError:  # the range runs past the end: read to the end instead
            return bytes(self.store.read(name, byte_range=slice(offset, None)).result().value)


def sample_spans(size: int, blocks: int, block_bytes: int) -> list[tuple[int, int]]:
    """(offset, length) of the sampled blocks of a file of `size` bytes: `blocks` blocks of
    `block_bytes`, the first at offset 0, the last ending at the last byte, the others evenly
    between; one span of the whole file when it is no larger than the sample."""
    if size <= blocks * block_bytes:
        return [(0, size)]
    last = size - block_bytes
    return [(number * last // (blocks - 1), block_bytes) for number in range(blocks)]


def sampled_sha256(objects: Objects, name: str, size: int, sample: dict[str, int]) -> str:
    """sha256 of the file's sampled blocks (`sample_spans` of `size`), concatenated."""
    digest = hashlib.sha256()
    for offset, length in sample_spans(size, sample["blocks"], sample["block_bytes"]):
        digest.update(objects.read(name, offset, length))
    return digest.hexdigest()


def full_sha256(objects: Objects, name: str) -> str:
    digest, offset = hashlib.sha256(), 0
    while block := objects.read(name, offset, _READ_BYTES):
        digest.update(block)
        offset += len(block)
    return digest.hexdigest()


def file_record(folder: Path, name: str, sample: dict[str, int] = DIGEST_SAMPLE
                ) -> dict[str, Any]:
    """The manifest's record of one finished file of a local folder (read once, whole)."""
    objects, status = LocalObjects(folder), (folder / name).stat()
    return dict(bytes=status.st_size, sha256=full_sha256(objects, name),
                sampled_sha256=sampled_sha256(objects, name, status.st_size, sample),
                mtime_ns=status.st_mtime_ns)


def recorded_names(names: list[str]) -> list[str]:
    """Of the files of a finished cache folder (`/`-separated paths inside it), those its
    manifest records: all but the manifest, the build's records and shards/ (each shard
    records its own), sorted."""
    return sorted(name for name in names
                  if name not in UNRECORDED and PurePosixPath(name).parts[0] != SHARDS_DIR)


def recorded_files(folder: Path) -> list[str]:
    """The files of a finished local cache folder that its manifest records (`recorded_names`
    of every file under it, a zarr array's chunk files too)."""
    return recorded_names([path.relative_to(folder).as_posix()
                           for path in folder.rglob("*") if path.is_file()])


def object_record(objects: Objects, name: str, sample: dict[str, int] = DIGEST_SAMPLE
                  ) -> dict[str, Any]:
    """The manifest's record of one finished object of a store (`KvObjects`; read whole once,
    a block at a time): `file_record`'s fields, mtime_ns None (a store keeps no time that
    `KvObjects` compares, so an open checks its size and sampled blocks)."""
    digest, size = hashlib.sha256(), 0
    while block := objects.read(name, size, _READ_BYTES):
        digest.update(block)
        size += len(block)
    return dict(bytes=size, sha256=digest.hexdigest(),
                sampled_sha256=sampled_sha256(objects, name, size, sample), mtime_ns=None)


def object_digest_fields(objects: Objects, names: list[str]) -> dict[str, Any]:
    """`digest_fields` of a cache folder in a store: the records of `names` (its objects,
    `recorded_names` of them)."""
    return dict(digest_sample=dict(DIGEST_SAMPLE),
                files={name: object_record(objects, name) for name in recorded_names(names)})


def digest_fields(folder: Path) -> dict[str, Any]:
    """The manifest fields recording every file of `folder` (`files`, `digest_sample`): a
    `CacheManifest`'s `digests`."""
    return dict(digest_sample=dict(DIGEST_SAMPLE),
                files={name: file_record(folder, name) for name in recorded_files(folder)})


@dataclasses.dataclass
class FolderCheck:
    """What `verify_folder` found in one cache folder.

    problems: (file, what differs) of each file that is missing or differs from its record.
    rehashed: files whose modification time differs from the record but whose every byte
    matches (a copy that did not keep times): their new times can be recorded.
    digested: whether the manifest records digests at all (caches written before they
    existed do not). files: files checked; bytes_hashed: bytes read by the check.
    """

    folder: Path | Objects
    problems: list[tuple[object, str]] = dataclasses.field(default_factory=list)
    rehashed: list[str] = dataclasses.field(default_factory=list)
    digested: bool = True
    files: int = 0
    bytes_hashed: int = 0

    def where(self, name: str) -> object:
        """The path (or URL) of the file `name` of the folder checked."""
        return self.folder / name if isinstance(self.folder, Path) else self.folder.where(name)


def _sample_of(digests: Mapping[str, Any]) -> dict[str, int] | None:
    """The digest_sample when it is well formed (else None: the records cannot be checked
    cheaply, and every file is hashed whole)."""
    sample = digests.get("digest_sample")
    if (isinstance(sample, dict) and isinstance(sample.get("blocks"), int)
            and isinstance(sample.get("block_bytes"), int) and sample["blocks"] >= 2
            and sample["block_bytes"] >= 1):
        return sample
    return None


def sampled_names(names: list[str], limit: int = SAMPLED_FILES) -> set[str]:
    """The files (of sorted `names`) whose blocks an open samples: all when there are no more
    than `limit`, else `limit` of them evenly spread, first and last included."""
    if len(names) <= limit:
        return set(names)
    return {names[number * (len(names) - 1) // (limit - 1)] for number in range(limit)}


def _safe_name(name: str) -> bool:
    """A recorded name is a relative path inside the folder (no `..`, not absolute)."""
    path = PurePosixPath(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts


def verify_folder(folder: Path | Objects, digests: Mapping[str, Any] | None, full: bool
                  ) -> FolderCheck:
    """Checks every file `digests` ({digest_sample, files}: `digest_fields`, a manifest's
    record; None where it has none) records against its record (module docstring: what `full`
    adds). `folder`: a local folder, or the Objects of a cache at a URL. Never raises for a
    differing file: the caller decides (opening refuses the cache at the first problem;
    `dil-jax index --verify` lists them all)."""
    objects = LocalObjects(folder) if isinstance(folder, Path) else folder
    check = FolderCheck(folder)
    files = (digests or {}).get("files")
    if not isinstance(files, dict):
        check.digested = False
        return check
    sample = _sample_of(digests)
    sampled = sampled_names(sorted(files))
    for name, record in sorted(files.items()):
        check.files += 1
        if not isinstance(record, dict) or not _safe_name(name):
            check.problems.append((objects.where("manifest.json"),
                                   f"files[{name!r}] is not a record"))
            continue
        size = record.get("bytes")
        problem = (objects.size_problem(name, size) if isinstance(size, int)
                   else "no size recorded")
        if problem:
            check.problems.append((objects.where(name), problem))
            continue
        stamp = objects.stamp(name)
        touched = stamp is not None and stamp != record.get("mtime_ns")
        if full or touched or sample is None:
            check.bytes_hashed += size
            if full_sha256(objects, name) != record.get("sha256"):
                check.problems.append((objects.where(name),
                                       "its sha256 differs from the one recorded at build time:"
                                       " the file changed since the cache was built"))
            elif touched:
                check.rehashed.append(name)
            continue
        if name not in sampled:
            continue
        check.bytes_hashed += sum(length for _, length in sample_spans(
            size, sample["blocks"], sample["block_bytes"]))
        if sampled_sha256(objects, name, size, sample) != record.get("sampled_sha256"):
            check.problems.append((objects.where(name),
                                   "the sha256 of its sampled blocks differs from the one "
                                   "recorded at build time: the file changed since the cache "
                                   "was built"))
    return check


def refreshed_digests(folder: Path, digests: Mapping[str, Any] | None, check: FolderCheck
                      ) -> dict[str, Any]:
    """The digests to record after `check` of a local folder: every file hashed as it is now
    where it found none, else `digests` with the new modification times of the files it
    rehashed (their bytes matched)."""
    if not check.digested:
        return digest_fields(folder)
    files = dict(digests["files"])
    for name in check.rehashed:
        files[name] = dict(files[name], mtime_ns=(folder / name).stat().st_mtime_ns)
    return dict(digests, files=files)
