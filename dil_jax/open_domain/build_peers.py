"""The processes of one sharded build agree on their settings, or fail at their first poll.

Processes of a sharded build (`dil-jax index --num-processes N`) meet only through file polls
in the index folder. Given different flags (`--cache-chunk 3` on one, 4 on another), each would
wait for a plan or shard the other never writes, for `--wait-timeout`; instead they compare:

    DIR/.build-run.json               process 0's settings (by flag) and its lock record: who
                                      wrote them (pid, host, start time, as in DIR/.lock)
    DIR/.build-refused-process-I.json process I's refusal of them, for process 0 to read

Process 0 writes `.build-run.json` when it starts (holding DIR/.lock). Process i > 0 compares
it with its own settings at every poll of its waits (`check_peer_settings`), but only when it
is the live run's: its lock record is the one DIR/.lock holds now, and the holder is not a
dead process on this host (on another host it cannot be told, and counts as alive). A
disagreement fails process i at once, naming each setting and both values, and leaves a
refusal that fails process 0 at its next poll (`check_refusals`). A record of an earlier run
is ignored: a process started before its run's process 0 waits for it.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from dil_jax.atomic import write_atomic
from dil_jax.errors import UsageError
from dil_jax.open_domain.cache.storage import Storage
from dil_jax.open_domain.index.lock import LOCK_NAME, pid_alive

RUN_RECORD = ".build-run.json"
_REFUSAL_PREFIX = ".build-refused-process-"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def holder_record(directory: Path) -> dict[str, Any] | None:
    """The lock record (pid, host, started) in DIR/.lock: the running process 0's while one
    runs, else the last one's."""
    record = _read_json(directory / LOCK_NAME)
    return record if isinstance(record, dict) else None


def holder_may_be_alive(record: dict[str, Any]) -> bool:
    """False only for a process of this host that is gone."""
    if record.get("host") != socket.gethostname():
        return True
    return isinstance(record.get("pid"), int) and pid_alive(record["pid"])


def write_run_record(directory: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """(Process 0, holding DIR/.lock.) Publishes this run's settings under its lock record,
    and drops refusals of earlier runs; returns the record (None if the lock file holds
    none)."""
    by = holder_record(directory)
    for stale in directory.glob(f"{_REFUSAL_PREFIX}*.json"):
        stale.unlink(missing_ok=True)
    write_atomic(directory / RUN_RECORD, json.dumps(dict(by=by, settings=settings), indent=2))
    return by


def settings_disagreement(theirs: dict[str, Any], mine: dict[str, Any]) -> list[str]:
    """'FLAG: process 0 has A, this process B' for every setting (keyed by its flag) that
    differs."""
    return [f"{flag}: process 0 has {theirs.get(flag)!r}, this process {mine.get(flag)!r}"
            for flag in sorted(set(theirs) | set(mine)) if theirs.get(flag) != mine.get(flag)]


def _describe(by: dict[str, Any]) -> str:
    return (f"process 0 (pid {by.get('pid')} on {by.get('host')}, started "
            f"{by.get('started')})")


def check_peer_settings(directory: Path, mine: dict[str, Any], process_index: int) -> None:
    """(Process i > 0, at each poll.) UsageError naming every setting in which the live
    process 0 differs from this process, after leaving it a refusal; nothing while there is
    no live run record (module docstring)."""
    record = _read_json(directory / RUN_RECORD)
    holder = holder_record(directory)
    if not isinstance(record, dict) or holder is None or record.get("by") != holder \
            or not holder_may_be_alive(holder) or not isinstance(record.get("settings"), dict):
        return
    differences = settings_disagreement(record["settings"], mine)
    if not differences:
        return
    message = (f"{directory}: {_describe(holder)} and this process {process_index} build with "
               f"other settings: {'; '.join(differences)}; give every process the same flags")
    write_atomic(directory / f"{_REFUSAL_PREFIX}{process_index}.json",
                 json.dumps(dict(by=holder, message=message)))
    raise UsageError(message)


def check_refusals(directory: Path, by: dict[str, Any] | None) -> None:
    """(Process 0, at each poll.) UsageError with the message of a process that refused this
    run's settings (its refusal names this run's lock record `by`)."""
    for path in sorted(directory.glob(f"{_REFUSAL_PREFIX}*.json")):
        refusal = _read_json(path)
        if isinstance(refusal, dict) and by is not None and refusal.get("by") == by:
            number = path.name[len(_REFUSAL_PREFIX):-len(".json")]
            raise UsageError(f"process {number} refused this build: {refusal.get('message')}")


def peer_settings(readers: list[tuple[int, str]], *, chunk_passages: int,
                  storage: Storage | None,
                  cache_reuse: bool, num_processes: int, max_passage_len: int,
                  doc_stride: int) -> dict[str, Any]:
    """The settings every process of a sharded build must share, keyed by flag (JSON values:
    the run record is a file): readers are (k, weights fingerprint) in --k order (paths may
    differ between hosts; weights may not)."""
    return {"--k": [k for k, _ in readers], "--checkpoint (weights fingerprint)":
            [model for _, model in readers], "--cache-chunk": chunk_passages,
            # None: not given, resolved alike by every process (`storage_to_build`).
            "--cache-dtype": storage.name if storage else None, "--cache-reuse": cache_reuse,
            "--num-processes": num_processes, "--max-passage-len": max_passage_len,
            "--doc-stride": doc_stride}

