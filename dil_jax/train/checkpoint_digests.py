"""The sha256 of every file of a training checkpoint step, recorded once the step is complete
and checked before it is restored.

Orbax checks structure, not bytes: a flipped byte in an array file restores as a wrong (finite)
value, and the run went on from it until it "diverged" several steps later, blamed on the
learning rate. The record is a JSON file inside the step folder (`DIGESTS_FILE`: {relative path:
{"bytes", "sha256"}}), written after orbax has finished the step (atomically: write, then
rename); a step without one (written by older code, or killed between orbax's finish and the
record) is restored unchecked, as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dil_jax.atomic import write_atomic
from dil_jax.checkpoints.fingerprint import file_digest

DIGESTS_FILE = "dil_jax_digests.json"


def step_file_digests(step_dir: Path) -> dict[str, dict[str, Any]]:
    """{path relative to step_dir: {"bytes", "sha256"}} of every regular file under it but the
    record itself, in sorted order."""
    return {str(path.relative_to(step_dir)): file_digest(path)
            for path in sorted(step_dir.rglob("*"))
            if path.is_file() and path.name != DIGESTS_FILE}


def record_step_digests(step_dir: Path) -> None:
    """Writes step_dir/DIGESTS_FILE for the files the step holds now (call once it is final)."""
    write_atomic(step_dir / DIGESTS_FILE, json.dumps(step_file_digests(step_dir), indent=1))


def step_digest_problem(step_dir: Path) -> str | None:
    """What differs from the step's recorded digests ("file X: sha256 ... recorded ..."), or
    None when all match or nothing was recorded. Extra files are not a problem (orbax may add
    metadata); a recorded file that is missing, resized or changed is."""
    record_path = step_dir / DIGESTS_FILE
    if not record_path.is_file():
        return None
    try:
        recorded = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        return f"{record_path}: unreadable digest record ({error})"
    if not isinstance(recorded, dict):
        return f"{record_path}: not a digest record"
    changed = []
    for name, digest in recorded.items():
        path = step_dir / name
        if not path.is_file():
            changed.append(f"{path}: missing")
            continue
        actual = file_digest(path)
        if actual != digest:
            changed.append(f"{path}: sha256 {actual['sha256'][:16]}..., {actual['bytes']} "
                           f"bytes, but {DIGESTS_FILE} records {str(digest.get('sha256'))[:16]}"
                           f"..., {digest.get('bytes')} bytes")
    if not changed:
        return None
    more = f" (and {len(changed) - 1} more file(s))" if len(changed) > 1 else ""
    return f"bytes changed on disk after the save: {changed[0]}{more}"
