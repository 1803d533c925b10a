"""Data parallelism on a 1-D device mesh: the batch sharded over "data", params replicated.

A `jit` whose batch argument carries a `NamedSharding(mesh, P(None, "data"))` runs the same SPMD
program on every device, and XLA inserts the gradient all-reduce (why a mesh and not pmap: the
module docstring of `dil_jax.reading.grid`). On a multi-host TPU slice each process feeds only the
rows its own devices hold.

The mesh is `dil_jax.mesh.data_mesh`: its devices are ordered by (process, id), so each process's
devices hold one contiguous block of batch rows and a process loads only those rows.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dil_jax.mesh import DATA_AXIS

# Batches are [accumulation steps, micro-batch, ...]: shard the micro-batch axis.
BATCH_AXIS = 1


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """[accum, micro, ...] arrays: micro-batch rows split over the mesh."""
    return NamedSharding(mesh, P(None, DATA_AXIS))


def local_rows(sharding: NamedSharding, global_shape: tuple[int, ...],
               axis: int = BATCH_AXIS) -> slice:
    """The contiguous range of `axis` that this process's devices hold."""
    index_map = sharding.addressable_devices_indices_map(global_shape)
    starts = [(idx[axis].start or 0) for idx in index_map.values()]
    stops = [(global_shape[axis] if idx[axis].stop is None else idx[axis].stop)
             for idx in index_map.values()]
    rows = slice(min(starts), max(stops))
    covered = {(a, b) for a, b in zip(starts, stops)}
    if sum(b - a for a, b in covered) != rows.stop - rows.start:
        raise ValueError(f"this process's devices hold non-contiguous rows {sorted(covered)}; "
                         "build the mesh with dil_jax.mesh.data_mesh")
    return rows


def process_rows(mesh: Mesh, accum_steps: int, micro_batch: int) -> slice:
    """The micro-batch rows this process feeds (all of them with one process)."""
    return local_rows(batch_sharding(mesh), (accum_steps, micro_batch))


def put_process_batch(local_batch: dict[str, np.ndarray], mesh: Mesh,
                      micro_batch: int) -> dict[str, jax.Array]:
    """This process's rows [accum, rows, ...] -> global arrays [accum, micro_batch, ...].

    Each process passes only the rows `process_rows` gave it; JAX assembles the global array
    without any process ever holding the whole batch.
    """
    sharding = batch_sharding(mesh)
    out = {}
    for name, array in local_batch.items():
        array = np.asarray(array)
        global_shape = (array.shape[0], micro_batch, *array.shape[2:])
        out[name] = jax.make_array_from_process_local_data(sharding, array, global_shape)
    return out


def replicate(tree: Any, mesh: Mesh) -> Any:
    """Puts a pytree (identical on every process) on all devices of the mesh."""
    sharding = replicated(mesh)
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)

    def put(leaf):
        leaf = np.asarray(leaf)
        return jax.make_array_from_process_local_data(sharding, leaf, leaf.shape)

    return jax.tree.map(put, tree)
