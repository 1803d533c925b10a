"""An index's windows (`windows.npz`): which cache rows belong to which passage, and each
window's tokens, written a block of passages at a time and read by rows.

    windows.npz   an uncompressed .npz (what np.savez writes) of
                    first, count       [num_passages] int64: passage i is windows (cache rows)
                                       first[i] .. first[i] + count[i] - 1
                    passage_of_row     [num_windows] int32: the passage of each window
                    row_start          [num_windows + 1] int64: window r's tokens are the flat
                                       tokens row_start[r] .. row_start[r + 1] - 1
                    token_ids          [num_tokens] int32 (`p_window [SEP]`, real tokens only)
                    token_offsets      [num_tokens, 2] int32
                    token_max_context  [num_tokens] bool
                    padding            [3] int64: the padded width (max_passage_len), the pad
                                       id and the offset of a padding slot

Only real tokens are stored: a window's padding slots are the same in every window (the pad id,
mask 0, `NO_OFFSET`, not max-context), so they are put back when its rows are read
(`RaggedRows`), and the mask is the row's length. The readers see the same padded
[num_windows, max_passage_len] arrays as before, at about half the bytes (a window's real tokens
are ~2/3 of its slots on Wikipedia text, and the mask is not stored). Indexes written before
(format /1) hold the padded arrays (`ids`, `mask`, `offsets`, `max_context`) and still open.

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
from dil_jax.file_array import FileArray, RowReader
from dil_jax.tokenization import NO_OFFSET

WINDOWS_FILE = "windows.npz"
# The members, in the order the file holds them.
MEMBERS = ("first", "count", "passage_of_row", "row_start", "token_ids", "token_offsets",
           "token_max_context", "padding")
# The padded members of indexes written before (format /1), read as they were.
PADDED_MEMBERS = ("first", "count", "passage_of_row", "ids", "mask", "offsets", "max_context")
# The padded arrays a reader asks for, and the ragged member each is read from.
TOKEN_MEMBERS = {"ids": "token_ids", "offsets": "token_offsets",
                 "max_context": "token_max_context"}
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


class WindowsError(ValueError):
    """Windows that cannot be stored without their padding: a row whose real tokens are not a
    prefix, or padding slots that are not the padding values (a bug of the windowing)."""


def ragged_block(ids: np.ndarray, mask: np.ndarray, offsets: np.ndarray,
                 max_context: np.ndarray, pad_id: int) -> dict[str, np.ndarray]:
    """The real tokens of padded windows and each window's token count.

    ids, mask, max_context: [n, width]; offsets: [n, width, 2].
    Returns length [n] int64 and token_ids [t] int32, token_offsets [t, 2] int32,
    token_max_context [t] bool (t = length.sum(): the rows' real tokens, row after row).
    WindowsError when padding back would not give these arrays again."""
    real = mask.astype(bool)
    length = real.sum(axis=1).astype(np.int64)
    column = np.arange(real.shape[1])
    if not np.array_equal(real, column[None, :] < length[:, None]):
        raise WindowsError("a window's mask is not its real tokens followed by padding")
    padding = ~real
    if (np.any(ids[padding] != pad_id) or np.any(offsets[padding] != NO_OFFSET)
            or np.any(max_context[padding])):
        raise WindowsError("a window's padding slots are not the pad id, no offset and not "
                           "max-context")
    return dict(length=length, token_ids=ids[real].astype(np.int32),
                token_offsets=offsets[real].astype(np.int32),
                token_max_context=max_context[real].astype(bool))


_MEMBER_DTYPES = dict(first=np.int64, count=np.int64, passage_of_row=np.int32,
                      row_start=np.int64, token_ids=np.int32, token_offsets=np.int32,
                      token_max_context=np.bool_, padding=np.int64)
_MEMBER_TAILS = dict(token_offsets=(2,))


def write_windows(path: Path, texts: Iterable[str], tokenizer, *, max_passage_len: int,
                  doc_stride: int, block: int = WINDOW_BLOCK) -> int:
    """Writes windows.npz at `path` (a staging folder's: a plain write) of `texts`, iterated
    once, `block` at a time, real tokens only (module docstring); returns the number of
    windows."""
    raw = {name: path.with_name(f"{path.name}.{name}.raw") for name in MEMBERS}
    lengths = dict.fromkeys(MEMBERS, 0)
    passages = rows = tokens = 0
    pad_id = int(tokenizer.pad_token_id)
    streams = {name: file.open("wb") for name, file in raw.items()}

    def append(name: str, array: np.ndarray) -> None:
        streams[name].write(np.ascontiguousarray(array, _MEMBER_DTYPES[name]).tobytes())
        lengths[name] += len(array)

    try:
        append("row_start", np.zeros(1))
        for texts_block in _blocks(texts, block):
            windows = window_contexts(tokenizer, texts_block, max_passage_len=max_passage_len,
                                      doc_stride=doc_stride)
            ragged = ragged_block(windows.ids, windows.mask, windows.offsets,
                                  windows.max_context, pad_id)
            append("first", windows.first_window + rows)
            append("count", windows.counts)
            append("passage_of_row", windows.context_index + passages)
            append("row_start", tokens + np.cumsum(ragged["length"]))
            for name in ("token_ids", "token_offsets", "token_max_context"):
                append(name, ragged[name])
            passages += len(texts_block)
            rows += len(windows.ids)
            tokens += int(ragged["length"].sum())
        append("padding", np.asarray([max_passage_len, pad_id, NO_OFFSET]))
    finally:
        for stream in streams.values():
            stream.close()
    try:
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name in MEMBERS:
                with archive.open(f"{name}.npy", "w", force_zip64=True) as out, \
                        raw[name].open("rb") as source:
                    np.lib.format.write_array_header_1_0(out, dict(
                        descr=np.lib.format.dtype_to_descr(np.dtype(_MEMBER_DTYPES[name])),
                        fortran_order=False,
                        shape=(lengths[name],) + _MEMBER_TAILS.get(name, ())))
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


def _has_member(path: Path, name: str) -> bool:
    with zipfile.ZipFile(path) as archive:
        return f"{name}.npy" in archive.namelist()


class RaggedRows(RowReader):
    """Padded rows [num_rows, width, *tail] of a windows file's real tokens, read by rows like
    a `FileArray`: `a[rows]`, `a[row]`, `a[start:stop]`, `a[rows, i]`, `np.asarray(a)`,
    `a.row_range(start, stop)`. A row is its tokens (`flat[row_start[r]:row_start[r + 1]]`)
    then `pad` up to `width`; with `flat` None, the row's mask (1 for its tokens, 0 after).

    flat: [num_tokens, *tail] (FileArray or array); row_start: [num_rows + 1] int64."""

    _name = "a windows file's rows"

    def __init__(self, flat: FileArray | np.ndarray | None,
                 row_start: FileArray | np.ndarray, width: int, pad: int | bool = 0,
                 dtype=None):
        self.flat, self.row_start, self.width, self.pad = flat, row_start, int(width), pad
        tail = () if flat is None else tuple(flat.shape[1:])
        self.shape = (len(row_start) - 1, self.width) + tail
        self.dtype = np.dtype(dtype or (np.int32 if flat is None else flat.dtype))
        self.ndim = len(self.shape)

    def row_range(self, start: int, stop: int) -> RaggedRows:
        """Rows start .. stop - 1 as a RaggedRows of their own (a shard's rows): nothing of
        the tokens read."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"rows {start}..{stop} of {len(self)} rows")
        starts = (self.row_start.row_range(start, stop + 1)
                  if isinstance(self.row_start, FileArray)
                  else self.row_start[start:stop + 1])
        return RaggedRows(self.flat, starts, self.width, self.pad, self.dtype)

    def _range(self, start: int, stop: int) -> np.ndarray:
        """Rows start .. stop - 1: one read of their starts, one of their tokens."""
        bounds = np.asarray(self.row_start[start:stop + 1], np.int64)
        lengths = np.diff(bounds)
        if lengths.size and (lengths.min() < 0 or lengths.max() > self.width):
            raise ValueError(f"windows file: a row of {int(lengths.max())} tokens in "
                             f"{self.width} slots (corrupt row_start?)")
        column = np.arange(self.width)
        real = column[None, :] < lengths[:, None]                       # [rows, width]
        if self.flat is None:
            return real.astype(self.dtype)
        out = np.full((stop - start,) + self.shape[1:], self.pad, self.dtype)
        if bounds.size > 1 and bounds[-1] > bounds[0]:
            out[real] = np.asarray(self.flat[int(bounds[0]):int(bounds[-1])])
        return out


def window_arrays(path: Path) -> dict[str, FileArray | RaggedRows]:
    """ids, mask, offsets, max_context [num_windows, max_passage_len(, 2)] of every window of
    windows.npz at `path` (what a passage cache is built from, and a reader's span decoding
    reads), padded as `window_contexts` makes them and read by rows: from the real tokens
    (`RaggedRows`), or from an older index's padded arrays (`FileArray`)."""
    if not _has_member(path, "row_start"):
        return {name: window_member(path, name) for name in ("ids", "mask", "offsets",
                                                             "max_context")}
    row_start = window_member(path, "row_start")
    width, pad_id, no_offset = (int(v) for v in np.asarray(window_member(path, "padding")))
    flat = {name: window_member(path, member) for name, member in TOKEN_MEMBERS.items()}
    if int(row_start[len(row_start) - 1]) != len(flat["ids"]):
        raise ValueError(f"{path}: row_start ends at {int(row_start[len(row_start) - 1])}, "
                         f"token_ids holds {len(flat['ids'])} tokens (truncated?)")
    return dict(ids=RaggedRows(flat["ids"], row_start, width, pad_id),
                mask=RaggedRows(None, row_start, width),
                offsets=RaggedRows(flat["offsets"], row_start, width, no_offset),
                max_context=RaggedRows(flat["max_context"], row_start, width, False))
