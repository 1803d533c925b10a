"""Training checkpoints with orbax's CheckpointManager.

Each checkpoint step holds two items:
  state: the TrainState (params, optimizer state, step), arrays restored with their shardings;
  meta:  JSON — step, epoch, position in the epoch, data order seed, the base rng key (raw uint32
         data) and the config, so a resumed run continues the same data order and dropout stream.

Retention: the last `keep` checkpoints plus the best one by a validation metric
(orbax `AnyPreservationPolicy([LatestN, BestN])`). Atomicity is orbax's: a step is written under a
temporary name and renamed (or, on GCS, marked with a commit file) only when complete, and
`latest_step()` only lists finished steps, so an interrupted save never becomes "latest".
In a multi-process run every process calls save/restore; orbax writes each array shard from one
owner and the metadata from the primary process only.

Resuming (`restore_latest`) takes the newest step that restores; a step whose files are damaged
(cut, removed or changed after the save completed: each step records its files' sha256 once
final, `checkpoint_digests`) or whose state holds NaN/Inf values (a diverged run saved by older
code) is logged, set aside and the previous one is tried.
A step written by another model shape is not "damaged": that is refused with the differing
parameters named, since falling back would silently train another model.

A non-finite value of the best metric never makes a step "best": `save` stores such a step
without metrics, and a NaN stored by older code ranks below every finite value.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from dil_jax.checkpoints import CheckpointError
from dil_jax.errors import UsageError, disk_fix, disk_refusal
from dil_jax.train.checkpoint_digests import record_step_digests, step_digest_problem

log = logging.getLogger(__name__)

STATE_ITEM = "state"
META_ITEM = "meta"
# Where damaged steps are moved (beside checkpoints/), so a re-save of that step can happen.
BROKEN_DIR = "checkpoints.broken"


class TrainCheckpointer:
    """Save every N steps (+ forced saves), keep last K + best, restore the latest."""

    def __init__(self, directory: str | os.PathLike, *, every_steps: int, keep: int = 2,
                 best_metric: str | None = "f1", best_mode: str = "max",
                 async_save: bool = True):
        # The last asynchronous save started, which may still be in flight (its failure shows at
        # the next save or at close); None with synchronous saves, which finish in save().
        self._saving_step: int | None = None
        # A step orbax may still be writing, whose files' digests are recorded once it is final.
        self._undigested: int | None = None
        self._async = async_save
        if best_mode not in ("max", "min"):
            raise UsageError(f"config.checkpoint.best_mode must be 'max' or 'min', "
                             f"got {best_mode!r}")
        self.best_metric = best_metric
        policies: list[Any] = [ocp.checkpoint_managers.LatestN(n=keep)]
        best_fn = None
        if best_metric:
            def best_fn(metrics: Mapping[str, float]) -> float:
                return best_score(metrics, best_metric, best_mode)

            # Checkpoints saved without metrics are kept (or not) by LatestN alone.
            policies.append(ocp.checkpoint_managers.BestN(
                get_metric_fn=best_fn, n=1, keep_checkpoints_without_metrics=False))
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=every_steps,
            # best_fn makes the manager write the metrics next to each step and enables
            # best_step(); which steps survive is the preservation policy's decision.
            best_fn=best_fn, best_mode="max",
            preservation_policy=ocp.checkpoint_managers.AnyPreservationPolicy(policies),
            enable_async_checkpointing=async_save,
            # Leftover temporary folders of a killed save are removed at start-up.
            cleanup_tmp_directories=True,
        )
        directory = str(directory)
        if "://" not in directory:  # gs:// etc. are handed to orbax as they are
            directory = os.path.abspath(directory)
        self.directory = directory
        # Handlers (not just names) let item_metadata() read a step's shapes before restoring.
        self.manager = ocp.CheckpointManager(
            directory, options=options,
            item_handlers={STATE_ITEM: ocp.StandardCheckpointHandler(),
                           META_ITEM: ocp.JsonCheckpointHandler()})

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def best_step(self) -> int | None:
        """The step with the best finite best_metric; None without one (a workdir whose only
        scored steps hold NaN, saved by older code, has no best: the last step is exported)."""
        if not self.best_metric:
            return None
        step = self.manager.best_step()
        if step is None or best_score(self.metrics(step) or {}, self.best_metric) == -math.inf:
            return None
        return step

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def metrics(self, step: int) -> dict[str, float] | None:
        """The evaluation metrics saved with `step`; None when none were (orbax writes them only
        with a best_metric, and only when they hold it)."""
        if not self.best_metric:
            return None
        stored = self.manager.metrics(step)
        return None if stored is None else dict(stored)

    def save(self, step: int, state: Any, meta: dict[str, Any],
             metrics: dict[str, float] | None = None, force: bool = False) -> bool:
        """Saves if the interval says so (or `force`); metrics feed the best-checkpoint policy.

        A step whose best_metric is missing or not finite is saved without metrics: it is kept
        (or not) as one of the last `keep` only, and can never become the best (a NaN taken as
        best would replace the export and let retention delete the good checkpoints).
        """
        if metrics is not None and self.best_metric:
            value = metrics.get(self.best_metric)
            if value is not None and not math.isfinite(float(value)):
                log.warning("step %d: %s = %s is not finite: the checkpoint is saved but cannot "
                            "become the best", step, self.best_metric, value)
            if value is None or not math.isfinite(float(value)):
                metrics = None  # the step counts as "without metrics"
        if self._undigested is not None:  # orbax would wait for it before this save anyway
            self.wait_until_finished()
        try:
            saved = self.manager.save(
                step, args=ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardSave(state),
                                                 META_ITEM: ocp.args.JsonSave(meta)}),
                metrics=metrics, force=force)
        except Exception as error:  # orbax/tensorstore raise many kinds; a full disk is named
            raise self._write_error(error, step) or error from error
        if saved:
            self._undigested = step
            if self._async:
                self._saving_step = step
            else:
                self._record_digests()
        return saved

    def _record_digests(self) -> None:
        """Records the digests of the last step saved, now final (local folders, process 0;
        a step retention already removed has none to record)."""
        step, self._undigested = self._undigested, None
        if step is None or "://" in self.directory or jax.process_index() != 0:
            return
        step_dir = Path(self.directory) / str(step)
        if step_dir.is_dir():
            try:
                record_step_digests(step_dir)
            except OSError as error:
                raise self._write_error(error, step) or error from error

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """(state, meta) of `step`; `abstract_state` carries shapes, dtypes and shardings."""
        restored = self.manager.restore(
            step, args=ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardRestore(abstract_state),
                                             META_ITEM: ocp.args.JsonRestore()}))
        return restored[STATE_ITEM], dict(restored[META_ITEM])

    def saved_shapes(self, step: int) -> dict[str, tuple[int, ...]] | None:
        """{"params/a/kernel": shape} of every array in step's state; None if unreadable."""
        try:
            tree = self.manager.item_metadata(step)[STATE_ITEM]
        except Exception:  # damaged metadata: restore will tell
            return None
        return None if tree is None else leaf_shapes(tree)

    def restore_latest(self, abstract_state: Any) -> tuple[Any, dict[str, Any]] | None:
        """(state, meta) of the newest step that restores, or None when there is none.

        A damaged step (unreadable, or holding NaN/Inf values) is logged (WARNING), moved to
        checkpoints.broken/ and the previous one is tried; CheckpointError if no step restores,
        or if a step holds another model's shapes.
        """
        broken: list[tuple[int, str]] = []
        for step in sorted(self.all_steps(), reverse=True):
            saved = self.saved_shapes(step)
            if saved is not None:
                mismatch = shape_mismatch(saved, leaf_shapes(abstract_state))
                if mismatch:
                    raise CheckpointError(
                        f"{self.directory} step {step} holds another model than this config "
                        f"builds ({mismatch}); resume with the model settings that wrote it "
                        "(model.checkpoint, model.encoder: see config.json beside it) or use a "
                        "new workdir (config.workdir)")
            changed = (None if "://" in self.directory
                       else step_digest_problem(Path(self.directory) / str(step)))
            if changed:
                log.warning("checkpoint step %d in %s: %s; trying the previous one", step,
                            self.directory, changed)
                broken.append((step, changed))
                continue
            try:
                restored = self.restore(step, abstract_state)
            except Exception as error:  # orbax/tensorstore raise many kinds
                reason = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
                log.warning("checkpoint step %d in %s cannot be read (%s); trying the previous "
                            "one", step, self.directory, reason)
                broken.append((step, reason))
                continue
            nonfinite = nonfinite_leaves(restored[0])
            if nonfinite:
                reason = "non-finite values (NaN/Inf) in " + named_few(nonfinite)
                log.warning("checkpoint step %d in %s holds %s; trying the previous one", step,
                            self.directory, reason)
                broken.append((step, reason))
                continue
            if broken:
                moved = self._set_aside([b for b, _ in broken])
                log.warning("resuming from step %d: newer step(s) %s in %s are damaged (%s)",
                            step, [b for b, _ in broken], self.directory, moved)
            return restored
        if broken:
            raise CheckpointError(
                f"no intact checkpoint in {self.directory}: step(s) "
                + "; ".join(f"{b} ({reason})" for b, reason in broken)
                + ". Move that folder aside (or use a new config.workdir) to train from the "
                "start")
        return None

    def _set_aside(self, steps: list[int]) -> str:
        """Moves damaged steps out of orbax's sight (local, single process), so the run can save
        those steps again; elsewhere deletes them. Returns what was done, for the log."""
        if "://" in self.directory or jax.process_count() > 1:
            for step in steps:
                self.manager.delete(step)
            self.manager.reload()
            return "deleted"
        target = Path(self.directory).with_name(BROKEN_DIR)
        target.mkdir(exist_ok=True)
        for step in steps:
            destination = target / str(step)
            suffix = 1
            while destination.exists():
                destination = target / f"{step}.{suffix}"
                suffix += 1
            shutil.move(os.path.join(self.directory, str(step)), destination)
        self.manager.reload()
        return f"moved to {target}"

    def reached_preemption(self, step: int) -> bool:
        """All processes agree a preemption (SIGTERM) happened (multi-process runs only)."""
        return jax.process_count() > 1 and self.manager.reached_preemption(step)

    def wait_until_finished(self) -> None:
        """Returns once an in-flight async save has completed (or failed), its digests
        recorded."""
        try:
            self.manager.wait_until_finished()
        except Exception as error:
            raise self._write_error(error, None) or error from error
        self._record_digests()

    def _write_error(self, error: BaseException, step: int | None) -> CheckpointError | None:
        """A one-line CheckpointError when `error` is the disk refusing the write (full,
        read-only, a file too large, a quota), else None. An asynchronous save reports its
        failure at the next save or at close, so the step named is the one being written."""
        reason = disk_refusal(error)
        if reason is None:
            return None
        pending = self._saving_step
        which = (f"step {step}" if pending is None or pending == step
                 else f"step {pending}" if step is None
                 else f"step {pending} (written in the background) or {step}")
        latest = self.latest_step()
        return CheckpointError(
            f"{self.directory}: cannot write the checkpoint of {which}: {reason}. "
            f"{disk_fix(reason).capitalize()} or use another config.workdir, then rerun the same "
            "command: training resumes from the last complete checkpoint"
            + (f" (step {latest})" if latest is not None else " (none yet: from the start)"))

    def close(self) -> None:
        """Waits for an in-flight asynchronous save; a disk that refused it is named."""
        self.wait_until_finished()
        try:
            self.manager.close()
        except Exception as error:
            raise self._write_error(error, None) or error from error


