"""tools/reader_pieces.py: pieces are written into a folder made if missing, and a new pack
replaces an earlier one of the same name whole (a surplus old piece would otherwise be joined
into the new pack by `read_pieces`)."""

from __future__ import annotations

import os

from tests.helpers import load_script


def test_a_smaller_pack_replaces_a_larger_one_whole(tmp_path, monkeypatch):
    pieces = load_script("tools/reader_pieces.py")
    monkeypatch.setattr(pieces, "PIECE_BYTES", 256)
    out = tmp_path / "new" / "folder"  # made by the writer
    big = {"a.bin": os.urandom(1000)}  # incompressible: several pieces of 256 bytes
    written = pieces.write_pieces(big, out, "state")
    assert len(written) > 2 and pieces.read_pieces(out, "state") == big
    small = {"a.bin": b"x"}
    rewritten = pieces.write_pieces(small, out, "state")
    assert len(rewritten) == 1
    assert pieces.read_pieces(out, "state") == small
    assert sorted(path.name for path in out.iterdir()) == ["state.tar.xz.00"]
