"""Pairs per chunk of the pair program, chosen on this machine (`--chunk-size auto`).

The fastest chunk size depends on the CPU (its cache sizes, vector width, core count), so
`auto` measures it once per machine and reader shape and records the choice:

- **The measurement** (`measure_chunk_sizes`): the reader's own pair program (the grid's jitted
  chunk function, real weights, the reader's question length and the index's window length, a
  whole batch's hoist class, the widest token widths), one chunk of each candidate size: one
  call to compile it, then `reps` timed calls (the fastest counts: the machine may be busy).
  Candidates are tried from the platform's default outwards (`probe_order`): a size twice as
  large while that keeps winning, else half as large; the smaller of two sizes within
  `CHUNK_TOLERANCE` wins (a smaller chunk pads a batch's last chunk less). The whole
  measurement stops trying new sizes after `budget_s`.
- **The record** (`ChunkRecords`): one JSON file, `$XDG_CACHE_HOME/dil_jax/chunk_sizes.json`
  (`~/.cache/dil_jax/...`), written atomically; each entry keyed by the machine (CPU model,
  usable cores, platform, device count and kind, jax version) and the reader's shape (kind,
  width, blocks above k, heads, a digest of its config, question and passage lengths). A
  second start on the same machine reads it and measures nothing; another CPU or reader shape
  is another key, so it is measured. `DIL_JAX_CHUNK_SIZES` moves the file (a path) or turns
  records off (`off`: `auto` then takes the platform's default and measures nothing; the test
  suite runs so).
- **The settings** (`resolve_chunk_size`): an integer is used as given; `auto` reads the
  record, else measures on CPU (on accelerators it takes the platform's default unless a
  record exists); `measure` measures again and replaces the record; None (a command's flag
  left out where the command does not default to `auto`) reads the record if there is one,
  else the platform's default, and never measures.

Every choice comes with why (`ChunkChoice.reason`), which `dil-jax serve` prints at start and
`/v1/info` shows.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dil_jax.defaults import (
    ACCELERATOR_CHUNK_CANDIDATES,
    CHUNK_PROBE_BUDGET_S,
    CHUNK_PROBE_REPS,
    CHUNK_TOLERANCE,
    CPU_CHUNK_CANDIDATES,
    default_pair_chunk_size,
)
from dil_jax.errors import UsageError
from dil_jax.rounding import round_up

log = logging.getLogger(__name__)

AUTO = "auto"
MEASURE = "measure"
SETTINGS = (AUTO, MEASURE)
ENV = "DIL_JAX_CHUNK_SIZES"
OFF_VALUES = frozenset({"0", "off", "false", "no"})
RECORD_NAME = "chunk_sizes.json"
RECORD_FORMAT = 1

# How a choice was made (`ChunkChoice.source`).
GIVEN, MEASURED, RECORDED, DEFAULT = "given", "measured now", "read from the record", "default"


def parse_setting(text: str) -> int | str:
    """A --chunk-size value: a positive integer, `auto` or `measure` (ValueError otherwise)."""
    value = text.strip().lower()
    if value in SETTINGS:
        return value
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"must be an integer >= 1, {AUTO!r} or {MEASURE!r}, got {text!r}")
    return number


# ----------------------------------------------------------------------------- the choice

def choose_chunk_size(pairs_per_second: Mapping[int, float],
                      tolerance: float = CHUNK_TOLERANCE) -> int:
    """The chunk size of the best throughput; the smallest size within `tolerance` (a
    fraction) of the best wins, since a smaller chunk pads a batch's last chunk less."""
    if not pairs_per_second:
        raise ValueError("no chunk size was measured")
    best = max(pairs_per_second.values())
    return min(size for size, rate in pairs_per_second.items()
               if rate >= best * (1 - tolerance))


