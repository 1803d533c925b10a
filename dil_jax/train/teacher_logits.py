"""The teacher's span scores of every training window, computed once (`teacher.logits_file`).

KD compares the student's span distributions with the frozen teacher's; the teacher's are the
same at every step and in every student run from that teacher (k = 3, 4, 5 ...), so they can be
computed in one pass and stored instead of running the teacher beside each step: a step then costs
the student's forward and backward only. LRS compares hidden states, which cannot be stored (each
layer's are [windows, 192, 384] float32: 39 GB for the complete SQuAD v1.1 training set), so a
logits file needs `loss.lrs_weight = 0`.

The file (`.npz`, written atomically) holds start / end [n_windows, passage_len] and null start /
end [n_windows] float32 scores of the training windows in their row order, and a fingerprint of
the teacher's weights and of the windows (ids and masks); a file whose fingerprint differs is
recomputed and replaced, never read; a file that is not one it wrote is refused and left
alone. Every process computes or reads the same scores; only
process 0 writes the file.
"""

from __future__ import annotations

import dataclasses
import io
import logging
from pathlib import Path

import jax
import ml_collections
import numpy as np

from dil_jax.atomic import write_atomic
from dil_jax.checkpoints.fingerprint import params_fingerprint, short_sha256
from dil_jax.errors import UsageError
from dil_jax.model.span_reader import PADDED_LOGIT, ReaderOutput
from dil_jax.progress import CountBar
from dil_jax.readers.protocol import Reader
from dil_jax.train.train_config import TrainConfig

log = logging.getLogger(__name__)

# What marks a file as this module's (only such a file is ever replaced).
FILE_FORMAT = "dil_jax.teacher_logits/1"
# The batch keys a step reads the stored scores from (Windows.batch adds them).
BATCH_KEYS = ("teacher_start_logits", "teacher_end_logits", "teacher_null_start_logits",
              "teacher_null_end_logits")


@dataclasses.dataclass(frozen=True)
class TeacherLogits:
    """The frozen teacher's scores of each training window, in the windows' row order."""

    start: np.ndarray  # [n_windows, passage_len] float32 (padding = PADDED_LOGIT)
    end: np.ndarray  # [n_windows, passage_len] float32
    null_start: np.ndarray  # [n_windows] float32
    null_end: np.ndarray  # [n_windows] float32
    fingerprint: str  # of the teacher's weights and the windows they were computed on

    def batch(self, rows: np.ndarray, valid: np.ndarray) -> dict[str, np.ndarray]:
        """The scores of `rows` [*S] as batch arrays; an invalid row (a padding window) gets
        what the teacher gives an all-padding window: PADDED_LOGIT on every token, so all
        probability on the null class, as the student's; its KD term is 0 either way."""
        keep = valid[..., None]
        return {
            "teacher_start_logits": np.where(keep, self.start[rows], PADDED_LOGIT),
            "teacher_end_logits": np.where(keep, self.end[rows], PADDED_LOGIT),
            "teacher_null_start_logits": np.where(valid, self.null_start[rows], 0.0),
            "teacher_null_end_logits": np.where(valid, self.null_end[rows], 0.0),
        }


def stored_teacher_output(batch: dict[str, jax.Array]) -> ReaderOutput:
    """The batch's stored teacher scores as the teacher's ReaderOutput (no hidden states)."""
    return ReaderOutput(*(batch[key] for key in BATCH_KEYS))


def logits_file_problems(config: ml_collections.ConfigDict) -> list[str]:
    """teacher.logits_file serves KD only, from a teacher it is computed with: what is wrong."""
    path = str(config.teacher.get("logits_file", "")) if "teacher" in config else ""
    if not path:
        return []
    problems = []
    if float(config.loss.lrs_weight) > 0:
        problems.append(f"config.teacher.logits_file = {path!r} stores the teacher's span scores"
                        " for KD; LRS needs its hidden states, which cannot be stored "
                        f"(config.loss.lrs_weight = {config.loss.lrs_weight}): set it to 0, or "
                        "unset teacher.logits_file")
    if float(config.loss.kd_weight) <= 0:
        problems.append(f"config.teacher.logits_file = {path!r} is only read for KD, and "
                        "config.loss.kd_weight is 0: unset one or set the other")
    if not str(config.teacher.get("checkpoint", "")):
        problems.append(f"config.teacher.logits_file = {path!r} needs config.teacher.checkpoint"
                        " (the teacher the scores are computed with)")
    return problems


def windows_fingerprint(teacher_params, q_ids: np.ndarray, q_mask: np.ndarray,
                        p_ids: np.ndarray, p_mask: np.ndarray) -> str:
    """Of the teacher's weights and every window's inputs: other weights or other windows
    (another featurization, a null-window sample, a data order change of rows) differ."""
    arrays = (q_ids, q_mask, p_ids, p_mask)
    return short_sha256([params_fingerprint(teacher_params).encode()]
                        + [str(a.shape).encode() + np.ascontiguousarray(a, np.int32).tobytes()
                           for a in arrays])


