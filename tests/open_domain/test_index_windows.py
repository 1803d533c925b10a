"""An index's windows.npz: written a block of passages at a time, real tokens only (padded back
when read), read in place by rows, by the open-domain reader for its retrieved windows only;
an older index's padded windows.npz still read."""

from __future__ import annotations

import io

import jax
import numpy as np
import pytest

from dil_jax.data.features import window_contexts
from dil_jax.file_array import FileArray
from dil_jax.open_domain.index.corpus import Document, split_documents
from dil_jax.open_domain.index.folder import build_index, build_reader_cache, open_index
from dil_jax.open_domain.index.windows import (
    MEMBERS,
    PADDED_MEMBERS,
    RaggedRows,
    WindowCounts,
    WindowsError,
    _member_layout,
    ragged_block,
    window_arrays,
    window_member,
    write_windows,
)
from dil_jax.open_domain.reader import OpenDomainReader
from dil_jax.readers import load_reader
from dil_jax.samples import SAMPLE_PASSAGES

P_LEN, STRIDE = 32, 16


def _all_at_once(tokenizer, texts) -> dict[str, np.ndarray]:
    """The members as `np.savez` wrote them from `window_contexts` of every text at once (the
    index before it streamed)."""
    windows = window_contexts(tokenizer, texts, max_passage_len=P_LEN, doc_stride=STRIDE)
    return dict(first=windows.first_window, count=windows.counts,
                passage_of_row=windows.context_index, ids=windows.ids, mask=windows.mask,
                offsets=windows.offsets, max_context=windows.max_context)


def test_windows_written_in_blocks_equal_all_at_once(tokenizer, tmp_path):
    texts = list(SAMPLE_PASSAGES) * 3
    path = tmp_path / "windows.npz"
    rows = write_windows(path, iter(texts), tokenizer, max_passage_len=P_LEN,
                         doc_stride=STRIDE, block=4)  # blocks cut passages 4 at a time
    expected = _all_at_once(tokenizer, texts)
    assert rows == len(expected["ids"]) and rows > len(texts)
    real = expected["mask"].astype(bool)
    with np.load(path) as written:  # an ordinary .npz to numpy
        assert sorted(written.files) == sorted(MEMBERS)
        for name in ("first", "count", "passage_of_row"):
            np.testing.assert_array_equal(written[name], expected[name], err_msg=name)
        # Real tokens only, row after row: what the padded arrays hold where the mask is 1.
        np.testing.assert_array_equal(written["token_ids"], expected["ids"][real])
        np.testing.assert_array_equal(written["token_offsets"], expected["offsets"][real])
        np.testing.assert_array_equal(written["token_max_context"],
                                      expected["max_context"][real])
        np.testing.assert_array_equal(np.diff(written["row_start"]), real.sum(1))
        assert written["row_start"][0] == 0
        assert written["padding"].tolist() == [P_LEN, tokenizer.pad_token_id, -1]
    # Read back padded, by rows, as window_contexts made them: this file's and np.savez's own
    # padded one (every index written before).
    saved = tmp_path / "saved.npz"
    buffer = io.BytesIO()
    np.savez(buffer, **expected)
    saved.write_bytes(buffer.getvalue())
    for file, kind in ((path, RaggedRows), (saved, FileArray)):
        arrays = window_arrays(file)
        for name in ("ids", "mask", "offsets", "max_context"):
            member = arrays[name]
            assert isinstance(member, kind), name
            assert member.shape == expected[name].shape, name
            assert np.asarray(member).dtype == expected[name].dtype, name
            np.testing.assert_array_equal(np.asarray(member), expected[name], err_msg=name)
            some = [len(member) - 1, 0, 1, 2, 2]  # runs, repeats, from the end
            np.testing.assert_array_equal(member[some], expected[name][some], err_msg=name)
            np.testing.assert_array_equal(member[1:4], expected[name][1:4], err_msg=name)
            np.testing.assert_array_equal(member[3], expected[name][3], err_msg=name)
            np.testing.assert_array_equal(member[[1, 2], 0], expected[name][[1, 2], 0],
                                          err_msg=name)
            part = member.row_range(1, 4)  # a shard's rows, read only when asked for
            assert isinstance(part, kind) and len(part) == 3
            np.testing.assert_array_equal(part[[2, 0]], expected[name][[3, 1]], err_msg=name)
            np.testing.assert_array_equal(np.stack(list(member)), expected[name], err_msg=name)
        for name in PADDED_MEMBERS[:3]:
            np.testing.assert_array_equal(np.asarray(window_member(file, name)), expected[name])
    # Fewer bytes: the padding slots and the mask are not stored.
    assert path.stat().st_size < saved.stat().st_size
    counts = WindowCounts.of([expected["count"][:5], expected["count"][5:]], 3)
    assert counts.total == rows
    assert counts.largest.tolist() == sorted(expected["count"].tolist(), reverse=True)[:3]


def test_no_passage_gives_an_empty_windows_file(tokenizer, tmp_path):
    path = tmp_path / "windows.npz"
    assert write_windows(path, iter([]), tokenizer, max_passage_len=P_LEN,
                         doc_stride=STRIDE) == 0
    arrays = window_arrays(path)
    assert arrays["ids"].shape == (0, P_LEN) and arrays["offsets"].shape == (0, P_LEN, 2)
    assert np.asarray(arrays["mask"]).shape == (0, P_LEN)


