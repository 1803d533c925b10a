"""How the device scripts send readers back: named members (params, manifest, trained_from.json)
in one tar, xz-compressed and cut into `NAME.tar.xz.NN` pieces of at most PIECE_BYTES.

tools/gpu_squad_v11.py and tools/gpu_qanet_squad.py write them on the device (`write_pieces`);
tools/unpack_gpu_readers.py and `gpu_qanet_squad.py --unpack` read them back here
(`read_pieces`). Params travel as flat arrays keyed "a/b/kernel" (`flat_key`).
"""

from __future__ import annotations

import io
import lzma
import os
import tarfile
from pathlib import Path

PIECE_BYTES = 15 * 2 ** 20
# What a training run's export records beside its params (dil_jax.checkpoints.orbax_io): the
# steps, and for SQuAD v2.0 the null threshold. It travels as a member of the same name.
TRAINED_FROM = "trained_from.json"


def flat_key(path) -> str:
    """"a/b/kernel" of a JAX key path (`jax.tree_util.tree_flatten_with_path`)."""
    return "/".join(str(getattr(k, "key", k)) for k in path)


def add_trained_from(members: dict[str, bytes], params_dir: Path) -> dict[str, bytes]:
    """`members` with the params folder's TRAINED_FROM, when it has one."""
    if (params_dir / TRAINED_FROM).is_file():
        members[TRAINED_FROM] = (params_dir / TRAINED_FROM).read_bytes()
    return members


def put_trained_from(members: dict[str, bytes], params_dir: Path) -> Path:
    """Writes the packed TRAINED_FROM (if any) into the unpacked params folder; returns it."""
    if TRAINED_FROM in members:
        (params_dir / TRAINED_FROM).write_bytes(members[TRAINED_FROM])
    return params_dir


def write_pieces(members: dict[str, bytes], out: Path, name: str) -> list[Path]:
    """`members` (file name -> bytes) as one tar, xz-compressed, written to `out` (made if
    missing) as `name.tar.xz.00`, `.01`, ... of at most PIECE_BYTES each; returns the pieces.

    The pieces are written beside, then renamed in; an earlier pack of the same name is
    replaced whole (its surplus pieces too: `read_pieces` would join them into the new ones)."""
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w") as tar:
        for member, data in members.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    packed = lzma.compress(tar_bytes.getvalue(), preset=3)
    out.mkdir(parents=True, exist_ok=True)
    staged = []
    for index in range(0, len(packed), PIECE_BYTES):
        piece = out / f".{name}.tar.xz.{index // PIECE_BYTES:02d}.new"
        piece.write_bytes(packed[index:index + PIECE_BYTES])
        staged.append(piece)
    for old in out.glob(f"{name}.tar.xz.[0-9][0-9]"):
        old.unlink()
    pieces = []
    for piece in staged:
        final = piece.with_name(piece.name[1:-len(".new")])
        os.replace(piece, final)
        pieces.append(final)
    return pieces


def read_pieces(directory: Path, name: str) -> dict[str, bytes]:
    """The members `write_pieces` packed as `name`, from its pieces in `directory` in order."""
    pieces = sorted(directory.glob(f"{name}.tar.xz.[0-9][0-9]"))
    if not pieces:
        raise SystemExit(f"no pieces {name}.tar.xz.NN in {directory}")
    packed = b"".join(piece.read_bytes() for piece in pieces)
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(packed))) as tar:
        return {member.name: tar.extractfile(member).read() for member in tar.getmembers()}
