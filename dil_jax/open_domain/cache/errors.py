"""The errors of a passage cache (re-exported by `dil_jax.open_domain.cache.store`).

Apart from the store so that the modules it is made of (the legacy `.npy` reader, the
tensorstore layer, the digests) raise the same errors without importing it.
"""

from __future__ import annotations

from dil_jax.errors import DilJaxError


class CacheMismatchError(DilJaxError, ValueError):
    """A cache was built for another model, k, tokenizer or passage set; names the field."""


class ShardWaitError(DilJaxError):
    """A process of a sharded build waited longer than its limit for another process's work
    (process 0's plan, another shard, the finished cache): that process died or lags."""


class CacheBrokenError(CacheMismatchError):
    """A cache file is unreadable, truncated, or holds states its manifest does not describe.

    `build_passage_cache` (`dil-jax index`) rebuilds such a cache; opening one names the file.
    """


def broken(path: object, problem: str) -> CacheBrokenError:
    """CacheBrokenError naming the file (a path or URL), its problem and the fix."""
    return CacheBrokenError(f"{path}: broken passage cache ({problem}); rerun `dil-jax index` "
                            "with the same --out and reader to rebuild it")
