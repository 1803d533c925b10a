"""Issue 42's readers on one lent GPU, inside one device command: QANet, LSH-QANet and BiDAF
(configs/qanet_squad.py) side by side on the complete SQuAD v1.1 training set, validated on all
35 shared dev articles; each exported from its best checkpoint and packed to come back.

    python3 tools/gpu_qanet_squad.py --data DATA --base MINILM --runs RUNS --out OUT \\
        --deadline-seconds 420 [--readers qanet,qanet_lsh,bidaf] [--multi] [--smoke]
    python3 tools/gpu_qanet_squad.py --unpack PIECES/qanet.tar.xz.00 --to FOLDER  # here

The pool, the deadline and the export of interrupted runs are tools/gpu_squad_v11.py's
(`run_pool`, `export_interrupted`: at the deadline each run gets SIGTERM, checkpoints after an
evaluation, and is exported from its best checkpoint), as are the data and base the device
already receives (tools/gpu_squad_v11_carry.sh: the SQuAD files and the base MiniLM in
bfloat16, whose word table these readers read, frozen, and whose tokenizer featurizes). On the
device: `QANET=1 DEADLINE=420 bash .devcarry/run.sh` (tools/gpu_squad_v11_device.sh).

OUT receives `results.tar.xz` (every run's metrics, config, manifest, log and a summary) and
each reader as `NAME.tar.xz.NN` pieces: its trainable params (float32; 5.7 MB for QANet) and
manifest, without the frozen word table, which `--unpack` puts back from the base MiniLM here
rounded to bfloat16 as the device read it (so the unpacked reader is the device's, bit for bit).

--smoke runs the same in a few minutes on CPU (64 questions, a few steps): the test of this
script before a device call.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpu_squad_v11 as pool  # tools/ is not a package: imported from its folder
import train_state_pieces
from reader_pieces import (
    add_trained_from,
    flat_key,
    put_trained_from,
    read_pieces,
    write_pieces,
)

CONFIG = "configs/qanet_squad.py"
READERS = ("qanet", "qanet_lsh", "qanet_reversible", "qanet_scratch", "qanet_sd", "qanet_ema",
           "bidaf")
PARAMS_MEMBER, MANIFEST_MEMBER = "params.npz", "dil_jax_manifest.json"
# The variants whose plain stacks --scan-blocks scans (model.reader.scan_blocks): not BiDAF (no
# blocks), not the reversible stacks (a scan of their own), not stochastic depth (refused).
SCANNABLE = ("qanet", "qanet_lsh", "qanet_scratch", "qanet_ema")


def reader_runs(args: argparse.Namespace) -> list[pool.Run]:
    """One Run per --readers entry: the common overrides (data, tokenizer, checkpoints every
    --eval-steps), the base's word table, the schedule (--epochs, or --smoke-steps steps)."""
    steps_per_eval = 3 if args.smoke else args.eval_steps
    common = pool.common_overrides(args, steps_per_eval)
    common.append(f"--config.model.word_table={args.base}")
    common.append(f"--config.num_train_steps={args.smoke_steps}" if args.smoke
                  else f"--config.num_epochs={args.epochs}")
    if args.multi:
        common.append("--config.data.answer_candidates_file="
                      f"{Path(args.data) / 'train-v1.1.ambiguous-offsets.json'}")
    names = [name for name in args.readers.split(",") if name]
    unknown = sorted(set(names) - set(READERS))
    if unknown:
        raise SystemExit(f"--readers: unknown {unknown}; known: {', '.join(READERS)}")
    suffix = ",multi" if args.multi else ""
    settings = config_settings(args.set, names)
    return [pool.Run(name + suffix, list(common) + (
        ["--config.model.reader.scan_blocks=true"] if args.scan_blocks and name in SCANNABLE
        else []) + settings[name], config=CONFIG) for name in names]