def best_score(metrics: Mapping[str, float], metric: str, mode: str = "max") -> float:
    """What orbax ranks steps by (higher is better): `metric`, negated for mode "min"; -inf
    when it is missing or not finite, so a NaN (which compares false with everything and would
    otherwise land anywhere in a sort) is the worst score in either mode."""
    value = float(metrics.get(metric, math.nan))
    if not math.isfinite(value):
        return -math.inf
    return value if mode == "max" else -value


@jax.jit
def _finite_by_leaf(tree: Any) -> Any:
    # On device: works for arrays sharded over processes, and moves one bool per leaf.
    return jax.tree.map(lambda leaf: jnp.all(jnp.isfinite(leaf)), tree)


def nonfinite_leaves(tree: Any) -> list[str]:
    """Paths ("params/block_0/ffn_in/kernel") of the float leaves of `tree` holding NaN/Inf."""
    leaves = [(path, leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
              if jnp.issubdtype(leaf.dtype, jnp.inexact)]
    flags = jax.device_get(_finite_by_leaf([leaf for _, leaf in leaves]))
    return ["/".join(_key_name(k) for k in path)
            for (path, _), finite in zip(leaves, flags, strict=True) if not np.all(finite)]


def named_few(names: list[str], limit: int = 3) -> str:
    """"a, b, c and 4 more": a list for a one-line message."""
    more = len(names) - limit
    return ", ".join(names[:limit]) + (f" and {more} more" if more > 0 else "")


def _key_name(key: Any) -> str:
    return str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))))


