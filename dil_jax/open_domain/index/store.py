"""The passages of an index on disk, read by offset: nothing per passage is held in memory.

    index/
      passages.jsonl        one Passage per line, as JSON (UTF-8), in passage order
      passages.offsets.npy  int64 [num_passages + 1]: the byte offset of each line's start, then
                            the file's size (line i is bytes offsets[i] .. offsets[i + 1] - 1)

`write_passage_store` writes both from a stream of passages (one passage in memory at a time)
and returns their count and fingerprint; `PassageStore` reads a passage's line (and its two
offsets) with positional reads only when it is asked for (`store[i]`), so `ask` and `serve` hold
no passage texts (nor, unlike a memory map, the pages around the lines they read:
`dil_jax.file_array` says why). An index
written before the offsets file existed (the same passages.jsonl, no offsets) is opened by
finding its line starts once (`line_offsets`, 8 bytes per passage in memory).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import weakref
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import overload

import numpy as np

from dil_jax.file_array import FileArray, npy_rows
from dil_jax.open_domain.index.corpus import Passage

PASSAGES_FILE = "passages.jsonl"
OFFSETS_FILE = "passages.offsets.npy"
_BLOCK = 1 << 20  # bytes read at a time when scanning or copying


def passage_line(passage: Passage) -> bytes:
    """The line of `passage` in passages.jsonl (the bytes every index version writes)."""
    return (json.dumps(dataclasses.asdict(passage), ensure_ascii=False) + "\n").encode("utf-8")


class TextsFingerprint:
    """`cache.check.texts_fingerprint` of texts given one at a time: the sha256 of
    `json.dumps(list_of_texts)` (", " between items), without the list."""

    def __init__(self):
        self._digest = hashlib.sha256(b"[")
        self.count = 0

    def add(self, text: str) -> None:
        self._digest.update((", " if self.count else "").encode() + json.dumps(text).encode())
        self.count += 1

    def hexdigest(self) -> str:
        """The first 16 hex digits, as `short_sha256` gives them."""
        digest = self._digest.copy()
        digest.update(b"]")
        return digest.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class StoreSummary:
    """What index.json records of a stream of passages: their count and texts' fingerprint
    (`cache.check.texts_fingerprint`), and the UTF-8 bytes of their texts (what the in-memory
    BM25 engines' memory grows with, `retrieval.engines.check_engine_fits`)."""

    count: int
    fingerprint: str
    text_bytes: int


def summarize_passages(passages: Iterable[Passage]) -> StoreSummary:
    """The summary of `passages` (iterated once, nothing kept)."""
    fingerprint, text_bytes = TextsFingerprint(), 0
    for passage in passages:
        fingerprint.add(passage.text)
        text_bytes += len(passage.text.encode("utf-8"))
    return StoreSummary(fingerprint.count, fingerprint.hexdigest(), text_bytes)


def write_passage_store(passages: Iterable[Passage], folder: Path) -> StoreSummary:
    """Writes passages.jsonl and passages.offsets.npy into `folder` (a staging folder: both
    are plain writes) from `passages`, iterated once; returns their summary.

    The offsets go to a raw file as they come (memory: one block), then behind an .npy header
    once their count is known.
    """
    fingerprint, text_bytes, position = TextsFingerprint(), 0, 0
    raw = folder / (OFFSETS_FILE + ".raw")
    with (folder / PASSAGES_FILE).open("wb") as lines, raw.open("wb") as offsets:
        pending = [0]
        for passage in passages:
            line = passage_line(passage)
            lines.write(line)
            position += len(line)
            pending.append(position)
            if len(pending) >= _BLOCK // 8:
                offsets.write(np.asarray(pending, "<i8").tobytes())
                pending = []
            fingerprint.add(passage.text)
            text_bytes += len(passage.text.encode("utf-8"))
        offsets.write(np.asarray(pending, "<i8").tobytes())
    with (folder / OFFSETS_FILE).open("wb") as out, raw.open("rb") as source:
        np.lib.format.write_array_header_1_0(out, dict(
            descr="<i8", fortran_order=False, shape=(fingerprint.count + 1,)))
        while block := source.read(_BLOCK):
            out.write(block)
    raw.unlink()
    return StoreSummary(fingerprint.count, fingerprint.hexdigest(), text_bytes)


def line_offsets(path: Path) -> np.ndarray:
    """int64 [lines + 1]: the start of each "\\n"-ended line of the file at `path`, then its
    size (a last line without "\\n" counts too), scanned a block at a time."""
    starts, size = [np.zeros(1, np.int64)], path.stat().st_size
    with path.open("rb") as stream:
        base = 0
        while block := stream.read(_BLOCK):
            ends = np.flatnonzero(np.frombuffer(block, np.uint8) == ord("\n"))
            starts.append(base + ends.astype(np.int64) + 1)
            base += len(block)
    offsets = np.concatenate(starts)
    if offsets[-1] != size:  # no newline at the end: the last line ends at the file's end
        offsets = np.append(offsets, size)
    return offsets


class PassageStore(Sequence[Passage]):
    """The passages of passages.jsonl, read by offset with positional reads (module docstring).

    offsets: int64 [n + 1] line starts then the file size (passages.offsets.npy read by rows,
    or `line_offsets` for an index without it).
    """

    def __init__(self, path: Path, offsets: np.ndarray | FileArray):
        self.path = Path(path)
        self.offsets = offsets
        self._fd = os.open(self.path, os.O_RDONLY)
        weakref.finalize(self, os.close, self._fd)  # closed with the store

    @classmethod
    def open(cls, folder: Path) -> PassageStore:
        """The store in `folder`: its offsets file read by rows, or when there is none (an
        index written before it existed) the line starts found by scanning."""
        offsets_path = folder / OFFSETS_FILE
        if offsets_path.is_file():
            offsets = npy_rows(offsets_path)
        else:
            offsets = line_offsets(folder / PASSAGES_FILE)
        return cls(folder / PASSAGES_FILE, offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def line(self, index: int) -> bytes:
        """The raw line of passage `index` (without its newline)."""
        start, end = (int(value) for value in self.offsets[index:index + 2])
        return os.pread(self._fd, end - start, start).rstrip(b"\n")

    @overload
    def __getitem__(self, index: int) -> Passage: ...

    @overload
    def __getitem__(self, index: slice) -> list[Passage]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        index = int(index)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"passage {index} of {len(self)}")
        return Passage(**json.loads(self.line(index)))

    def __iter__(self) -> Iterator[Passage]:
        """Every passage in order, read sequentially (faster than by offset)."""
        with self.path.open("rb") as stream:
            for number, line in enumerate(stream):
                if number == len(self):
                    return
                yield Passage(**json.loads(line))

    def texts(self) -> Iterator[str]:
        """Each passage's text, in order."""
        return (passage.text for passage in self)
