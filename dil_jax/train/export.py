"""The reader a finished run exports into its workdir's params/: the best (else final) params in
the format readers load, and `trained_from.json` (the steps, and the null threshold of a SQuAD
v2.0 run), swapped in only once complete."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax

from dil_jax.checkpoints import TRAINED_FROM_FILE, CheckpointError
from dil_jax.checkpoints.windows import WINDOWS_FIELD, TrainedWindows
from dil_jax.train.checkpointing import (
    TrainCheckpointer,
    abstract_like,
    named_few,
    nonfinite_leaves,
)
from dil_jax.train.step import TrainState, weights_of

if TYPE_CHECKING:
    from dil_jax.readers.protocol import Reader

log = logging.getLogger(__name__)


def export_reader(checkpointer: TrainCheckpointer, best_step: int | None, state: TrainState,
                  sharding, directory: Path, student: Reader,
                  metrics: dict[str, float] | None = None,
                  windows: TrainedWindows | None = None,
                  tokenizer: str | None = None) -> Path | None:
    """Writes the best (else final) params of `student` as its family saves a reader
    (`Reader.save`: the folder `load_reader` reads), and
    `trained_from.json`: the steps, the passage windows the run trained on (`windows`:
    `dil-jax predict` reads with them by default), and the null threshold when `metrics` (the
    exported step's evaluation) holds one (a SQuAD v2.0 run: `dil-jax predict` then uses it).
    tokenizer: the run's `data.tokenizer` (a folder or "default"), whose files are copied in:
    the export reads as it was trained without a --tokenizer (it used to need
    `--tokenizer default`, which nothing told the user).

    Single-process only: `Reader.save` writes from one process with no cross-host barrier; a pod
    run's readers restore from its checkpoints/ instead (or export on one host afterwards).
    """
    if jax.process_count() > 1:
        log.warning("multi-process run: not exporting %s (export from the checkpoint on one "
                    "host)", directory)
        return None
    params = weights_of(state)
    if best_step is not None and best_step != int(state.step):
        params = weights_of(checkpointer.restore(best_step, abstract_like(state, sharding))[0])
        # Its bytes may have changed on disk since it was saved: never export NaN params.
        nonfinite = nonfinite_leaves(params)
        if nonfinite:
            raise CheckpointError(
                f"{checkpointer.directory} step {best_step} (the best checkpoint) holds "
                f"non-finite values (NaN/Inf) in {named_few(nonfinite)}: not exporting it; "
                "move that step aside and rerun to export the next best")
    staging = directory.with_name(directory.name + ".new")
    shutil.rmtree(staging, ignore_errors=True)
    student.with_params(jax.device_get(params)).save(staging)  # as its family saves it
    record: dict[str, Any] = {"step": best_step if best_step is not None else int(state.step),
                              "best_step": best_step, "final_step": int(state.step)}
    if windows is not None:
        record[WINDOWS_FIELD] = windows.to_json()
    if metrics and "null_threshold" in metrics:
        record["null_threshold"] = float(metrics["null_threshold"])
    # Staged with the params, so no reader sees params without their threshold.
    (staging / TRAINED_FROM_FILE).write_text(json.dumps(record, indent=2))
    if tokenizer is not None:
        copy_tokenizer_files(tokenizer, staging)
    # Swap in the new export; the old one survives until the new one is complete.
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(staging, directory)
    log.info("exported reader params (step %s%s) to %s", record["step"],
             f", null threshold {record['null_threshold']:g}" if "null_threshold" in record
             else "", directory)
    return directory


def copy_tokenizer_files(tokenizer: str, directory: Path) -> list[str]:
    """Copies the tokenizer files of `tokenizer` (a folder or name `resolve_checkpoint` knows)
    into `directory`; returns their names."""
    from dil_jax.checkpoints.integrity import TOKENIZER_RECORD_FILES
    from dil_jax.hub import resolve_checkpoint

    source = Path(resolve_checkpoint(tokenizer))
    names = [name for name in TOKENIZER_RECORD_FILES if (source / name).is_file()]
    for name in names:
        shutil.copyfile(source / name, directory / name)
    return names
