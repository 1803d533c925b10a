"""What `index.json` records about an index folder, and the checks made against it on open.

    index.json   split strategy, lengths, tokenizer, passage fingerprint, counts (the settings),
                 and the size and sha256 of every file in CHECKED_FILES (`files`)

`read_settings` reads and validates index.json; `check_file` refuses a file whose size or
sha256 differs from its record (its cost: docs/open_domain.md, "Checked on open"), so an index
edited after it was built is refused, naming the file, instead of giving answers shifted by it;
`settings_differences` names the settings a run disagrees with a built index in.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from dil_jax.errors import DilJaxError

# /2: windows.npz holds the windows' real tokens only (index/windows.py); /1 (padded windows)
# still opens. The caches do not depend on it: the windows, their rows and tokens are the same.
INDEX_FORMAT = "dil_jax.odqa_index/2"
READABLE_INDEX_FORMATS = ("dil_jax.odqa_index/1", INDEX_FORMAT)
# Files whose size and sha256 index.json records, besides the BM25 engine's (`bm25/...`,
# `retrieval.engines.index_files`); the caches check themselves.
CHECKED_FILES = ("passages.jsonl", "passages.offsets.npy", "windows.npz")
# Settings that decide the passages and windows: an index (and its caches) is reused only when
# all of them agree.
CORE_SETTINGS = ("format", "split", "max_passage_len", "doc_stride", "tokenizer", "passages",
                 "num_passages", "num_windows")
REPAIR_HINT = "rerun `dil-jax index` with the same --out and settings to repair it"


class OpenDomainIndexError(DilJaxError, ValueError):
    """An index folder is missing, incomplete or built with other settings; names the field."""


class IndexBrokenError(OpenDomainIndexError):
    """A file of a built index is missing, unreadable, or changed since the build."""


def broken_file(path: Path, problem: str) -> IndexBrokenError:
    """IndexBrokenError naming the file, its problem and the repair."""
    return IndexBrokenError(f"{path}: {problem}; {REPAIR_HINT}")


def file_fingerprint(path: Path, data: bytes | None = None) -> dict[str, Any]:
    """{"bytes": size, "sha256": hex digest} of a file (or of `data`, its bytes, when read)."""
    if data is None:
        digest = hashlib.sha256()
        with path.open("rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
        return dict(bytes=path.stat().st_size, sha256=digest.hexdigest())
    return dict(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())


def check_file(directory: Path, name: str, recorded: dict[str, Any],
               data: bytes | None = None) -> None:
    """Refuses (IndexBrokenError) a file whose size or sha256 differs from index.json's."""
    path = directory / name
    if not path.is_file():
        raise broken_file(path, "the file is missing")
    size = path.stat().st_size if data is None else len(data)
    if size != recorded.get("bytes"):
        raise broken_file(path, f"{size} bytes, index.json recorded {recorded.get('bytes')}: "
                          "the file changed since the index was built")
    if file_fingerprint(path, data)["sha256"] != recorded.get("sha256"):
        raise broken_file(path, "its sha256 differs from the one index.json recorded: "
                          "the file changed since the index was built")


def settings_differences(stored: dict[str, Any], wanted: dict[str, Any]) -> list[str]:
    """'setting: index has A, this run B' for each setting of `wanted` the index differs in.

    Both dicts are index.json settings (`wanted` as `index_settings` computes them for a run).
    """
    old_split, new_split = stored.get("split") or {}, wanted.get("split") or {}
    pairs = [("--split", old_split.get("strategy"), new_split.get("strategy")),
             ("--corpus-limit", old_split.get("limit"), new_split.get("limit")),
             ("--max-passage-len", stored.get("max_passage_len"), wanted["max_passage_len"]),
             ("--doc-stride", stored.get("doc_stride"), wanted["doc_stride"]),
             ("tokenizer", stored.get("tokenizer"), wanted["tokenizer"])]
    lines = [f"{name}: index has {old!r}, this run {new!r}" for name, old, new in pairs
             if old != new]
    if stored.get("passages") != wanted["passages"]:
        lines.append(f"--corpus: index has {stored.get('num_passages')} passages from "
                     f"{old_split.get('sources')}, this run {wanted['num_passages']} passages "
                     f"from {new_split.get('sources')} (fingerprints {stored.get('passages')} "
                     f"vs {wanted['passages']})")
    return lines


def stored_settings(directory: Path) -> dict[str, Any] | None:
    """index.json's settings, or None when there is none or it is unreadable."""
    try:
        settings = json.loads((directory / "index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return settings if isinstance(settings, dict) else None


def read_settings(directory: str | os.PathLike) -> dict[str, Any]:
    """index.json of an index folder; OpenDomainIndexError (naming the fix) if missing or bad."""
    directory = Path(directory)
    settings_path = directory / "index.json"
    if not settings_path.is_file():
        raise OpenDomainIndexError(f"{directory}: not an open-domain index (no index.json); "
                                   "build one with `dil-jax index`")
    try:
        settings = json.loads(settings_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise broken_file(settings_path, f"not readable JSON ({error})") from error
    if not isinstance(settings, dict):
        raise broken_file(settings_path, "expected a JSON object")
    if settings.get("format") not in READABLE_INDEX_FORMATS:
        raise OpenDomainIndexError(f"{settings_path}: format {settings.get('format')!r}, expected "
                                   f"one of {', '.join(map(repr, READABLE_INDEX_FORMATS))} (an "
                                   "index written by a newer dil_jax?)")
    missing = [f for f in CORE_SETTINGS if f not in settings]
    if missing:
        raise broken_file(settings_path, f"field(s) {', '.join(missing)} missing")
    return settings

