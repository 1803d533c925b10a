"""The devices of dil_jax: the processes that share them, and the one 1-D mesh over them.

`maybe_initialize_distributed` joins this process to the others of a multi-process run (or
sets the CPU device count) before any other JAX call; `data_mesh` is the one device mesh: 1-D,
axis "data", devices grouped by process.

Training shards each batch over it (train/sharding.py) and the pair grid shards each chunk of
(question, passage) pairs over it (reading/grid.py); both build it here so both see the same device
order.

Why order by (process, id): each process's devices then form one contiguous block of the mesh,
hence one contiguous block of batch rows, so a process can load only the rows its own devices
hold (`sharding.local_rows` relies on it). With one process the order is the usual device-id one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

DATA_AXIS = "data"

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DistributedSettings:
    """How this process joins a multi-process run (a training config's `distributed`, or the
    flags of `dil-jax index`).

    initialize: call `jax.distributed.initialize`; coordinator_address ("host:port"),
    num_processes, process_id: its arguments (None: JAX discovers them, as on a Cloud TPU pod);
    num_cpu_devices: > 0 sets `jax_num_cpu_devices` (host devices for testing), 0 leaves it.
    """

    initialize: bool = False
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    num_cpu_devices: int = 0

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> DistributedSettings:
        """From a mapping with these keys (a config's `distributed` section)."""
        return cls(**{field.name: values[field.name] for field in dataclasses.fields(cls)})


def maybe_initialize_distributed(settings: DistributedSettings) -> None:
    """jax.distributed.initialize when asked; must run before any other JAX call.

    CPU processes use gloo collectives (JAX's default CPU collectives since 0.5).
    """
    if settings.num_cpu_devices and jax.config.jax_num_cpu_devices != settings.num_cpu_devices:
        # Only possible before the CPU backend starts (i.e. before any JAX computation).
        jax.config.update("jax_num_cpu_devices", int(settings.num_cpu_devices))
    if not settings.initialize or jax.distributed.is_initialized():
        return
    kwargs = {name: getattr(settings, name)
              for name in ("coordinator_address", "num_processes", "process_id")
              if getattr(settings, name) is not None}
    jax.distributed.initialize(**kwargs)
    log.info("process %d of %d, %d local / %d global devices", jax.process_index(),
             jax.process_count(), jax.local_device_count(), jax.device_count())


def data_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D `DATA_AXIS` mesh over `devices` (default: every device of every process), ordered
    by (process index, device id)."""
    devices = jax.devices() if devices is None else devices
    ordered = sorted(devices, key=lambda device: (device.process_index, device.id))
    return Mesh(np.asarray(ordered), (DATA_AXIS,))
