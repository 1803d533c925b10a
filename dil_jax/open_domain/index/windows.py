"""An index's windows (`windows.npz`): which cache rows belong to which passage, and each
window's tokens, written a block of passages at a time and read by rows.

    windows.npz   an uncompressed .npz (what np.savez writes) of
                    first, count     [num_passages] int64: passage i is windows (cache rows)
                                     first[i] .. first[i] + count[i] - 1
                    passage_of_row   [num_windows] int32: the passage of each window
                    ids, mask        [num_windows, max_passage_len] int32 (`p_window [SEP]`)
                    offsets          [num_windows, max_passage_len, 2] int32
                    max_context      [num_windows, max_passage_len] bool

`write_windows` cuts the passages into windows WINDOW_BLOCK passages at a time
(`window_contexts`, which works text by text: the same windows as all at once), appending each
member to a raw file, then writes the .npz from those files: memory holds one block, whatever
the corpus. `window_member` opens one member of the .npz in place, read by rows with positional
reads (`dil_jax.file_array.FileArray`; np.load would read it whole, a memory map would leave the
pages it touched resident), so an opened index holds none of them in memory: a question reads
the rows of its retrieved passages.
"""

from __future__ import annotations

import dataclasses
import shutil
import struct
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from dil_jax.data.features import window_contexts
from dil_jax.file_array import FileArray

WINDOWS_FILE = "windows.npz"
# The members, in the order the file holds them.
MEMBERS = ("first", "count", "passage_of_row", "ids", "mask", "offsets", "max_context")
# Passages cut into windows at a time (what `write_windows` holds in memory).
WINDOW_BLOCK = 4096
_COPY_BYTES = 1 << 20
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # a zip local file header, 30 bytes
_LOCAL_SIGNATURE = b"PK\x03\x04"


