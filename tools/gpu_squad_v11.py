"""Issue 38's readers on one lent GPU, inside one device command: the full reader and the
delayed students on the complete SQuAD v1.1 training set (configs/minilm_squad_v11.py).

    python3 tools/gpu_squad_v11.py --data DATA --base MINILM --runs RUNS --out OUT \
        --deadline-seconds 470 [--full-runs 'full,multi'] [--students k4_warm,k5_warm,...] \
        [--parallel 2] [--teacher PARAMS] [--smoke]

Phase 1 trains the full readers of --full-runs side by side (processes sharing the GPU); the
best by validation F1 is the teacher and warm start of phase 2, which trains --students (kN_warm,
kN_distill = DeFormer's recipe, full_warm = the control) in their order, --parallel at a time
(with --full-runs '' phase 1 is skipped and --teacher is used). Each phase has a deadline: a run
still going then gets SIGTERM (the trainer checkpoints, evaluating first) and is exported from its
best checkpoint by rerunning it with num_train_steps = its last step (the trainer resumes, has
nothing left to run and exports), so a run that reached a checkpoint ends with a reader even if
the GPU was slower than planned; a phase-2 run is not started within --start-margin seconds of
the deadline. The first lend (2026-11-26, docs/training.md) ran three full readers and then
seven students side by side: the students never reached a checkpoint, hence the pool.

OUT receives at most 8 files (the device's limit): every run's metrics, configs and logs in
`results.tar.xz`, and the readers listed by --return-readers packed by `pack_reader` (bfloat16,
without the frozen word embeddings, which are the base model's; xz; cut in 15 MiB pieces), which
`tools/unpack_gpu_readers.py` turns back into params folders here.

--concurrent (with --teacher) runs the students from that teacher in the same pool as phase 1,
all at once: the second lend (2026-11-26) had no time for two phases, so the students learned from
the first lend's full reader while the full reader of the whole protocol trained beside them. The
full readers then evaluate once an epoch (checkpoints stay every half epoch).

--smoke runs the same phases in minutes on CPU (64 questions, a few steps): the test of this
script before a device call.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
from reader_pieces import add_trained_from, flat_key, write_pieces  # tools/, run as a script

REPO = Path(__file__).resolve().parents[1]
CONFIG = "configs/minilm_squad_v11.py"
WORD_EMBEDDINGS = "embeddings/word_embeddings/embedding"


@dataclasses.dataclass
class Run:
    name: str  # the config variant, e.g. "k4_warm" or "full,multi"
    overrides: list[str]
    label: str = ""  # the workdir's name after minilm_squad_v11_; default: the variant's
    process: subprocess.Popen | None = None
    log: Path | None = None
    status: str = "pending"  # pending, running, finished, interrupted, exported, failed
    config: str = CONFIG  # the config file (tools/gpu_qanet_squad.py: configs/qanet_squad.py)

    @property
    def workdir_name(self) -> str:
        return f"{Path(self.config).stem}_" + (self.label or self.name.replace(",", "_"))


def common_overrides(args: argparse.Namespace, steps_per_eval: int) -> list[str]:
    data = Path(args.data)
    values = {
        "data.squad_file": data / "train-v1.1.json",
        "data.validation_file": data / "dev-v1.1.35-articles.json",
        "data.tokenizer": args.base,
        "log.tensorboard": "false",
        "log.progress": "false",
        "checkpoint.every_steps": steps_per_eval,
        # The deadline's SIGTERM is the pool's own (with time left): evaluate the last state, so
        # the export can be it.
        "checkpoint.evaluate_on_signal": "true",
    }
    if args.smoke:
        values.update({"data.max_questions": 64, "data.max_validation_questions": 24,
                       "batch_size": 8, "eval.batch_size": 8, "log.every_steps": 2})
    return [f"--config.{key}={value}" for key, value in values.items()]


def start(run: Run, args: argparse.Namespace, extra: list[str] = ()) -> None:
    workdir = Path(args.runs) / run.workdir_name
    run.log = Path(args.runs) / f"{run.workdir_name}.log"
    command = [sys.executable, "-m", "dil_jax.commands.train", "--config",
               f"{run.config}:{run.name}", f"--config.workdir={workdir}", *run.overrides, *extra]
    env = dict(os.environ)
    # Several trainers share one GPU: none may take most of its memory up front.
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / max(args.sharing, 1):.3f}")
    with open(run.log, "a") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        run.process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                       env=env)
    run.status = "running"
    print(f"[{elapsed():6.0f} s] started {run.name}", flush=True)


T0 = time.monotonic()


def elapsed() -> float:
    return time.monotonic() - T0


def run_pool(runs: list[Run], args: argparse.Namespace, deadline: float, parallel: int,
             start_margin: float) -> None:
    """Runs `runs` in their order, at most `parallel` at a time; none starts later than
    `start_margin` seconds before `deadline` (seconds since start: it would not reach a
    checkpoint); at the deadline those still going get SIGTERM (they checkpoint, evaluating
    first) and are waited for. Runs never started keep status "pending"."""
    queue, running, terminated = list(runs), [], False
    args.sharing = parallel  # processes sharing the GPU's memory
    while queue or running:
        while queue and len(running) < parallel and elapsed() < deadline - start_margin:
            run = queue.pop(0)
            start(run, args)
            running.append(run)
        if not running:
            break
        if not terminated and elapsed() > deadline:
            for run in running:
                print(f"[{elapsed():6.0f} s] deadline: SIGTERM to {run.name}", flush=True)
                run.process.send_signal(signal.SIGTERM)
            terminated = True
            queue.clear()
        time.sleep(2)
        for run in [r for r in running if r.process.poll() is not None]:
            running.remove(run)
            code = run.process.returncode
            run.status = ("finished" if code == 0 else
                          "interrupted" if terminated else "failed")
            print(f"[{elapsed():6.0f} s] {run.name}: exit {code} ({run.status})", flush=True)


def last_checkpoint_step(workdir: Path) -> int | None:
    steps = [int(p.name) for p in (workdir / "checkpoints").glob("*") if p.name.isdigit()]
    return max(steps) if steps else None


def export_interrupted(runs: list[Run], args: argparse.Namespace) -> None:
    """Reruns each interrupted run with num_train_steps = its last checkpoint: it resumes with
    nothing left to train and exports its best checkpoint."""
    again = []
    for r in runs:
        if r.status != "interrupted":
            continue
        step = last_checkpoint_step(Path(args.runs) / r.workdir_name)
        if step is None:
            r.status = "failed"
            continue
        args.sharing = max(len(runs), 1)
        start(r, args, [f"--config.num_train_steps={step}"])
        again.append(r)
    for r in again:
        r.process.wait()
        r.status = "exported" if r.process.returncode == 0 else "failed"
        print(f"[{elapsed():6.0f} s] {r.name}: export exit {r.process.returncode}", flush=True)


def best_f1(workdir: Path) -> float:
    """The best validation F1 in a run's metrics.jsonl (-1 without any)."""
    path = workdir / "metrics.jsonl"
    scores = [row["f1"] for row in map(json.loads, path.read_text().splitlines())
              if row.get("split") == "eval" and "f1" in row] if path.is_file() else []
    return max(scores, default=-1.0)


