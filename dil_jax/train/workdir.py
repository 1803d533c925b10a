"""A training run's workdir: what train writes there, whether a folder may be one, claiming it,
and the run's config.json with the history of the configs a resume replaced.

The rule of `dil-jax index --out` holds here too: train never writes into a folder another tool
filled (its config.json would overwrite a Hugging Face model's).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import jax

from dil_jax.atomic import write_atomic
from dil_jax.errors import OutputPathError
from dil_jax.train.checkpointing import BROKEN_DIR, named_few
from dil_jax.train.config_rules import with_current_names
from dil_jax.train.curves import CURVES_FILE
from dil_jax.train.log_writers import METRICS_FILE, TENSORBOARD_DIR
from dil_jax.train.setup import is_remote

log = logging.getLogger(__name__)

EXPORT_DIR = "params"
CHECKPOINT_DIR = "checkpoints"
CONFIG_FILE = "config.json"
# Each config a resume replaced, one JSON line: what changed, and the whole previous config.
CONFIG_HISTORY_FILE = "config_history.jsonl"
# Written into every workdir train creates or adopts: the mark of a folder train owns.
WORKDIR_MARK = "dil_jax_train.json"
# What train writes into a workdir (beside hidden temporary files). A folder holding anything
# else is someone else's (a Hugging Face checkpoint has config.json too): train refuses it.
WORKDIR_ENTRIES = frozenset({
    WORKDIR_MARK, CHECKPOINT_DIR, BROKEN_DIR, CONFIG_FILE, CONFIG_HISTORY_FILE, METRICS_FILE,
    TENSORBOARD_DIR, EXPORT_DIR, EXPORT_DIR + ".new", CURVES_FILE})


def holds_checkpoint_steps(folder: Path) -> bool:
    """Whether `folder` holds at least one checkpoint step (orbax names a step's folder by its
    number). An empty or foreign checkpoints/ is no sign of a train workdir: a Hugging Face
    reader folder with an empty checkpoints/ beside its config.json was taken for one, and
    train overwrote that config.json."""
    return folder.is_dir() and any(entry.is_dir() and entry.name.isdigit()
                                   for entry in folder.iterdir())


def workdir_problem(workdir: str | Path) -> str | None:
    """Why train must not write into the local `workdir`, or None when it may: it is new, empty,
    or a train workdir (the mark, or one written by older code: checkpoints/ holding a step, or
    nothing but train's own files beside metrics.jsonl). The rule of `dil-jax index --out`:
    never write into a folder another tool filled (config.json would overwrite a Hugging Face
    model's)."""
    if not str(workdir).strip():
        return ("--config.workdir is empty: train would write checkpoints/, config.json and "
                "params/ into the current folder; give a folder path, e.g. runs/NAME")
    folder = Path(workdir)
    if not folder.is_dir() or (folder / WORKDIR_MARK).is_file():
        return None  # a file is refused by check_output_folder, naming it
    if holds_checkpoint_steps(folder / CHECKPOINT_DIR):
        return None  # an older train workdir: resuming it keeps working
    foreign = sorted(entry.name for entry in folder.iterdir()
                     if entry.name not in WORKDIR_ENTRIES and not entry.name.startswith("."))
    if not foreign and ((folder / METRICS_FILE).is_file() or not any(
            not entry.name.startswith(".") for entry in folder.iterdir())):
        return None
    held = named_few(sorted(e.name for e in folder.iterdir() if not e.name.startswith(".")),
                     limit=4)
    return (f"--config.workdir {folder} is a folder that train did not write (it holds {held}; "
            f"no {WORKDIR_MARK} or checkpoint step in {CHECKPOINT_DIR}/ marks it as a train "
            f"workdir): training "
            f"would write {CONFIG_FILE}, {CHECKPOINT_DIR}/ and {EXPORT_DIR}/ among its files; "
            "choose a new or empty folder")


def claim_workdir(workdir: str | Path) -> None:
    """Refuses (OutputPathError) a workdir train may not write into; marks a local one as
    train's, so a later run recognises it whatever it then holds. Remote workdirs are left to
    the checkpointer."""
    if is_remote(workdir):
        return
    problem = workdir_problem(workdir)
    if problem:
        raise OutputPathError(problem)
    mark = Path(workdir) / WORKDIR_MARK
    if jax.process_index() == 0 and not mark.is_file():
        write_atomic(mark, json.dumps({"written_by": "dil-jax train", "note": (
            "marks a training workdir: train resumes in it, and refuses folders without it "
            "that hold files it did not write")}, indent=2))


def flat_config(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"optim.learning_rate": 3e-05, ...} of a config's JSON dict: one entry per leaf."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        flat.update(flat_config(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """"key old -> new" for every leaf that differs (absent: "(none)"; a renamed key: no change)."""
    old_flat, new_flat = with_current_names(flat_config(old)), flat_config(new)
    return [f"{key} {old_flat.get(key, '(none)')!s} -> {new_flat.get(key, '(none)')!s}"
            for key in sorted(old_flat.keys() | new_flat.keys())
            if old_flat.get(key, "(none)") != new_flat.get(key, "(none)")]


def record_config(log_dir: Path, config_json: str, start_step: int) -> list[str]:
    """Writes the run's config.json. One of an earlier run with other values is not lost: it
    is appended to config_history.jsonl with the changed keys, which a WARNING lists (a resume
    with another learning rate is a different run from that step on). Returns the changes."""
    path = log_dir / CONFIG_FILE
    changes: list[str] = []
    if path.is_file():
        old_text = path.read_text(encoding="utf-8")
        try:
            old: Any = json.loads(old_text)
        except ValueError:
            old = old_text  # unreadable: kept as it is
        changes = (config_changes(old, json.loads(config_json)) if isinstance(old, dict)
                   else ["(the previous config.json was not readable JSON)"])
        if changes:
            history = log_dir / CONFIG_HISTORY_FILE
            entry = json.dumps({"replaced_at_step": start_step, "time": time.time(),
                                "changed": changes, "config": old})
            previous = history.read_text(encoding="utf-8") if history.is_file() else ""
            write_atomic(history, previous + entry + "\n")
            log.warning("the config differs from %s of the run this one continues (from step "
                        "%d): %s; the previous config is kept in %s", path, start_step,
                        "; ".join(changes), history)
    write_atomic(path, config_json)
    return changes
