"""An index's windows.npz: written a block of passages at a time, mapped in place on open, read
by the open-domain reader for its retrieved windows only."""

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
    WindowCounts,
    _member_layout,
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
    with np.load(path) as written:  # an ordinary .npz to numpy
        assert sorted(written.files) == sorted(MEMBERS)
        for name in MEMBERS:
            assert written[name].dtype == expected[name].dtype, name
            np.testing.assert_array_equal(written[name], expected[name], err_msg=name)
    # np.savez's own file (every index written before) maps in place too.
    saved = tmp_path / "saved.npz"
    buffer = io.BytesIO()
    np.savez(buffer, **expected)
    saved.write_bytes(buffer.getvalue())
    for file in (path, saved):
        for name in MEMBERS:
            member = window_member(file, name)
            assert isinstance(member, FileArray), name
            np.testing.assert_array_equal(np.asarray(member), expected[name], err_msg=name)
            some = [len(member) - 1, 0, 1, 2, 2]  # runs, repeats, from the end
            np.testing.assert_array_equal(member[some], expected[name][some], err_msg=name)
            np.testing.assert_array_equal(member[1:4], expected[name][1:4], err_msg=name)
            part = member.row_range(1, 4)  # a shard's rows, read only when asked for
            assert isinstance(part, FileArray) and len(part) == 3
            np.testing.assert_array_equal(part[[2, 0]], expected[name][[3, 1]], err_msg=name)
    counts = WindowCounts.of([expected["count"][:5], expected["count"][5:]], 3)
    assert counts.total == rows
    assert counts.largest.tolist() == sorted(expected["count"].tolist(), reverse=True)[:3]


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
        offset, shape, dtype, _ = _member_layout(folder / "windows.npz", name)
        row_bytes = int(np.prod(shape[1:])) * dtype.itemsize
        with (folder / "windows.npz").open("r+b") as stream:
            for row in rows:
                stream.seek(offset + row * row_bytes)
                stream.write(np.full(shape[1:], value, dtype).tobytes())

    others = sorted(set(range(len(index.windows.passage_of_row))) - retrieved)
    overwrite(others, "offsets", 7)
    overwrite(others, "max_context", 0)
    assert _answers(reader, question) == before
    overwrite(sorted(retrieved), "offsets", -1)  # no token of the retrieved windows allowed
    assert _answers(reader, question) != before