def pack_reader(params_dir: Path, out: Path, name: str) -> list[Path]:
    """A params folder (save_params) as `name.tar.xz.NN` pieces (`write_pieces`): the
    params in bfloat16 (stored as uint16) without the frozen word embeddings, the encoder config
    and trained_from.json."""
    import jax
    import ml_dtypes

    from dil_jax.checkpoints import load_params

    config, params = load_params(params_dir)
    arrays = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        key = flat_key(path)
        if key != WORD_EMBEDDINGS:
            arrays[key] = np.asarray(leaf, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    members = {"params.npz": buffer.getvalue(),
               "encoder_config.json": json.dumps(config.to_dict(), indent=2).encode()}
    return write_pieces(add_trained_from(members, params_dir), out, name)


def pack_results(runs: list[Run], args: argparse.Namespace, summary: dict) -> Path:
    """Every run's metrics.jsonl, config.json, trained_from.json and log, and the summary."""
    target = Path(args.out) / "results.tar.xz"
    with tarfile.open(target, "w:xz") as tar:
        for r in runs:
            workdir = Path(args.runs) / r.workdir_name
            for name in ("metrics.jsonl", "config.json", "params/trained_from.json",
                         "params/encoder_config.json", "params/dil_jax_manifest.json"):
                if (workdir / name).is_file():
                    tar.add(workdir / name, arcname=f"{r.workdir_name}/{name}")
            if r.log and r.log.is_file():
                tar.add(r.log, arcname=f"{r.workdir_name}/train.log")
        data = json.dumps(summary, indent=2).encode()
        info = tarfile.TarInfo("summary.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return target


def device_description() -> str:
    try:
        import jax

        return "; ".join(f"{d.platform}:{d.device_kind}" for d in jax.devices()) + \
            f"; jax {jax.__version__}"
    except Exception as error:  # a broken backend is itself worth recording
        return f"unknown ({error})"


def student_options(parser: argparse.ArgumentParser,
                    args: argparse.Namespace) -> tuple[dict[str, float], dict[str, str]]:
    """--epochs-of and --init-of as {student: epochs} and {student: params folder}, each entry
    checked (its form, the folder, the student among --students) before anything is written."""
    epochs_of: dict[str, float] = {}
    for item in args.epochs_of:
        name, _, epochs = item.partition("=")
        try:
            epochs_of[name] = float(epochs)
        except ValueError:
            parser.error(f"--epochs-of {item!r}: expected STUDENT=EPOCHS, e.g. k4_distill=1")
    init_of: dict[str, str] = {}
    for item in args.init_of:
        name, _, params = item.partition("=")
        if not params:
            parser.error(f"--init-of {item!r}: expected STUDENT=PARAMS, e.g. k5_warm=/tmp/k4")
        if not Path(params).is_dir():
            parser.error(f"--init-of {item!r}: {params} is not a params folder")
        init_of[name] = params
    for flag, named in (("--epochs-of", epochs_of), ("--init-of", init_of)):
        strangers = set(named) - set(args.students.split(","))
        if strangers:
            parser.error(f"{flag} names {sorted(strangers)}, not in --students "
                         f"{args.students!r}")
    return epochs_of, init_of


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="folder with train-v1.1.json, "
                        "train-v1.1.ambiguous-offsets.json and dev-v1.1.35-articles.json")
    parser.add_argument("--base", required=True, help="the pre-trained MiniLM folder")
    parser.add_argument("--runs", required=True, help="workdirs (outside the repo)")
    parser.add_argument("--out", required=True, help="what comes back")
    parser.add_argument("--deadline-seconds", type=float, default=540.0)
    parser.add_argument("--phase1-share", type=float, default=0.45,
                        help="fraction of the deadline given to phase 1")
    parser.add_argument("--student-epochs", type=float, default=1.0)
    parser.add_argument("--epochs-of", action="append", default=[], metavar="STUDENT=EPOCHS",
                        help="one student's own --student-epochs (repeatable), e.g. "
                        "k4_distill=1: a recipe compared at the budget an earlier run had")
    parser.add_argument("--init-of", action="append", default=[], metavar="STUDENT=PARAMS",
                        help="one student's own warm start (repeatable; the teacher stays its "
                        "teacher), e.g. k5_warm=/tmp/k4: a k = 5 student from a trained k = 4 "
                        "one, whose lower blocks already read separately")
    parser.add_argument("--full-epochs", type=float, default=2.0)
    parser.add_argument("--full-runs", default="full,multi",
                        help="phase 1's full readers, ';'-separated, of 'full', 'full,multi' and "
                        "'full_lr2e-4' (all three side by side on 2026-11-26); '' skips phase 1 "
                        "(then --teacher)")
    parser.add_argument("--teacher", default="", help="params folder of a full reader: the "
                        "students' teacher and warm start when phase 1 is skipped")
    parser.add_argument("--students", default="k4_warm,k5_warm,k3_warm,k4_distill,k2_warm,"
                        "k1_warm,full_warm", help="phase 2's runs, in order of priority")
    parser.add_argument("--parallel", type=int, default=2,
                        help="phase 2's runs at a time (one H100 ran one student with its "
                        "teacher at 2,400 windows/s; three full readers at 1,170 each)")
    parser.add_argument("--start-margin", type=float, default=150.0,
                        help="no phase-2 run starts later than this before the deadline")
    parser.add_argument("--return-readers", default="full,k4_warm,k5_warm",
                        help="runs whose readers come back (the best full reader is 'full')")
    parser.add_argument("--concurrent", action="store_true",
                        help="run --students (from --teacher) beside phase 1, one pool")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--smoke-steps", type=int, default=6,
                        help="--smoke: the full readers' steps (the students get 2/3)")
    args = parser.parse_args(argv)
    epochs_of, init_of = student_options(parser, args)
    Path(args.runs).mkdir(parents=True, exist_ok=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    data = Path(args.data)
    steps_per_eval = 3 if args.smoke else 2077  # half an epoch of batch 32
    base = common_overrides(args, steps_per_eval)
    full_steps = args.smoke_steps if args.smoke else None
    student_steps = max(1, 2 * args.smoke_steps // 3) if args.smoke else None

    def schedule(epochs: float, smoke_steps: int | None) -> list[str]:
        return ([f"--config.num_train_steps={smoke_steps}"] if smoke_steps
                else [f"--config.num_epochs={epochs}"])

    offsets_file = data / "train-v1.1.ambiguous-offsets.json"
    candidates = f"--config.data.answer_candidates_file={offsets_file}"
    full_runs = {
        "full": Run("full", [*base, f"--config.model.checkpoint={args.base}",
                             *schedule(args.full_epochs, full_steps)]),
        "full,multi": Run("full,multi", [*base, f"--config.model.checkpoint={args.base}",
                                         candidates, *schedule(args.full_epochs, full_steps)]),
        "full_lr2e-4": Run("full", [*base, f"--config.model.checkpoint={args.base}",
                                    "--config.optim.learning_rate=2e-4",
                                    *schedule(args.full_epochs, full_steps)],
                           label="full_lr2e-4"),
    }
    phase1 = [full_runs[name] for name in filter(None, args.full_runs.split(";"))]
    if args.concurrent:
        if not args.teacher:
            parser.error("--concurrent needs --teacher (the students' warm start and teacher)")
        for run in phase1:  # one evaluation an epoch: the GPU is shared by every run
            run.overrides.append(f"--config.eval.every_steps={2 * steps_per_eval}")
    summary: dict = {"device": device_description(), "started": time.strftime("%F %T %Z"),
                     "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO,
                                                  capture_output=True, text=True).stdout.strip()}
    summary["init_of"] = init_of

    def students(teacher: Path, multi: list[str]) -> list[Run]:
        runs = []
        for name in filter(None, args.students.split(",")):
            init = init_of.get(name, args.base if name.endswith("_distill") else teacher)
            runs.append(Run(name, [*base, f"--config.model.checkpoint={init}",
                                   f"--config.teacher.checkpoint={teacher}", *multi,
                                   *schedule(epochs_of.get(name, args.student_epochs),
                                             student_steps)]))
        return runs

    if args.concurrent:
        summary["teacher"] = args.teacher
        together = phase1 + students(Path(args.teacher), [candidates])
        run_pool(together, args, args.deadline_seconds, len(together), start_margin=0.0)
        export_interrupted(together, args)
    phase1_deadline = args.deadline_seconds * args.phase1_share
    if not args.concurrent:
        run_pool(phase1, args, phase1_deadline, len(phase1), start_margin=0.0)
        export_interrupted(phase1, args)
    scores = {r.workdir_name: best_f1(Path(args.runs) / r.workdir_name) for r in phase1}
    summary["phase1_best_f1"] = scores
    best = max((r for r in phase1 if r.status in ("finished", "exported")),
               key=lambda r: scores[r.workdir_name], default=None)
    runs = together if args.concurrent else list(phase1)
    teacher = (Path(args.runs) / best.workdir_name / "params" if best is not None
               else Path(args.teacher) if args.teacher else None)
    if teacher is not None and not args.concurrent:
        summary["teacher"] = str(teacher)
        phase2 = students(teacher, [candidates] if best is None or "multi" in best.name else [])
        run_pool(phase2, args, args.deadline_seconds, args.parallel,
                 start_margin=args.start_margin)
        export_interrupted(phase2, args)
        runs += phase2
    summary["runs"] = {r.workdir_name: {"status": r.status,
                                       "best_f1": best_f1(Path(args.runs) / r.workdir_name)}
                       for r in runs}
    summary["elapsed_s"] = round(elapsed(), 1)
    returned = []
    for name in filter(None, args.return_readers.split(",")):
        chosen = best if name == "full" else next((r for r in runs if r.name == name), None)
        params = None if chosen is None else Path(args.runs) / chosen.workdir_name / "params"
        if params is not None and params.is_dir():
            returned += [p.name for p in pack_reader(params, Path(args.out),
                                                     name.replace(",", "_"))]
    summary["returned"] = returned
    pack_results(runs, args, summary)
    print(json.dumps(summary, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