def config_settings(values: list[str], names: list[str]) -> dict[str, list[str]]:
    """--set's [READER:]KEY=VALUE entries as each reader's --config.KEY=VALUE overrides (no
    READER: every reader), in the order given; SystemExit naming a malformed entry or a reader
    not in --readers."""
    settings: dict[str, list[str]] = {name: [] for name in names}
    for value in values:
        left, equals, right = value.partition("=")
        target, _, key = left.rpartition(":")  # no ":" before "=": every reader
        assignment = f"{key}={right}"
        if not equals or not key or key.startswith("-"):
            raise SystemExit(f"--set {value!r}: want [READER:]KEY=VALUE, e.g. "
                             "qanet:model.reader.word_scale=18")
        if target and target not in settings:
            raise SystemExit(f"--set {value!r}: {target} is not one of --readers "
                             f"({', '.join(names)})")
        for name in [target] if target else names:
            settings[name].append(f"--config.{assignment}")
    return settings


def resume_states(runs: list[pool.Run], args: argparse.Namespace) -> None:
    """Each --resume-state piece into the workdir of the run it names, before any run starts:
    the trainer resumes from it (`train_state_pieces.unpack`, the table --base's)."""
    by_workdir = {run.workdir_name: run for run in runs}
    for first_piece in args.resume_state:
        name = first_piece.name.rsplit(".tar.xz.", 1)[0]
        if name not in by_workdir:
            raise SystemExit(f"--resume-state {first_piece}: no run of --readers has the "
                             f"workdir {name} (theirs: {', '.join(by_workdir)})")
        step = train_state_pieces.unpack(first_piece.parent, name, Path(args.runs) / name,
                                         args.base)
        print(f"{name}: resumes from step {step}", flush=True)


def pack_char_reader(params_dir: Path, out: Path, name: str) -> list[Path]:
    """A QANet / BiDAF params folder as `name.tar.xz.NN` pieces: its trainable params
    (float32, flattened "a/b/kernel" keys; a trained word table among them), manifest and
    trained_from.json; not a frozen word table."""
    import jax

    from dil_jax.readers import load_reader

    variables = load_reader(params_dir, with_tokenizer=False).params
    arrays = {flat_key(path): np.asarray(leaf, np.float32)
              for path, leaf in jax.tree_util.tree_flatten_with_path(variables["params"])[0]}
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    members = {PARAMS_MEMBER: buffer.getvalue(),
               MANIFEST_MEMBER: (params_dir / MANIFEST_MEMBER).read_bytes()}
    return write_pieces(add_trained_from(members, params_dir), out, name)


