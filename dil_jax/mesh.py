"""The one device mesh of dil_jax: 1-D, axis "data", devices grouped by process.

Training shards each batch over it (train/sharding.py) and the pair grid shards each chunk of
(question, passage) pairs over it (reading/grid.py); both build it here so both see the same device
order.

Why order by (process, id): each process's devices then form one contiguous block of the mesh,
hence one contiguous block of batch rows, so a process can load only the rows its own devices
hold (`sharding.local_rows` relies on it). With one process the order is the usual device-id one.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

DATA_AXIS = "data"


def data_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D `DATA_AXIS` mesh over `devices` (default: every device of every process), ordered
    by (process index, device id)."""
    devices = jax.devices() if devices is None else devices
    ordered = sorted(devices, key=lambda device: (device.process_index, device.id))
    return Mesh(np.asarray(ordered), (DATA_AXIS,))