def _blocks(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    block = []
    for text in texts:
        block.append(text)
        if len(block) == size:
            yield block
            block = []
    if block:
        yield block


def write_windows(path: Path, texts: Iterable[str], tokenizer, *, max_passage_len: int,
                  doc_stride: int, block: int = WINDOW_BLOCK) -> int:
    """Writes windows.npz at `path` (a staging folder's: a plain write) of `texts`, iterated
    once, `block` at a time; returns the number of windows."""
    raw = {name: path.with_name(f"{path.name}.{name}.raw") for name in MEMBERS}
    shapes = {name: (0,) for name in MEMBERS}
    dtypes: dict[str, np.dtype] = {}
    passages = rows = 0
    streams = {name: file.open("wb") for name, file in raw.items()}
    try:
        for texts_block in _blocks(texts, block):
            windows = window_contexts(tokenizer, texts_block, max_passage_len=max_passage_len,
                                      doc_stride=doc_stride)
            values = dict(first=windows.first_window + rows, count=windows.counts,
                          passage_of_row=windows.context_index + passages, ids=windows.ids,
                          mask=windows.mask, offsets=windows.offsets,
                          max_context=windows.max_context)
            for name, array in values.items():
                array = np.ascontiguousarray(array)
                dtypes.setdefault(name, array.dtype)
                streams[name].write(array.astype(dtypes[name], copy=False).tobytes())
                shapes[name] = (shapes[name][0] + len(array),) + array.shape[1:]
            passages += len(texts_block)
            rows += len(windows.ids)
    finally:
        for stream in streams.values():
            stream.close()
    if not passages:  # no passage: every member empty, of the shape window_contexts gives
        empty = window_contexts(tokenizer, [], max_passage_len=max_passage_len,
                                doc_stride=doc_stride)
        dtypes = dict(first=empty.first_window.dtype, count=empty.counts.dtype,
                      passage_of_row=empty.context_index.dtype, ids=empty.ids.dtype,
                      mask=empty.mask.dtype, offsets=empty.offsets.dtype,
                      max_context=empty.max_context.dtype)
        shapes = dict(first=(0,), count=(0,), passage_of_row=(0,),
                      ids=(0, max_passage_len), mask=(0, max_passage_len),
                      offsets=(0, max_passage_len, 2), max_context=(0, max_passage_len))
    try:
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name in MEMBERS:
                with archive.open(f"{name}.npy", "w", force_zip64=True) as out, \
                        raw[name].open("rb") as source:
                    np.lib.format.write_array_header_1_0(out, dict(
                        descr=np.lib.format.dtype_to_descr(np.dtype(dtypes[name])),
                        fortran_order=False, shape=shapes[name]))
                    shutil.copyfileobj(source, out, _COPY_BYTES)
    finally:
        for file in raw.values():
            file.unlink(missing_ok=True)
    return rows


def _member_layout(path: Path, name: str) -> tuple[int, tuple[int, ...], np.dtype, bool]:
    """(byte offset of the data, shape, dtype, fortran order) of the member `name` of an
    uncompressed .npz; ValueError when it is missing, compressed or not an array."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(f"{name}.npy")  # KeyError when missing
    if info.compress_type != zipfile.ZIP_STORED:
        raise ValueError(f"member {name}.npy is compressed; it cannot be read in place")
    with path.open("rb") as stream:
        stream.seek(info.header_offset)
        header = stream.read(_LOCAL_HEADER.size)
        if len(header) != _LOCAL_HEADER.size or header[:4] != _LOCAL_SIGNATURE:
            raise ValueError(f"member {name}.npy: no zip header at {info.header_offset}")
        *_, name_bytes, extra_bytes = _LOCAL_HEADER.unpack(header)
        stream.seek(info.header_offset + _LOCAL_HEADER.size + name_bytes + extra_bytes)
        version = np.lib.format.read_magic(stream)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                       else np.lib.format.read_array_header_2_0)
        shape, fortran_order, dtype = read_header(stream)
        offset = stream.tell()
    if offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize > \
            info.header_offset + _LOCAL_HEADER.size + name_bytes + extra_bytes + info.file_size:
        raise ValueError(f"member {name}.npy is shorter than its header says")
    return offset, tuple(shape), np.dtype(dtype), bool(fortran_order)


def window_member(path: Path, name: str) -> FileArray:
    """The member `name` of an uncompressed .npz (`write_windows`', or np.savez's), read by
    rows from the file (`FileArray`); ValueError when it is missing (KeyError), compressed,
    not an array, or not in C order."""
    offset, shape, dtype, fortran_order = _member_layout(path, name)
    if fortran_order and len(shape) > 1:
        raise ValueError(f"member {name}.npy is in Fortran order; it cannot be read by rows")
    return FileArray(path, offset, shape, dtype)


def member_blocks(path: Path, name: str, rows: int = 1 << 20) -> Iterator[np.ndarray]:
    """The 1-D member `name` of an uncompressed .npz, `rows` values at a time, read with plain
    reads (not mapped: a scan of it leaves nothing resident)."""
    offset, shape, dtype, _ = _member_layout(path, name)
    with path.open("rb") as stream:
        stream.seek(offset)
        for start in range(0, shape[0], rows):
            count = min(rows, shape[0] - start)
            yield np.frombuffer(stream.read(count * dtype.itemsize), dtype, count)


@dataclasses.dataclass(frozen=True)
class WindowCounts:
    """The largest window counts of an index's passages (largest first) and its windows in all:
    what bounds the rows a batch of questions can read (`dil_jax.serve.shapes`)."""

    largest: np.ndarray
    total: int

    @classmethod
    def of(cls, blocks: Iterable[np.ndarray], top: int) -> WindowCounts:
        """From the window counts of every passage, a block at a time; keeps `top`."""
        largest, total = np.zeros(0, np.int64), 0
        for block in blocks:
            block = np.asarray(block, np.int64)
            total += int(block.sum())
            largest = np.sort(np.concatenate([largest, block]))[::-1][:top]
        return cls(largest, total)


@dataclasses.dataclass
class PassageWindows:
    """Cache rows of each passage: rows first[i] .. first[i] + count[i] - 1 are passage i's.

    first, count: [num_passages]; passage_of_row: [n_rows] passage index of each cache row
    (FileArrays of windows.npz, or arrays: a lookup reads only the rows it asks for).
    """

    first: FileArray | np.ndarray
    count: FileArray | np.ndarray
    passage_of_row: FileArray | np.ndarray
    path: Path | None = None

    @classmethod
    def open(cls, path: Path) -> PassageWindows:
        return cls(*(window_member(path, name) for name in ("first", "count",
                                                            "passage_of_row")), path)

    def rows_of(self, passages: Sequence[int]) -> np.ndarray:
        """Cache rows of these passages, in order."""
        if not len(passages):
            return np.zeros(0, np.int64)
        passages = np.asarray(passages)
        return np.concatenate([np.arange(self.first[p], self.first[p] + self.count[p])
                               for p in passages])

    def counts(self, top: int) -> WindowCounts:
        """The `top` largest window counts and the windows in all, from windows.npz read a
        block at a time (nothing of it left resident)."""
        if self.path is None:
            return WindowCounts.of([np.asarray(self.count)], top)
        return WindowCounts.of(member_blocks(self.path, "count"), top)


def window_arrays(path: Path) -> dict[str, FileArray]:
    """ids, mask, offsets, max_context of every window of windows.npz at `path` (what a passage
    cache is built from, and a reader's span decoding reads), read by rows (`FileArray`)."""
    return {name: window_member(path, name) for name in ("ids", "mask", "offsets",
                                                         "max_context")}