def probe_order(default: int, candidates: Sequence[int],
                rate_of: Callable[[int], float], tolerance: float = CHUNK_TOLERANCE,
                deadline: Callable[[], bool] = lambda: False) -> dict[int, float]:
    """Pairs per second of the candidates worth measuring (`rate_of(size)` measures one),
    from `default` outwards: larger sizes while each new one is the choice
    (`choose_chunk_size`: faster than every smaller one by more than `tolerance`), then, when
    no larger one won, smaller sizes while each new one is the choice (within `tolerance` of
    the best). Stops trying new sizes once `deadline()` is true. Returns what was measured."""
    sizes = sorted(set(candidates) | {default})
    at = sizes.index(default)
    rates = {default: rate_of(default)}
    for upward, direction in ((True, sizes[at + 1:]), (False, sizes[:at][::-1])):
        if not upward and choose_chunk_size(rates, tolerance) > default:
            break  # a larger size won: a smaller one will not
        for size in direction:
            if deadline():
                return rates
            rates[size] = rate_of(size)
            if choose_chunk_size(rates, tolerance) != size:
                break
    return rates


@dataclasses.dataclass(frozen=True)
class ChunkChoice:
    """The chunk size a reader reads with (None: the grid's platform default), where it came
    from (GIVEN, MEASURED, RECORDED, DEFAULT) and the measured pairs per second behind it."""

    size: int | None
    source: str
    pairs_per_second: Mapping[int, float] = dataclasses.field(default_factory=dict)
    record: str | None = None      # the record file read or written
    measured_at: str | None = None
    note: str = ""                 # why a default was kept, for `reason`

    @property
    def reason(self) -> str:
        """One line: the size and why."""
        rates = ", ".join(f"{size}: {rate:.1f}" for size, rate in
                          sorted(self.pairs_per_second.items()))
        measured = f" (pairs/s {rates})" if rates else ""
        if self.source == GIVEN:
            return f"{self.size} (given)"
        if self.source == MEASURED:
            where = f", recorded in {self.record}" if self.record else ""
            return f"{self.size}, measured now{measured}{where}"
        if self.source == RECORDED:
            return (f"{self.size}, read from the record {self.record} (measured "
                    f"{self.measured_at}{measured})")
        return f"{self.size}, the platform's default{f' ({self.note})' if self.note else ''}"

    def info(self) -> dict[str, Any]:
        """As `/v1/info` shows it."""
        return {"chunk_size": self.size, "chunk_size_source": self.source,
                "chunk_size_reason": self.reason}


# ----------------------------------------------------------------------------- the record