def unpack_char_reader(first_piece: Path, target: Path, base: str | None) -> Path:
    """The pieces beside `first_piece` (NAME.tar.xz.00, .01, ...) -> a params folder at
    `target` (save_char_reader), the word table the base MiniLM's rounded to bfloat16."""
    import ml_dtypes

    from dil_jax.checkpoints.char_readers import CONFIG_FIELD, KIND_FIELD, save_char_reader
    from dil_jax.model.char_reader import reader_config
    from dil_jax.model.qanet_inputs import minilm_word_table

    members = read_pieces(first_piece.parent, first_piece.name.rsplit(".tar.xz.", 1)[0])
    manifest = json.loads(members[MANIFEST_MEMBER])
    config = reader_config(manifest[KIND_FIELD], manifest[CONFIG_FIELD])
    params: dict = {}
    with np.load(io.BytesIO(members[PARAMS_MEMBER])) as arrays:
        for key in arrays.files:
            node = params
            *parents, leaf = key.split("/")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = arrays[key]
    if config.train_word_table:  # a trained table travels among the params
        variables = {"params": params}
    else:
        table = minilm_word_table(base).astype(ml_dtypes.bfloat16).astype(np.float32)
        variables = {"params": params, "frozen": {"word_table": table}}
    save_char_reader(target, variables, config)
    return put_trained_from(members, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="folder with train-v1.1.json, "
                        "train-v1.1.ambiguous-offsets.json and dev-v1.1.35-articles.json")
    parser.add_argument("--base", help="the pre-trained MiniLM folder (tokenizer, word table)")
    parser.add_argument("--runs", help="workdirs (outside the repo)")
    parser.add_argument("--out", help="what comes back")
    parser.add_argument("--readers", default="qanet,qanet_lsh,bidaf",
                        help=f"configs/qanet_squad.py variants, side by side ({READERS})")
    parser.add_argument("--multi", action="store_true", help="every occurrence of an ambiguous "
                        "answer is a correct span (the variants' ,multi)")
    parser.add_argument("--scan-blocks", action="store_true", help="QANet's plain stacks as one "
                        f"lax.scan each ({', '.join(SCANNABLE)}): a third of the compile time "
                        "less, the same function (model.reader.scan_blocks)")
    parser.add_argument("--resume-state", type=Path, nargs="*", default=[],
                        help="NAME.tar.xz.00 of a run's state (tools/train_state_pieces.py pack), "
                        "NAME = the run's workdir name (qanet_squad_qanet_multi): that run "
                        "resumes from it (its schedule: --epochs must be the packed run's)")
    parser.add_argument("--return-state", action="store_true",
                        help="every run's newest checkpoint comes back too, as "
                        "WORKDIR_NAME.tar.xz.NN (tools/train_state_pieces.py unpack), so that a "
                        "run can go on elsewhere")
    parser.add_argument("--set", action="append", default=[], metavar="[READER:]KEY=VALUE",
                        help="a config override of one reader of --readers (READER:) or of "
                        "all, as --config.KEY=VALUE (e.g. qanet:model.reader.word_scale=18); "
                        "repeatable")
    parser.add_argument("--deadline-seconds", type=float, default=420.0)
    parser.add_argument("--epochs", type=float, default=3.0,
                        help="each run's schedule (lr decays to 0 over it); the deadline may "
                        "stop it first")
    parser.add_argument("--eval-steps", type=int, default=1000,
                        help="steps between checkpoints (evaluations: every other one)")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--smoke-steps", type=int, default=6)
    parser.add_argument("--unpack", type=Path, help="NAME.tar.xz.00 of packed pieces: unpack")
    parser.add_argument("--to", type=Path, help="--unpack: the params folder to write")
    args = parser.parse_args(argv)
    if args.unpack:
        if not args.to:
            parser.error("--unpack needs --to FOLDER")
        print(unpack_char_reader(args.unpack, args.to, args.base))
        return 0
    missing = [f"--{name}" for name in ("data", "base", "runs", "out") if not getattr(args, name)]
    if missing:
        parser.error(f"the device run needs {', '.join(missing)}")
    Path(args.runs).mkdir(parents=True, exist_ok=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    runs = reader_runs(args)
    resume_states(runs, args)
    if not args.smoke:  # evaluations cost the shared GPU: every other checkpoint
        for run in runs:
            run.overrides.append(f"--config.eval.every_steps={2 * args.eval_steps}")
    summary: dict = {"device": pool.device_description(), "started": time.strftime("%F %T %Z"),
                     "readers": [run.name for run in runs]}
    pool.run_pool(runs, args, args.deadline_seconds, len(runs), start_margin=0.0)
    pool.export_interrupted(runs, args)
    summary["runs"] = {run.workdir_name: {"status": run.status, "best_f1": pool.best_f1(
        Path(args.runs) / run.workdir_name)} for run in runs}
    returned = []
    for run in runs:
        params = Path(args.runs) / run.workdir_name / "params"
        if params.is_dir():
            returned += [p.name for p in pack_char_reader(params, Path(args.out),
                                                          run.name.replace(",", "_"))]
        if args.return_state and pool.last_checkpoint_step(Path(args.runs) / run.workdir_name):
            returned += [p.name for p in train_state_pieces.pack(
                Path(args.runs) / run.workdir_name, Path(args.out), run.workdir_name)]
    summary["returned"] = returned
    summary["elapsed_s"] = round(pool.elapsed(), 1)
    pool.pack_results(runs, args, summary)
    print(json.dumps(summary, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
