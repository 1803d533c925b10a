"""A character reader's training run carried between machines: its newest checkpoint (params,
optimizer state, step, data position, dropout key) as pieces without the frozen word table, and
back into a workdir that `dil-jax train` resumes.

    python3 tools/train_state_pieces.py pack --workdir RUN --out DIR --name NAME [--step N]
    python3 tools/train_state_pieces.py unpack --pieces DIR --name NAME --workdir NEW \\
        --base MINILM_FOLDER

Why: a QANet run needs tens of thousands of steps, more than one lent GPU's minutes or a few
sessions of these cores give. With its state carried, a CPU run can continue on a lent GPU and
come back (tools/gpu_qanet_squad.py --resume-state), one schedule across machines. The frozen
MiniLM word table (47 MB in float32) is most of a QANet checkpoint and never changes: it stays
behind, and `unpack` puts back the table `--base` holds (the device's carry holds it rounded to
bfloat16: a resumed run on the device reads that table, as every reader trained there does).
The rest travels in float32, bit for bit: Adam's moments, the step, the checkpoint's meta (the
data position and the dropout key), so the run resumes where it stopped, in the same data order
(`train.loop._check_resume` refuses another one).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from reader_pieces import read_pieces, write_pieces  # tools/ is not a package

STATE_MEMBER, META_MEMBER, CONFIG_MEMBER = "state.npz", "meta.json", "config.json"
SKELETON_MEMBER = "skeleton.json"
# Where the frozen word table sits in a character reader's train state (`train.reader_kinds`:
# the "frozen" collection travels inside the params tree).
TABLE_KEY = "params/frozen/word_table"
SEPARATOR = "/"


def flatten_state(tree, prefix: str = "") -> tuple[dict[str, np.ndarray], object]:
    """A raw restored state (nested dicts and lists; empty ones too: optax's empty states) ->
    ({"a/1/b": array}, its skeleton: the same nesting with each array replaced by its key), so
    that the empty containers, which hold no array, come back too."""
    if isinstance(tree, dict):
        arrays, skeleton = {}, {}
        for key, child in tree.items():
            child_arrays, skeleton[key] = flatten_state(child, f"{prefix}{key}{SEPARATOR}")
            arrays.update(child_arrays)
        return arrays, skeleton
    if isinstance(tree, (list, tuple)):
        arrays, skeleton = {}, []
        for index, child in enumerate(tree):
            child_arrays, child_skeleton = flatten_state(child, f"{prefix}{index}{SEPARATOR}")
            arrays.update(child_arrays)
            skeleton.append(child_skeleton)
        return arrays, skeleton
    if tree is None:
        return {}, None
    key = prefix.removesuffix(SEPARATOR)
    return {key: np.asarray(tree)}, key


def unflatten_state(arrays: dict[str, np.ndarray], skeleton):
    """`flatten_state`'s inverse."""
    if isinstance(skeleton, dict):
        return {key: unflatten_state(arrays, child) for key, child in skeleton.items()}
    if isinstance(skeleton, list):
        return [unflatten_state(arrays, child) for child in skeleton]
    return None if skeleton is None else arrays[skeleton]


def newest_step(workdir: Path) -> int:
    from dil_jax.train.workdir import CHECKPOINT_DIR

    steps = [int(p.name) for p in (workdir / CHECKPOINT_DIR).glob("*")
             if p.name.isdigit() and (p / "commit_success.txt").is_file()]
    if not steps:
        raise SystemExit(f"--workdir {workdir}: no finished checkpoint in {CHECKPOINT_DIR}/")
    return max(steps)


def pack(workdir: Path, out: Path, name: str, step: int | None = None) -> list[Path]:
    """The checkpoint `step` (default: the newest) of `workdir` as `name.tar.xz.NN` pieces."""
    import orbax.checkpoint as ocp

    from dil_jax.train.checkpointing import META_ITEM, STATE_ITEM
    from dil_jax.train.workdir import CHECKPOINT_DIR

    step = newest_step(workdir) if step is None else step
    folder = (workdir / CHECKPOINT_DIR / str(step)).resolve()
    if not (folder / "commit_success.txt").is_file():
        raise SystemExit(f"--step {step}: no finished checkpoint {folder}")
    if not (workdir / "config.json").is_file():
        raise SystemExit(f"--workdir {workdir}: no config.json (not a dil-jax train workdir)")
    arrays, skeleton = flatten_state(ocp.StandardCheckpointer().restore(folder / STATE_ITEM))
    if arrays.pop(TABLE_KEY, None) is None:
        raise SystemExit(f"{folder}: no {TABLE_KEY} in the state: not a character reader's "
                         "run with a frozen table")
    meta = ocp.Checkpointer(ocp.JsonCheckpointHandler()).restore(folder / META_ITEM)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    members = {STATE_MEMBER: buffer.getvalue(), META_MEMBER: json.dumps(meta).encode(),
               SKELETON_MEMBER: json.dumps(skeleton).encode(),
               CONFIG_MEMBER: (workdir / "config.json").read_bytes()}
    return write_pieces(members, out, name)


def unpack(pieces: Path, name: str, workdir: Path, base: str | None) -> int:
    """The pieces -> checkpoints/<step> of `workdir` (new, or without that step), the word table
    `base`'s; returns the step."""
    from dil_jax.model.qanet_inputs import minilm_word_table
    from dil_jax.train.checkpointing import TrainCheckpointer
    from dil_jax.train.workdir import CHECKPOINT_DIR

    members = read_pieces(pieces, name)
    with np.load(io.BytesIO(members[STATE_MEMBER])) as stored:
        arrays = {key: stored[key] for key in stored.files}
    arrays[TABLE_KEY] = minilm_word_table(base).astype(np.float32)
    meta = json.loads(members[META_MEMBER])
    step = int(meta["step"])
    if (workdir / CHECKPOINT_DIR / str(step)).exists():
        # Never written over: the workdir's own checkpoint of that step stays as it is.
        raise SystemExit(f"--workdir {workdir}: {CHECKPOINT_DIR}/{step} exists already; "
                         "unpack into another workdir or set that checkpoint aside")
    checkpointer = TrainCheckpointer(workdir / CHECKPOINT_DIR, every_steps=1, async_save=False)
    skeleton = json.loads(members[SKELETON_MEMBER])
    checkpointer.save(step, unflatten_state(arrays, skeleton), meta, force=True)
    checkpointer.wait_until_finished()
    checkpointer.close()
    return step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack")
    packing.add_argument("--workdir", type=Path, required=True)
    packing.add_argument("--out", type=Path, required=True)
    packing.add_argument("--name", required=True)
    packing.add_argument("--step", type=int)
    unpacking = commands.add_parser("unpack")
    unpacking.add_argument("--pieces", type=Path, required=True)
    unpacking.add_argument("--name", required=True)
    unpacking.add_argument("--workdir", type=Path, required=True)
    unpacking.add_argument("--base", help="the MiniLM folder whose word table the run reads "
                           "(default: the embedded MiniLM's)")
    args = parser.parse_args(argv)
    if args.command == "pack":
        for piece in pack(args.workdir, args.out, args.name, args.step):
            print(piece)
    else:
        print(f"{args.workdir}: step {unpack(args.pieces, args.name, args.workdir, args.base)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