def record_file(env: Mapping[str, str] | None = None) -> Path | None:
    """Where choices are recorded: `DIL_JAX_CHUNK_SIZES` (a path; `off` = nowhere: None),
    else `$XDG_CACHE_HOME/dil_jax/chunk_sizes.json` (`~/.cache/...`), beside the compilation
    cache's default folder."""
    from dil_jax.compilation_cache import default_folder

    env = os.environ if env is None else env
    value = env.get(ENV, "").strip()
    if value.lower() in OFF_VALUES:
        return None
    if value:
        return Path(value).expanduser()
    return default_folder(env).parent / RECORD_NAME


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cores() -> int:
    """The cores this process may run on (its affinity), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_key(devices: Sequence[Any]) -> dict[str, Any]:
    """What a choice depends on of the machine: CPU model, usable cores, the devices'
    platform, count and kind, the jax and jaxlib versions."""
    import jax
    import jaxlib

    first = devices[0]
    return {"cpu": cpu_model(), "cores": usable_cores(), "platform": first.platform,
            "devices": len(devices), "device_kind": str(getattr(first, "device_kind", "")),
            "jax": jax.__version__, "jaxlib": jaxlib.__version__}


def reader_key(reader: Any, q_len: int, p_len: int) -> dict[str, Any]:
    """What a choice depends on of the reader: its kind, width, blocks above k, heads (the
    fields a family has), a digest of its whole config, and the question and passage
    lengths it reads."""
    config = reader.config
    fields = (dataclasses.asdict(config) if dataclasses.is_dataclass(config)
              else dict(vars(config)))
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode())
    layers, k = getattr(config, "num_layers", None), getattr(config, "num_lower_layers", None)
    return {"kind": reader.kind,
            "hidden": getattr(config, "hidden_size", None) or getattr(config, "d_model", None),
            "upper_layers": None if layers is None or k is None else layers - k,
            "heads": getattr(config, "num_heads", None), "config": digest.hexdigest()[:16],
            "q_len": int(q_len), "p_len": int(p_len)}


def key_id(key: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


@dataclasses.dataclass
class ChunkRecords:
    """The record file: key -> the chosen size, the pairs per second measured and when."""

    path: Path

    def read_all(self) -> dict[str, Any]:
        """The entries (a missing, unreadable or foreign file reads as none: it is only a
        cache, measured again and rewritten)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("format") != RECORD_FORMAT:
            return {}
        entries = data.get("records")
        return entries if isinstance(entries, dict) else {}

    def get(self, key: Mapping[str, Any]) -> dict[str, Any] | None:
        """The entry of exactly this key, or None."""
        entry = self.read_all().get(key_id(key))
        if not isinstance(entry, dict) or entry.get("key") != dict(key):
            return None
        size = entry.get("chunk_size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            return None
        return entry

    def put(self, key: Mapping[str, Any], size: int, rates: Mapping[int, float],
            seconds: float) -> dict[str, Any]:
        """Records a choice (atomically; the other keys' entries are kept). A file that cannot
        be written is only warned about: the choice still holds for this run."""
        from dil_jax.atomic import write_atomic
        from dil_jax.errors import OutputPathError

        entry = {"key": dict(key), "chunk_size": int(size),
                 "pairs_per_second": {str(s): round(r, 3) for s, r in sorted(rates.items())},
                 "seconds": round(seconds, 2),
                 "measured_at": datetime.datetime.now(datetime.UTC).strftime(
                     "%Y-%m-%d %H:%M UTC")}
        entries = self.read_all()
        entries[key_id(key)] = entry
        text = json.dumps({"format": RECORD_FORMAT, "records": entries}, indent=1,
                          sort_keys=True) + "\n"
        try:
            write_atomic(self.path, text)
        except (OSError, OutputPathError) as error:
            log.warning("could not record the chunk size in %s (%s); set %s to a writable "
                        "file, or %s=off", self.path, error, ENV, ENV)
        return entry


# ----------------------------------------------------------------------------- the measurement

def measure_chunk_sizes(reader: Any, candidates: Sequence[int], default: int,
                        reps: int = CHUNK_PROBE_REPS, budget_s: float = CHUNK_PROBE_BUDGET_S,
                        clock: Callable[[], float] = time.perf_counter) -> dict[int, float]:
    """Pairs per second of an `OpenDomainReader`'s pair program at chunk sizes from
    `candidates` (`probe_order` from `default`). Each size reads one whole chunk of pairs
    through the reader's own grid and inputs (its question batch, its passage side padded as
    its reads pad it, the cached first-upper-block arrays where it reads them), every
    question and window at its full length (the widest program, the one a server compiles
    first), in the hoist class of a whole batch of top_p windows a question: one call
    compiles it, then `reps` timed calls, the fastest counted. The grid's chunk size is
    restored afterwards."""
    import jax
    import numpy as np

    grid = reader.grid
    params = reader.reader.params
    q_lower, q_mask = reader._encode_question_batch(["?"])
    q_mask = np.ones_like(q_mask)
    rows = np.zeros(1, np.int64)
    p_source, p_mask = reader._passage_side(rows)
    p_mask = np.ones_like(p_mask)
    # The hoist class of a whole batch (`PairGrid.iter_pair_chunks`' rule): its questions
    # reading top_p windows each, one per passage row.
    given: dict[str, Any] = {}
    plan = getattr(grid, "plan", None)
    if reader.reader.capabilities.pair_reuse and plan is not None and plan.hoists_projections:
        pairs = grid.batch_size * getattr(reader, "top_p", 1)
        if plan.projects(pairs, q_lower.shape[0]):
            given["q_qkv"] = grid.project_segments(params, q_lower)
        if reader.reads_cached_reuse:
            given["p_qkv"], given["p_stats"] = reader._cached_reuse(rows)
        elif plan.projects_passages(pairs, p_source.shape[0], False):
            given["p_qkv"] = grid.project_segments(params, p_source)
            if plan.computes_passage_stats(pairs, p_source.shape[0], False):
                given["p_stats"] = grid.passage_attention_stats(given["p_qkv"], p_mask)
    start = clock()
    kept = grid.chunk_size

    def rate_of(size: int) -> float:
        grid.set_chunk_size(size)
        index = np.zeros(grid.chunk_size, np.int64)

        def once() -> float:
            began = clock()
            for _, outputs in grid.iter_pair_chunks(params, q_lower, q_mask, p_source, p_mask,
                                                    index, index, **given):
                jax.block_until_ready(outputs)
            return clock() - began

        once()  # compiles
        fastest = min(once() for _ in range(max(reps, 1)))
        return grid.chunk_size / max(fastest, 1e-9)

    try:
        return probe_order(default, candidates, rate_of,
                           deadline=lambda: clock() - start > budget_s)
    finally:
        grid.set_chunk_size(kept)


# ----------------------------------------------------------------------------- the setting

def resolve_chunk_size(setting: int | str | None, reader: Any,
                       env: Mapping[str, str] | None = None,
                       say: Callable[[str], None] | None = None,
                       measure: Callable[..., dict[int, float]] | None = None,
                       clock: Callable[[], float] = time.perf_counter) -> ChunkChoice:
    """The chunk size an `OpenDomainReader` reads with under `setting` (see the module
    docstring: an integer, AUTO, MEASURE or None), set on its grid, and why. say: told a
    line before a measurement starts (it takes seconds). measure (None:
    `measure_chunk_sizes`), clock: for tests."""
    if isinstance(setting, int) and not isinstance(setting, bool):
        if setting < 1:
            raise UsageError(f"--chunk-size {setting}: must be an integer >= 1, {AUTO!r} or "
                             f"{MEASURE!r}")
        reader.grid.set_chunk_size(setting)
        return ChunkChoice(reader.grid.chunk_size, GIVEN)
    if setting not in (None, AUTO, MEASURE):
        raise UsageError(f"--chunk-size {setting!r}: must be an integer >= 1, {AUTO!r} or "
                         f"{MEASURE!r}")
    grid = reader.grid
    devices = list(grid.mesh.devices.flat)
    on_cpu = devices[0].platform == "cpu"
    default = default_pair_chunk_size(devices[0].platform)
    path = record_file(env)
    if path is None and setting != MEASURE:
        grid.set_chunk_size(default)
        return ChunkChoice(grid.chunk_size, DEFAULT, note=f"{ENV}=off: nothing recorded or "
                                                          "measured")
    key = {**machine_key(devices),
           **reader_key(reader.reader, reader.reader.config.max_question_len,
                        reader.cache.mask.shape[1])}
    records = None if path is None else ChunkRecords(path)
    if setting != MEASURE and records is not None:
        entry = records.get(key)
        if entry is not None:
            grid.set_chunk_size(entry["chunk_size"])
            rates = {int(s): float(r) for s, r in entry.get("pairs_per_second", {}).items()}
            return ChunkChoice(grid.chunk_size, RECORDED, rates, str(path),
                               entry.get("measured_at"))
    if setting is None or (setting == AUTO and not on_cpu):
        grid.set_chunk_size(default)
        note = ("no record for this machine and reader" if setting is None else
                "accelerators are measured only with --chunk-size measure")
        return ChunkChoice(grid.chunk_size, DEFAULT, note=note)
    # Every device reads an equal slice: sizes are multiples of the device count.
    candidates = sorted({round_up(size, len(devices)) for size in
                         (CPU_CHUNK_CANDIDATES if on_cpu else ACCELERATOR_CHUNK_CANDIDATES)})
    default = round_up(default, len(devices))
    began = clock()
    line = (f"measuring the pair program's chunk size for {reader.reader.label} on this "
            "machine (a few seconds" + (f"; recorded in {path}, read at later starts)"
                                         if path is not None else ")"))
    log.info(line)
    if say is not None:
        say(line)
    rates = (measure or measure_chunk_sizes)(reader, candidates, default)
    size = choose_chunk_size(rates)
    if records is not None:
        records.put(key, size, rates, clock() - began)
    grid.set_chunk_size(size)
    return ChunkChoice(grid.chunk_size, MEASURED, rates, None if path is None else str(path))
