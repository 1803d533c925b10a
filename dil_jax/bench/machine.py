"""Facts about the machine a benchmark ran on: versions, CPU, threads, load, allocator."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import jax


def machine_record() -> dict[str, Any]:
    """Device kind, versions and the CPU, for the JSON record."""
    device = jax.devices()[0]
    record = {"jax": jax.__version__, "jaxlib": getattr(jax.lib, "__version__", None) or
              _dist_version("jaxlib"), "flax": _dist_version("flax"),
              "torch": _dist_version("torch"), "transformers": _dist_version("transformers"),
              "platform": device.platform, "device_kind": device.device_kind,
              "num_devices": jax.device_count(), "cpu": _cpu_model(),
              "cpu_count": os.cpu_count(), "python": platform.python_version(),
              # The cores this process may run on (`taskset -c 0` gives [0]).
              "cpus_allowed": sorted(os.sched_getaffinity(0))}
    return record


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8


def retain_freed_memory() -> bool:
    """Makes glibc keep freed memory for reuse instead of handing it back to the OS.

    Why: XLA:CPU allocates each call's temporaries afresh (large blocks for a chunk of pairs);
    by default glibc maps such blocks with mmap, or in per-thread arenas, and returns them on
    free, so every call faults its pages in again and the kernel zeroes them, a large share of a
    short program's wall time (benchmarks/README.md has the measurement). One arena, no
    mmap and a high trim threshold make the second call reuse the first call's pages. The torch
    peer runs in the same process, so it gets the same allocator. Returns False where this is
    not glibc (nothing is changed then).
    """
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(param, value) == 1 for param, value in (
        (_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2 ** 31 - 1)))


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages (the machine may be shared with other work)."""
    return [round(x, 2) for x in os.getloadavg()]


def cpu_snapshot() -> tuple[float, float] | None:
    """(CPU seconds all processes have been busy, CPU seconds of this process), or None.

    Busy time is /proc/stat's user + nice + system + irq + softirq + steal of every core.
    """
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    ticks = os.sysconf("SC_CLK_TCK")
    own = os.times()
    return ((user + nice + system + irq + softirq + steal) / ticks, own.user + own.system)


def others_cpu_share(before: tuple[float, float] | None, after: tuple[float, float] | None,
                     wall_s: float) -> float | None:
    """Mean number of cores that OTHER processes kept busy between two snapshots.

    On a 2-core machine 0.0 means the benchmark had the machine to itself, 1.0 that other work
    took a whole core on average: the timings are then that much noisier and slower.
    """
    if before is None or after is None or wall_s <= 0:
        return None
    busy, own = after[0] - before[0], after[1] - before[1]
    return round(max(busy - own, 0.0) / wall_s, 2)


def thread_counts() -> dict[str, Any]:
    """Intra-op threads of both frameworks.

    XLA:CPU sizes its Eigen intra-op pool to the cores this process may run on (unless
    XLA_FLAGS says otherwise, recorded too); torch is set to the same number by `run_suite`.
    """
    counts: dict[str, Any] = {"xla_intra_op_threads": len(os.sched_getaffinity(0)),
                              "xla_flags": os.environ.get("XLA_FLAGS", ""),
                              "torch_intra_op_threads": None, "torch_inter_op_threads": None}
    try:
        import torch
    except ImportError:  # no peer without torch; the JAX side still runs
        return counts
    counts.update(torch_intra_op_threads=torch.get_num_threads(),
                  torch_inter_op_threads=torch.get_num_interop_threads())
    return counts
