"""A QANet / BiDAF training run's checkpoint at one step as a reader export, while the run goes on.

    python3 tools/export_train_step.py --workdir RUN [--step N] --out DIR \\
        [--reader FIELD=VALUE ...] [--weights average|trained]

`dil-jax train` exports its best (else final) step when its schedule ends; a run of many
sessions has nothing to read before that. This writes step N's weights (the moving average with
`optim.ema_decay`, as the trainer exports) in the format `dil-jax predict`, `index`, `ask` and
`serve` load, with `trained_from.json` naming the run and the step, and the config the run
recorded (its config.json). `--reader FIELD=VALUE` corrects that config where the code that ran
read a setting from elsewhere (the word-scale experiment's branch read it from the environment:
`--reader word_scale=18`). It only reads the workdir (no checkpoint manager, which would tidy the
live run's folders), and writes DIR complete or not at all; DIR must not exist.

`--weights trained` exports the params themselves where the run keeps a moving average (the
default, `average`, is what the trainer evaluates and exports): the two read side by side are
what the average is worth at that step. `trained_from.json` records which.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOOL = "tools/export_train_step.py"
WEIGHTS = ("average", "trained")  # export_step's `weights`: weights_of(state), or state.params


def finished_steps(workdir: Path) -> list[int]:
    from dil_jax.train.workdir import CHECKPOINT_DIR

    return sorted(int(p.name) for p in (workdir / CHECKPOINT_DIR).glob("*")
                  if p.name.isdigit() and (p / "commit_success.txt").is_file())


def run_config(workdir: Path, reader_changes: dict[str, str]):
    """The run's recorded config (config.json) with `reader_changes` in config.model.reader;
    SystemExit naming the problem (no config, not a character reader's run, unknown field)."""
    import ml_collections

    from dil_jax.train.reader_kinds import is_char_kind
    from dil_jax.train.workdir import CONFIG_FILE

    path = workdir / CONFIG_FILE
    try:
        config = ml_collections.ConfigDict(json.loads(path.read_text()))
    except (OSError, ValueError) as error:
        raise SystemExit(f"--workdir {workdir}: cannot read {CONFIG_FILE} ({error}): not a "
                         "dil-jax train workdir") from None
    if not is_char_kind(config):
        raise SystemExit(f"--workdir {workdir}: a {config.model.get('kind', 'encoder')} run; "
                         "this exports QANet / BiDAF runs (config.model.kind qanet or bidaf)")
    for name, text in reader_changes.items():
        try:
            value = json.loads(text)  # 18 -> 18, true -> True; a bare word stays a string
        except ValueError:
            value = text
        # Set even where the recorded config lacks the field (code older than it); the
        # reader's config type refuses an unknown name when the student is built.
        config.model.reader[name] = value
    return config


def export_step(workdir: Path, out: Path, step: int | None = None,
                reader_changes: dict[str, str] | None = None, weights: str = "average") -> Path:
    """Step `step` (default: the newest finished) of `workdir` as a reader folder `out`, with
    the weights the trainer exports (`average`: the moving average where the run keeps one) or
    the params themselves (`trained`; refused by name for a run without an average)."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    from dil_jax.checkpoints import TRAINED_FROM_FILE
    from dil_jax.checkpoints.windows import WINDOWS_FIELD
    from dil_jax.mesh import data_mesh
    from dil_jax.model.encoder_config import ConfigError
    from dil_jax.train.checkpointing import STATE_ITEM, abstract_like, nonfinite_leaves
    from dil_jax.train.reader_kinds import char_student
    from dil_jax.train.setup import make_run_optimizer
    from dil_jax.train.sharding import replicated
    from dil_jax.train.step import init_train_state, weights_of
    from dil_jax.train.train_config import TrainConfig
    from dil_jax.train.workdir import CHECKPOINT_DIR

    if weights not in WEIGHTS:
        raise SystemExit(f"--weights {weights!r}: expected one of {', '.join(WEIGHTS)}")
    if out.exists():
        raise SystemExit(f"--out {out}: exists; name a new folder (nothing is written over)")
    steps = finished_steps(workdir)
    if not steps:
        raise SystemExit(f"--workdir {workdir}: no finished checkpoint in {CHECKPOINT_DIR}/")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise SystemExit(f"--step {step}: not a finished checkpoint of {workdir} "
                         f"(finished: {steps})")
    config = run_config(workdir, reader_changes or {})
    config.model.checkpoint = ""  # the step's params replace the fresh ones
    if weights == "trained" and not float(config.optim.get("ema_decay", 0.0)) > 0:
        raise SystemExit(f"--weights trained: the run {workdir} keeps no moving average "
                         "(optim.ema_decay 0): its export already holds its params")
    settings = TrainConfig.of(config)
    try:
        student = char_student(settings.model, jax.random.key(0))
    except ConfigError as error:
        raise SystemExit(f"--workdir {workdir} config.model.reader: {error}") from None
    # The state's structure, not its values.
    tx, _ = make_run_optimizer(settings, 1, student)
    abstract = abstract_like(jax.eval_shape(lambda p: init_train_state(p, tx), student.params),
                             replicated(data_mesh()))
    folder = workdir / CHECKPOINT_DIR / str(step) / STATE_ITEM
    state = ocp.StandardCheckpointer().restore(folder.resolve(), abstract)
    chosen = state.params if weights == "trained" else weights_of(state)
    params = jax.tree.map(np.asarray, jax.device_get(chosen))
    nonfinite = nonfinite_leaves(params)
    if nonfinite:
        raise SystemExit(f"{folder}: non-finite values in {nonfinite[:3]}: not exporting it")
    staging = out.with_name(out.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    student.with_params(params).save(staging)
    record = {"step": step, "workdir": str(workdir.resolve()),
              "exported_by": TOOL, "reader_changes": reader_changes or {}, "weights": weights}
    # What `dil-jax predict` reads with by default.
    record[WINDOWS_FIELD] = settings.data.trained_windows().to_json()
    (staging / TRAINED_FROM_FILE).write_text(json.dumps(record, indent=2))
    os.replace(staging, out)
    return out


def reader_change(text: str) -> tuple[str, str]:
    name, separator, value = text.partition("=")
    if not separator or not name.strip():
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE, got {text!r}")
    return name.strip(), value.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="a dil-jax train workdir")
    parser.add_argument("--step", type=int, default=None,
                        help="the step to export (default: the newest finished checkpoint)")
    parser.add_argument("--out", type=Path, required=True, help="the reader folder to write")
    parser.add_argument("--reader", type=reader_change, action="append", default=[],
                        metavar="FIELD=VALUE",
                        help="a config.model.reader field the recorded config has wrong")
    parser.add_argument("--weights", choices=WEIGHTS, default="average",
                        help="average: what the trainer exports (the moving average where the "
                             "run keeps one); trained: the params themselves")
    args = parser.parse_args(argv)
    out = export_step(args.workdir, args.out, args.step, dict(args.reader), args.weights)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
