"""What the passage caches' digest check adds to opening an index (docs/open_domain.md,
"Integrity checks").

    python3 -m dil_jax demo                       # builds runs/demo-index (once)
    python3 benchmarks/index_open_check.py [--index runs/demo-index] [--repeats 6]

Opens the index as `ask` does (`open_index`, then `open_cache` for the demo's two bundled
readers: the cache checks and the two re-encoded rows) with the default digest check
("sampled") and without it ("none"), interleaved so machine load falls on both, and prints the
medians; then times the digest check alone, sampled and full (every byte), with the caches'
pages in memory and evicted from the page cache (POSIX_FADV_DONTNEED on the index's files
only). Loading the readers is not part of opening and is not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def evict(folder: Path) -> None:
    """Drops the page cache of every file under `folder` (clean pages only: nothing else)."""
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", default="runs/demo-index")
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()

    from dil_jax.defaults import bundled_reader
    from dil_jax.open_domain.cache.digests import verify_folder
    from dil_jax.open_domain.index.folder import open_index
    from dil_jax.readers import load_reader

    readers = [load_reader(str(bundled_reader("full")), 0, 64),
               load_reader(str(bundled_reader("delayed")), None, 64)]

    def open_all(verify: str) -> float:
        started = time.perf_counter()
        index = open_index(args.index)
        for reader in readers:
            index.open_cache(reader, verify=verify)
        return time.perf_counter() - started

    open_all("none")  # compiles the 2-row encoder calls once: both variants then run warm
    times: dict[str, list[float]] = {"sampled": [], "none": []}
    for repeat in range(args.repeats):
        for verify in ("sampled", "none") if repeat % 2 else ("none", "sampled"):
            times[verify].append(open_all(verify))
    for verify, values in times.items():
        print(f"open, check {verify}: median {statistics.median(values):.3f} s "
              f"(all {', '.join(f'{value:.3f}' for value in values)})")

    folders = [(path, json.loads((path / "manifest.json").read_text()))
               for cache in sorted(Path(args.index).glob("cache-k*"))
               for path in [cache, *sorted((cache / "shards").glob("shard-*"))]]
    for cold in (False, True):
        for full in (False, True):
            spent, hashed = [], 0
            for _ in range(3):
                if cold:
                    evict(Path(args.index))
                started = time.perf_counter()
                hashed = sum(verify_folder(path, manifest, full).bytes_hashed
                             for path, manifest in folders)
                spent.append(time.perf_counter() - started)
            print(f"digest check alone, {'full' if full else 'sampled'}, page cache "
                  f"{'evicted' if cold else 'warm'}: {hashed / 2**20:.1f} MiB hashed, median "
                  f"{statistics.median(spent):.3f} s (all {', '.join(f'{s:.3f}' for s in spent)})")


if __name__ == "__main__":
    main()