def test_windows_that_padding_would_not_give_back_are_refused():
    """A hand-made window of 3 tokens in 5 slots: stored as its 3 tokens; a mask with a hole,
    or a padding slot holding a token, cannot be padded back and is refused."""
    ids = np.array([[5, 6, 102, 0, 0]], np.int32)
    mask = np.array([[1, 1, 1, 0, 0]], np.int32)
    offsets = np.full((1, 5, 2), -1, np.int32)
    offsets[0, :2] = [[0, 3], [4, 9]]
    max_context = np.array([[True, True, False, False, False]])
    ragged = ragged_block(ids, mask, offsets, max_context, pad_id=0)
    assert ragged["length"].tolist() == [3]
    assert ragged["token_ids"].tolist() == [5, 6, 102]
    assert ragged["token_offsets"].tolist() == [[0, 3], [4, 9], [-1, -1]]
    assert ragged["token_max_context"].tolist() == [True, True, False]
    starts = np.array([0, 3])
    padded = RaggedRows(ragged["token_offsets"], starts, 5, -1)
    np.testing.assert_array_equal(padded[0], offsets[0])
    np.testing.assert_array_equal(RaggedRows(None, starts, 5)[0], mask[0])
    with pytest.raises(WindowsError, match="mask is not its real tokens"):
        ragged_block(ids, np.array([[1, 0, 1, 0, 0]], np.int32), offsets, max_context, 0)
    with pytest.raises(WindowsError, match="padding slots"):
        ragged_block(np.array([[5, 6, 102, 7, 0]], np.int32), mask, offsets, max_context, 0)


def test_a_compressed_or_cut_member_is_refused(tokenizer, tmp_path):
    expected = _all_at_once(tokenizer, SAMPLE_PASSAGES)
    compressed = tmp_path / "compressed.npz"
    np.savez_compressed(compressed, **expected)
    with pytest.raises(ValueError, match="member ids.npy is compressed"):
        window_member(compressed, "ids")
    path = tmp_path / "windows.npz"
    write_windows(path, iter(SAMPLE_PASSAGES), tokenizer, max_passage_len=P_LEN,
                  doc_stride=STRIDE)
    with pytest.raises(KeyError):
        window_member(path, "nothing")


@pytest.fixture(scope="module")
def reader_and_index(minilm_dir, tmp_path_factory):
    minilm = load_reader(minilm_dir, max_question_len=16, rng=jax.random.key(3))
    documents = [Document(f"d{i}", f"T{i}", text) for i, text in enumerate(SAMPLE_PASSAGES)]
    index = build_index(tmp_path_factory.mktemp("windows") / "index",
                        split_documents(documents, "paragraphs"), minilm.tokenizer,
                        max_passage_len=P_LEN, doc_stride=STRIDE,
                        split={"strategy": "paragraphs"})
    loaded = minilm.with_config(num_lower_layers=2)
    cache = build_reader_cache(index, loaded, encode=loaded.passage_encoder(batch_size=4))
    return loaded, index.directory, cache


def _answers(reader, question):
    return [(c.passage_index, c.text, c.char_start, c.char_end, c.reader_score)
            for c in reader.read([question]).candidates[0]]


def test_the_reader_reads_only_its_retrieved_windows(reader_and_index):
    """The windows' offsets and max-context flags of every window a question does not retrieve
    overwritten (after the index was opened: its check of windows.npz passed) change nothing
    of its answers; those of a retrieved window do. So the reader holds no window array whole:
    it reads its batch's rows from the file."""
    loaded, folder, cache = reader_and_index
    index = open_index(folder)
    assert all(isinstance(array, FileArray) for array in (
        index.windows.first, index.windows.count, index.windows.passage_of_row))
    question = "Who wrote Pride and Prejudice?"
    reader = OpenDomainReader(index, loaded, cache, top_p=1, batch_size=1, chunk_size=8)
    hits = reader.retrieve([question])[0]
    retrieved = set(index.windows.rows_of([hit.passage_index for hit in hits]).tolist())
    before = _answers(reader, question)
    assert before and len(retrieved) < len(index.windows.passage_of_row)

    def overwrite(rows, name: str, value: int) -> None:
        """Overwrites every real token of these windows in the ragged member `name`."""
        starts = np.asarray(window_member(folder / "windows.npz", "row_start"))
        offset, shape, dtype, _ = _member_layout(folder / "windows.npz", name)
        token_bytes = int(np.prod(shape[1:])) * dtype.itemsize
        with (folder / "windows.npz").open("r+b") as stream:
            for row in rows:
                count = int(starts[row + 1] - starts[row])
                stream.seek(offset + int(starts[row]) * token_bytes)
                stream.write(np.full((count,) + shape[1:], value, dtype).tobytes())

    others = sorted(set(range(len(index.windows.passage_of_row))) - retrieved)
    overwrite(others, "token_offsets", 7)
    overwrite(others, "token_max_context", 0)
    assert _answers(reader, question) == before
    overwrite(sorted(retrieved), "token_offsets", -1)  # no token of the retrieved windows allowed
    assert _answers(reader, question) != before