def leaf_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """{"params/block_0/ffn_in/kernel": shape} of a state, its abstract twin or orbax metadata."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(_key_name(k) for k in path): tuple(leaf.shape) for path, leaf in leaves
            if hasattr(leaf, "shape")}


def shape_mismatch(saved: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]],
                   limit: int = 3) -> str:
    """"" if the params agree, else up to `limit` differences, params named first.

    Only params are compared: they are what a model shape decides, and their names are the same
    in orbax's metadata and in the TrainState (optimizer-state paths are spelled differently).
    """
    saved = {k: v for k, v in saved.items() if k.startswith("params/")}
    expected = {k: v for k, v in expected.items() if k.startswith("params/")}
    differences = []
    for name in sorted(saved.keys() | expected.keys()):
        if name not in expected:
            differences.append(f"{name} {saved[name]} only in the checkpoint")
        elif name not in saved:
            differences.append(f"{name} {expected[name]} missing from the checkpoint")
        elif saved[name] != expected[name]:
            differences.append(f"{name}: {saved[name]} in the checkpoint, {expected[name]} in "
                               "this config")
    if not differences:
        return ""
    more = len(differences) - limit
    return "; ".join(differences[:limit]) + (f"; and {more} more" if more > 0 else "")


def abstract_like(tree: Any, sharding: Any) -> Any:
    """ShapeDtypeStructs of `tree` (arrays or structs), each with `sharding`."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)
