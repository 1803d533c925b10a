"""JAX's persistent compilation cache for the commands that compile (`ask`, `demo`, `predict`, ...).

A second run of a command reads its compiled XLA programs back from disk instead of compiling
them again (docs/first_hour.md, "Compiled programs are cached": the measured difference).
Where the cache lives, first match wins:

1. `--no-compilation-cache` (off) or `--compilation-cache DIR` on the command line;
2. the environment variable `DIL_JAX_COMPILATION_CACHE`: `0` / `off` / `false` / `no` turns the
   cache off, a path moves it, `1` / `on` / empty is the default;
3. JAX's own `JAX_COMPILATION_CACHE_DIR`, when the user (or the test suite) set it;
4. the default, `$XDG_CACHE_HOME/dil_jax/jax` (`~/.cache/dil_jax/jax` without XDG_CACHE_HOME).

Every program is cached, however quick to compile (`jax_persistent_cache_min_compile_time_secs`
0): `ask` compiles ~250 small programs besides its two big ones, and together they cost as much.
The cache grows with each new shape, reader or JAX version; deleting the folder is always safe.

JAX reads its config once it is imported, so `applied(choice)` must run before the first
compilation; `dil_jax.cli` runs it (and undoes it afterwards, for callers of `main` in-process)
around the command, never at import time: `dil-jax --help` must not import JAX.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from dil_jax.errors import UsageError

log = logging.getLogger(__name__)

ENV = "DIL_JAX_COMPILATION_CACHE"
JAX_ENV = "JAX_COMPILATION_CACHE_DIR"
FLAG = "--compilation-cache"
OFF_FLAG = "--no-compilation-cache"
OFF_VALUES = frozenset({"0", "off", "false", "no"})
ON_VALUES = frozenset({"", "1", "on", "true", "yes"})
# Seconds a program must take to compile to be cached: 0 = all of them (see the docstring).
MIN_COMPILE_TIME_SECS = 0.0
# The jax.config options a choice sets (and `applied` restores).
_OPTIONS = ("jax_compilation_cache_dir", "jax_enable_compilation_cache",
            "jax_persistent_cache_min_compile_time_secs")


def default_folder(env: Mapping[str, str]) -> Path:
    """`$XDG_CACHE_HOME/dil_jax/jax`, or `~/.cache/dil_jax/jax` (the XDG base directory spec:
    a relative XDG_CACHE_HOME is to be ignored)."""
    base = env.get("XDG_CACHE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".cache"
    return root / "dil_jax" / "jax"


@dataclasses.dataclass(frozen=True)
class CacheChoice:
    """Where compiled programs are cached (None: not cached), and what chose it (a flag, the
    environment variable or "default"), for messages."""

    folder: Path | None
    source: str

    @property
    def explicit(self) -> bool:
        """Whether the user named this folder (a folder that cannot be made is then an error;
        the default one is only skipped with a warning)."""
        return self.source != "default"

    def settings(self) -> dict[str, object]:
        """The jax.config values of this choice."""
        if self.folder is None:
            return {"jax_enable_compilation_cache": False}
        return {"jax_compilation_cache_dir": str(self.folder),
                "jax_enable_compilation_cache": True,
                "jax_persistent_cache_min_compile_time_secs": MIN_COMPILE_TIME_SECS}


def choose(folder_flag: str | None, off_flag: bool, env: Mapping[str, str]) -> CacheChoice:
    """The cache of the flags and the environment (the order of the module docstring)."""
    if off_flag:
        return CacheChoice(None, OFF_FLAG)
    if folder_flag is not None:
        if not folder_flag.strip():
            raise UsageError(f"{FLAG} is empty: give a folder, or {OFF_FLAG}")
        return CacheChoice(Path(folder_flag).expanduser(), FLAG)
    value = env.get(ENV)
    if value is not None:
        if value.strip().lower() in OFF_VALUES:
            return CacheChoice(None, f"{ENV}={value}")
        if value.strip().lower() not in ON_VALUES:
            return CacheChoice(Path(value.strip()).expanduser(), ENV)
    if env.get(JAX_ENV):
        return CacheChoice(Path(env[JAX_ENV]).expanduser(), JAX_ENV)
    return CacheChoice(default_folder(env), "default")


def usable(choice: CacheChoice) -> CacheChoice:
    """`choice` once its folder exists (made here); a folder that cannot be made is a UsageError
    naming it and what chose it, except the default one, which is only skipped (a read-only home
    must not stop `ask`)."""
    if choice.folder is None:
        return choice
    why = folder_problem(choice.folder)
    if why is not None:
        if choice.explicit:
            raise UsageError(f"{choice.source} {choice.folder}: cannot use it as the compilation "
                             f"cache ({why}); give a writable folder, or {OFF_FLAG}")
        log.warning("not caching compiled programs: %s (%s); set %s to a writable folder to "
                    "cache them", choice.folder, why, ENV)
        return CacheChoice(None, "default")
    return choice


def folder_problem(folder: Path) -> str | None:
    """Why `folder` cannot hold the cache ("a file, not a folder", "not writable", the OS's
    reason it cannot be made), or None once it exists."""
    if folder.exists() and not folder.is_dir():
        return "a file, not a folder"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return error.strerror or str(error)
    if not os.access(folder, os.W_OK | os.X_OK):
        return "not writable"
    return None


@contextlib.contextmanager
def applied(choice: CacheChoice) -> Iterator[CacheChoice]:
    """JAX's compilation cache set as `choice` says while the block runs (imports JAX), then as
    it was: a process calling `dil_jax.cli.main` several times (the tests) keeps its own cache.
    Must be entered before the block's first compilation."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    choice = usable(choice)
    wanted = choice.settings()
    before = {name: getattr(jax.config, name) for name in _OPTIONS}
    changed = {name: value for name, value in wanted.items() if before[name] != value}

    def update(values: Mapping[str, object]) -> None:
        for name, value in values.items():
            jax.config.update(name, value)
        # JAX decides once per process whether and where it caches: make it decide again.
        compilation_cache.reset_cache()

    if changed:
        update(changed)
    log.debug("compilation cache: %s (%s)", choice.folder or "off", choice.source)
    try:
        yield choice
    finally:
        if changed:
            update({name: before[name] for name in changed})


def active_folder() -> str | None:
    """The folder JAX caches compiled programs in now, or None (JAX must be imported)."""
    import jax

    if not jax.config.jax_enable_compilation_cache:
        return None
    return jax.config.jax_compilation_cache_dir or None
