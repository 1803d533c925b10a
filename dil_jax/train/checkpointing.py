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
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)

STATE_ITEM = "state"
META_ITEM = "meta"


class TrainCheckpointer:
    """Save every N steps (+ forced saves), keep last K + best, restore the latest."""

    def __init__(self, directory: str | os.PathLike, *, every_steps: int, keep: int = 2,
                 best_metric: str | None = "f1", best_mode: str = "max",
                 async_save: bool = True):
        if best_mode not in ("max", "min"):
            raise ValueError(f"best_mode must be 'max' or 'min', got {best_mode!r}")
        self.best_metric = best_metric
        policies: list[Any] = [ocp.checkpoint_managers.LatestN(n=keep)]
        best_fn = None
        if best_metric:
            sign = 1.0 if best_mode == "max" else -1.0

            def best_fn(metrics: dict[str, float]) -> float:
                return sign * float(metrics[best_metric])

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
        self.manager = ocp.CheckpointManager(
            directory, options=options, item_names=(STATE_ITEM, META_ITEM))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def best_step(self) -> int | None:
        return self.manager.best_step() if self.best_metric else None

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def should_save(self, step: int) -> bool:
        return self.manager.should_save(step)

    def save(self, step: int, state: Any, meta: dict[str, Any],
             metrics: dict[str, float] | None = None, force: bool = False) -> bool:
        """Saves if the interval says so (or `force`); metrics feed the best-checkpoint policy."""
        if metrics is not None and self.best_metric and self.best_metric not in metrics:
            metrics = None  # no best-metric value: the step counts as "without metrics"
        return self.manager.save(
            step, args=ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardSave(state),
                                             META_ITEM: ocp.args.JsonSave(meta)}),
            metrics=metrics, force=force)

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
        """(state, meta) of `step`; `abstract_state` carries shapes, dtypes and shardings."""
        restored = self.manager.restore(
            step, args=ocp.args.Composite(**{STATE_ITEM: ocp.args.StandardRestore(abstract_state),
                                             META_ITEM: ocp.args.JsonRestore()}))
        return restored[STATE_ITEM], dict(restored[META_ITEM])

    def reached_preemption(self, step: int) -> bool:
        """All processes agree a preemption (SIGTERM) happened (multi-process runs only)."""
        return jax.process_count() > 1 and self.manager.reached_preemption(step)

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()


def abstract_like(tree: Any, sharding: Any) -> Any:
    """ShapeDtypeStructs of `tree` (arrays or structs), each with `sharding`."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)