def compute_teacher_logits(teacher: Reader, q_ids: np.ndarray, q_mask: np.ndarray,
                           p_ids: np.ndarray, p_mask: np.ndarray, batch_size: int,
                           fingerprint: str, progress: CountBar | None = None
                           ) -> TeacherLogits:
    """The teacher's scores of every window ([n, Lq] question and [n, Lp] passage arrays),
    `batch_size` windows at a time in one compiled program (the last batch padded)."""
    n = p_ids.shape[0]

    @jax.jit
    def scores(params, qi, qm, pi, pm):
        out = teacher.model(params, qi, qm, pi, pm, deterministic=True)
        return out.start_logits, out.end_logits, out.null_start_logits, out.null_end_logits

    parts: list[tuple[np.ndarray, ...]] = []
    for begin in range(0, n, batch_size):
        rows = np.arange(begin, begin + batch_size)
        rows = np.minimum(rows, n - 1)  # the last batch repeats its last window: same shape
        outputs = scores(teacher.params, q_ids[rows], q_mask[rows], p_ids[rows], p_mask[rows])
        real = min(batch_size, n - begin)
        parts.append(tuple(np.asarray(o, np.float32)[:real] for o in outputs))
        if progress is not None:
            progress(begin + real)
    start, end, null_start, null_end = (np.concatenate(column) for column in zip(*parts))
    return TeacherLogits(start, end, null_start, null_end, fingerprint)


def save_teacher_logits(path: Path, logits: TeacherLogits) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, format=np.array(FILE_FORMAT), start=logits.start, end=logits.end,
             null_start=logits.null_start, null_end=logits.null_end,
             fingerprint=np.array(logits.fingerprint))
    write_atomic(path, buffer.getvalue())


def load_teacher_logits(path: Path) -> TeacherLogits | None:
    """The file's scores, or None when there is no file (then computed and written there).

    A file that is not one this module wrote (unreadable, or without its format mark) is
    refused, naming the key, and left as it is: the path may name someone's data by mistake,
    and a stale file of ours is the only one ever replaced."""
    if not path.exists():
        return None
    try:
        with np.load(path) as stored:
            if str(stored["format"]) != FILE_FORMAT:
                raise ValueError(f"format {str(stored['format'])!r}")
            return TeacherLogits(stored["start"], stored["end"], stored["null_start"],
                                 stored["null_end"], str(stored["fingerprint"]))
    except (OSError, ValueError, KeyError) as error:
        raise UsageError(f"config.teacher.logits_file = {str(path)!r} is not a file of teacher "
                         f"scores this trainer wrote ({type(error).__name__}: {error}); it is "
                         "not replaced: remove it, or name a new path") from error


def teacher_logits_for(config: TrainConfig, teacher: Reader, windows) -> TeacherLogits:
    """The scores of `windows` (train.data.Windows) by `teacher`: read from
    config.teacher.logits_file when its fingerprint matches, else computed and written there
    (config.eval.batch_size windows at a time)."""
    path = Path(config.teacher.logits_file)
    q_ids, q_mask = (windows.q_ids[windows.question_index], windows.q_mask[windows.question_index])
    fingerprint = windows_fingerprint(teacher.params, q_ids, q_mask, windows.p_ids,
                                      windows.p_mask)
    stored = load_teacher_logits(path)
    if stored is not None and stored.fingerprint == fingerprint:
        log.info("teacher scores of %d windows read from %s", len(windows), path)
        return stored
    if stored is not None:
        log.warning("%s holds another teacher's or other windows' scores (fingerprint %s, these "
                    "%s): computing them again and replacing it", path, stored.fingerprint,
                    fingerprint)
    main = jax.process_index() == 0
    with CountBar("teacher scores (once)", len(windows), "window", enabled=main) as bar:
        logits = compute_teacher_logits(teacher, q_ids, q_mask, windows.p_ids, windows.p_mask,
                                        config.eval.batch_size, fingerprint, bar)
    if main:
        save_teacher_logits(path, logits)
        log.info("teacher scores of %d windows written to %s", len(windows), path)
    return logits


def with_stored_teacher(config: TrainConfig, data, models):
    """(data, models) with the teacher's scores attached to the training windows and the
    teacher dropped (a step no longer runs it), when config.teacher.logits_file is set; else
    unchanged. data: train.setup.RunData; models: train.setup.RunModels."""
    if not config.teacher.logits_file or models.teacher is None:
        return data, models
    logits = teacher_logits_for(config, models.teacher, data.train)
    train = dataclasses.replace(data.train, teacher_logits=logits)
    return dataclasses.replace(data, train=train), dataclasses.replace(models, teacher=None)

