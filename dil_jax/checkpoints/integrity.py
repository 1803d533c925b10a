"""Whether a reader's weights and tokenizer are still the ones it was exported with.

`export_hf_checkpoint` records both in `dil_jax_manifest.json`:

  "weights":   {file name: {"bytes": size, "sha256": hex digest}} of each weights file;
  "tokenizer": {"vocabulary": `vocabulary_fingerprint`, "size": tokens,
                "special_tokens": {name: [token, id]}, "pair_layout": [first, [between], last],
                "files": {tokenizer file: sha256}}.

`load_reader` checks them. Why: a flipped byte in a copy or on disk does not stop a reader from
loading, it only makes it answer worse (4 KiB overwritten in a bundled reader's weights: exit 0,
F1 9 instead of 92); and a tokenizer of the same size with other ids passes the size checks and
turns every question into other words. A folder that records neither (a plain Hugging Face
checkpoint, an older export) gets the weaker checks that need no record: every tensor loaded must
be finite (`convert_state_dict`, `check_finite_params`), and the special tokens must be in the
tokenizer's own vocabulary (`tokenization.check_tokenizer`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np

from dil_jax.checkpoints.files import DAMAGED_FIX, weights_files
from dil_jax.checkpoints.fingerprint import file_digest
from dil_jax.errors import CheckpointError
from dil_jax.tokenization import (
    TokenizationError,
    pair_layout,
    special_token_ids,
    vocabulary_fingerprint,
)

WEIGHTS_FIELD = "weights"
TOKENIZER_FIELD = "tokenizer"
# Files a tokenizer is read from (what `save_pretrained` writes, by family), whose digests an
# export records so that a load reading the same bytes can skip the vocabulary fingerprint.
TOKENIZER_RECORD_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                          "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt",
                          "spiece.model", "sentencepiece.bpe.model")
# What to do with a folder whose weights were changed on purpose after export.
_ON_PURPOSE = ("(if you changed the weights on purpose, remove the manifest's 'weights' record to "
               "load them unchecked)")


def weights_record(folder: Path) -> dict[str, dict[str, Any]]:
    """{file name: file_digest} of every weights file of the folder (`weights_files`)."""
    return {name: file_digest(folder / name) for name in weights_files(folder)}


def check_weights(folder: Path, recorded: dict[str, dict[str, Any]], manifest_path: Path
                  ) -> None:
    """Raises CheckpointError unless each weights file is recorded and has its recorded size
    and sha256; the message names the file, both digests and the fix."""
    for name in weights_files(folder):
        if name not in recorded:
            raise CheckpointError(
                f"{folder / name}: not a weights file {manifest_path} records (it records "
                f"{', '.join(sorted(recorded))}): the folder changed after export; re-export or "
                f"re-download it {_ON_PURPOSE}")
    for name, expected in recorded.items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path}: missing, but {manifest_path} records it as a weights "
                                  f"file; {DAMAGED_FIX}")
        size = path.stat().st_size
        if size != expected["bytes"]:  # cheaper than hashing, and says "cut short" plainly
            raise CheckpointError(
                f"{path}: {size} bytes, but {manifest_path} records {expected['bytes']}; "
                f"{DAMAGED_FIX} {_ON_PURPOSE}")
        actual = file_digest(path)["sha256"]
        if actual != expected["sha256"]:
            raise CheckpointError(
                f"{path}: sha256 {actual}, but {manifest_path} records {expected['sha256']}: "
                f"the weights changed after export (a bad copy, download or disk); {DAMAGED_FIX} "
                f"{_ON_PURPOSE}")


def nonfinite_count(value: np.ndarray) -> int:
    """How many entries of a float array are NaN or infinite (0 for other dtypes)."""
    value = np.asarray(value)
    if not np.issubdtype(value.dtype, np.floating):
        return 0
    return int(value.size - np.count_nonzero(np.isfinite(value)))


def check_finite_params(params: Any, source: str) -> None:
    """Raises CheckpointError naming the first param (and `source`) holding a NaN or inf.

    The check every reader gets, digest or not: a digest proves the bytes are the exported
    ones, not that training left them finite, and a folder with no digest has nothing else.
    """
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        bad = nonfinite_count(leaf)
        if bad:
            raise CheckpointError(
                f"{source}: param {jax.tree_util.keystr(path)} has {bad} NaN or infinite "
                f"value(s) of {np.size(leaf)}; {DAMAGED_FIX}")


def tokenizer_files(folder: Path) -> dict[str, str]:
    """{name: sha256} of the tokenizer files the folder holds (`TOKENIZER_RECORD_FILES`)."""
    return {name: file_digest(folder / name)["sha256"] for name in TOKENIZER_RECORD_FILES
            if (folder / name).is_file()}


def _cheap_record(tokenizer, folder: Path | None) -> dict[str, Any]:
    """The parts of `tokenizer_record` that cost well under a millisecond: size, special
    tokens, pair layout, and the digests of the files it was read from (with a folder)."""
    layout = pair_layout(tokenizer)
    record = {"size": len(tokenizer), "special_tokens": special_token_ids(tokenizer),
              "pair_layout": [layout.first, list(layout.question_end), layout.passage_end]}
    if folder is not None:
        record["files"] = tokenizer_files(folder)
    return record


def tokenizer_record(tokenizer, folder: Path | None = None) -> dict[str, Any]:
    """What an export records of its tokenizer: vocabulary fingerprint, size, the special
    tokens' ids, the pair layout (the template's ids around question and passage) and, with
    the folder it is saved in, the digests of its files."""
    return {"vocabulary": vocabulary_fingerprint(tokenizer), **_cheap_record(tokenizer, folder)}


def tokenizer_differences(actual: dict[str, Any], recorded: dict[str, Any]) -> list[str]:
    """'what: this tokenizer's value (recorded value)' for each field both records hold that
    differs. The file digests are not compared here: other bytes may hold the same tokenizer.

    Only fields the record has are compared, so a record from an older export (fewer fields)
    still checks what it holds.
    """
    differences = []
    for field in ("vocabulary", "size", "pair_layout"):
        if field in recorded and field in actual and actual[field] != recorded[field]:
            differences.append(f"{field} {actual[field]} (recorded {recorded[field]})")
    for name, recorded_token in (recorded.get("special_tokens") or {}).items():
        token = actual["special_tokens"].get(name)
        if token != recorded_token:
            differences.append(f"{name} {token} (recorded {recorded_token})")
    return differences


def check_tokenizer_record(tokenizer, recorded: dict[str, Any], manifest_path: Path,
                           source: str, given: bool, folder: Path | None = None) -> None:
    """Raises TokenizationError when `tokenizer` is not the one the manifest records.

    source: where the tokenizer came from; given: it was passed with --tokenizer (else it is the
    reader folder's own files), which decides the fix the message gives.
    folder: the folder it was read from. When its tokenizer files are byte for byte the ones
    recorded, the vocabulary fingerprint (sorting and serialising ~30,000 tokens: ~150 ms, a
    tenth of opening a reader) is not computed: the same bytes are the same vocabulary.
    """
    actual = _cheap_record(tokenizer, folder)
    if not actual.get("files") or actual["files"] != recorded.get("files"):
        actual["vocabulary"] = vocabulary_fingerprint(tokenizer)
    differences = tokenizer_differences(actual, recorded)
    if not differences:
        return
    fix = ("leave out --tokenizer to read with the reader's own, or pass the tokenizer it was "
           "trained with" if given else
           "the folder's tokenizer files changed after export: restore them (re-download or "
           "re-export the reader)")
    raise TokenizationError(
        f"{source}: not the tokenizer the reader was exported with ({'; '.join(differences)}; "
        f"recorded in {manifest_path}): its ids would stand for other words and every answer "
        f"would be wrong; {fix}")
