"""File digests of a passage cache: recorded in its manifest at build time, checked on open.

A cache folder's manifest (each shard's own, for a sharded cache) records, for every file it
holds (`files`: name -> record):

    bytes           the size
    sha256          of every byte
    sampled_sha256  of DIGEST_SAMPLE["blocks"] blocks of DIGEST_SAMPLE["block_bytes"] spread
                    evenly over the file, first byte to last (`sample_spans`); the whole file
                    when it is no larger than the sample, so small files are checked whole
    mtime_ns        the modification time the file had when the cache was finished

Why two digests: hashing every byte of a cache costs as much as opening an index several times
over (measured in docs/open_domain.md, "Integrity checks"), because the states are memory-mapped
and opening reads almost none of them.
So opening checks (`verify_folder`, `full=False`):

  - each file's size, and its sampled blocks: catches truncation or growth, a file replaced by
    another build's (another model, k or corpus), and damage that hits a sampled block;
  - each file's modification time: any write through the file system after the build (a
    program writing into the file, an editor, a partial copy over it) changes it, and then that
    file's every byte is hashed before it is used. A copy that does not keep times (`cp -r`)
    costs that full hash on every open until the times are recorded again (`dil-jax index
    --verify`, or a rerun of `dil-jax index`), and says so.

What only the full check (`full=True`: `dil-jax index --verify`) catches: bytes changed without
a write through the file system (a failing disk or memory, bit rot), or with the time put back,
outside the sampled blocks.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Sampled blocks per file and their size: 32 x 64 KiB = 2 MiB read per file, a few ms warm.
DIGEST_SAMPLE = {"blocks": 32, "block_bytes": 1 << 16}
# Files of a cache folder that are not part of the finished cache (the manifest holds the
# records; the plan and progress records exist only while building).
UNRECORDED = frozenset({"manifest.json", "plan.json", "progress.json"})
_READ_BYTES = 1 << 20


def sample_spans(size: int, blocks: int, block_bytes: int) -> list[tuple[int, int]]:
    """(offset, length) of the sampled blocks of a file of `size` bytes: `blocks` blocks of
    `block_bytes`, the first at offset 0, the last ending at the last byte, the others evenly
    between; one span of the whole file when it is no larger than the sample."""
    if size <= blocks * block_bytes:
        return [(0, size)]
    last = size - block_bytes
    return [(number * last // (blocks - 1), block_bytes) for number in range(blocks)]


def sampled_sha256(path: Path, size: int, sample: dict[str, int]) -> str:
    """sha256 of the file's sampled blocks (`sample_spans` of `size`), concatenated."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for offset, length in sample_spans(size, sample["blocks"], sample["block_bytes"]):
            stream.seek(offset)
            digest.update(stream.read(length))
    return digest.hexdigest()


def full_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(_READ_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def file_record(path: Path, sample: dict[str, int] = DIGEST_SAMPLE) -> dict[str, Any]:
    """The manifest's record of one finished file (its bytes are read once, whole)."""
    status = path.stat()
    return dict(bytes=status.st_size, sha256=full_sha256(path),
                sampled_sha256=sampled_sha256(path, status.st_size, sample),
                mtime_ns=status.st_mtime_ns)


def recorded_files(folder: Path) -> list[str]:
    """The files of a finished cache folder that its manifest records: every plain file but
    the manifest and the build's records (not subfolders: each shard records its own)."""
    return sorted(entry.name for entry in folder.iterdir()
                  if entry.is_file() and entry.name not in UNRECORDED)


def digest_fields(folder: Path) -> dict[str, Any]:
    """The manifest fields recording every file of `folder` (`files`, `digest_sample`): a
    `CacheManifest`'s `digests`."""
    return dict(digest_sample=dict(DIGEST_SAMPLE),
                files={name: file_record(folder / name) for name in recorded_files(folder)})


@dataclasses.dataclass
class FolderCheck:
    """What `verify_folder` found in one cache folder.

    problems: (file, what differs) of each file that is missing or differs from its record.
    rehashed: files whose modification time differs from the record but whose every byte
    matches (a copy that did not keep times): their new times can be recorded.
    digested: whether the manifest records digests at all (caches written before they
    existed do not). files: files checked; bytes_hashed: bytes read by the check.
    """

    folder: Path
    problems: list[tuple[Path, str]] = dataclasses.field(default_factory=list)
    rehashed: list[str] = dataclasses.field(default_factory=list)
    digested: bool = True
    files: int = 0
    bytes_hashed: int = 0


def _sample_of(digests: Mapping[str, Any]) -> dict[str, int] | None:
    """The digest_sample when it is well formed (else None: the records cannot be checked
    cheaply, and every file is hashed whole)."""
    sample = digests.get("digest_sample")
    if (isinstance(sample, dict) and isinstance(sample.get("blocks"), int)
            and isinstance(sample.get("block_bytes"), int) and sample["blocks"] >= 2
            and sample["block_bytes"] >= 1):
        return sample
    return None


def verify_folder(folder: Path, digests: Mapping[str, Any] | None, full: bool) -> FolderCheck:
    """Checks every file `digests` ({digest_sample, files}: `digest_fields`, a manifest's
    record; None where it has none) records against its record (module docstring: what `full`
    adds). Never raises for a differing file: the caller decides (opening refuses the cache at
    the first problem; `dil-jax index --verify` lists them all)."""
    check = FolderCheck(folder)
    files = (digests or {}).get("files")
    if not isinstance(files, dict):
        check.digested = False
        return check
    sample = _sample_of(digests)
    for name, record in sorted(files.items()):
        check.files += 1
        path = folder / name
        if not isinstance(record, dict) or Path(name).name != name:
            check.problems.append((folder / "manifest.json", f"files[{name!r}] is not a record"))
            continue
        try:
            status = path.stat()
        except FileNotFoundError:
            check.problems.append((path, "the file is missing"))
            continue
        if status.st_size != record.get("bytes"):
            check.problems.append((path, f"{status.st_size} bytes, the manifest recorded "
                                         f"{record.get('bytes')} at build time"))
            continue
        touched = status.st_mtime_ns != record.get("mtime_ns")
        if full or touched or sample is None:
            check.bytes_hashed += status.st_size
            if full_sha256(path) != record.get("sha256"):
                check.problems.append((path, "its sha256 differs from the one recorded at build "
                                             "time: the file changed since the cache was built"))
            elif touched:
                check.rehashed.append(name)
            continue
        check.bytes_hashed += sum(length for _, length in sample_spans(
            status.st_size, sample["blocks"], sample["block_bytes"]))
        if sampled_sha256(path, status.st_size, sample) != record.get("sampled_sha256"):
            check.problems.append((path, "the sha256 of its sampled blocks differs from the one "
                                         "recorded at build time: the file changed since the "
                                         "cache was built"))
    return check


def refreshed_digests(folder: Path, digests: Mapping[str, Any] | None, check: FolderCheck
                      ) -> dict[str, Any]:
    """The digests to record after `check`: every file hashed as it is now where it found none,
    else `digests` with the new modification times of the files it rehashed (their bytes
    matched)."""
    if not check.digested:
        return digest_fields(folder)
    files = dict(digests["files"])
    for name in check.rehashed:
        files[name] = dict(files[name], mtime_ns=(folder / name).stat().st_mtime_ns)
    return dict(digests, files=files)
