"""A reader checkpoint's name resolved once into where and what it is: `ResolvedCheckpoint`.

A command's `--checkpoint` (a dil_jax folder, a Hugging Face folder, "default" or a hub id) is
resolved here and nowhere else (`resolve_reader_checkpoint`): the one place that decides "dil_jax
folder or Hugging Face folder", where a hub id is fetched. The resolved value is then carried to
the loader, the tokenizer, the manifest and the records a trained reader keeps beside its
weights, so none of them looks the name up again.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from pathlib import Path

from dil_jax.checkpoints.char_readers import char_reader_kind
from dil_jax.checkpoints.files import read_json
from dil_jax.checkpoints.manifest import MANIFEST_FILE, ExportManifest
from dil_jax.checkpoints.orbax_io import ENCODER_CONFIG_FILE, TRAINED_FROM_FILE
from dil_jax.checkpoints.windows import WINDOWS_FIELD, TrainedWindows
from dil_jax.errors import CheckpointError
from dil_jax.hub import resolve_checkpoint

# The two formats a reader checkpoint comes in.
ORBAX_FORMAT = "dil_jax"  # orbax params/ beside encoder_config.json, as training saves them
HF_FORMAT = "hugging_face"  # config.json and weights files (local, "default" or a hub id)
# A QANet / BiDAF export: orbax variables beside a manifest naming its model_kind
# (`checkpoints.char_readers`).
CHAR_READER_FORMAT = "char_reader"


@dataclasses.dataclass(frozen=True)
class ResolvedCheckpoint:
    """A checkpoint as found: `name` as given (what messages and records show), the local
    `folder`, and its `format` (ORBAX_FORMAT, HF_FORMAT or CHAR_READER_FORMAT)."""

    name: str
    folder: Path
    format: str

    @property
    def is_orbax(self) -> bool:
        return self.format == ORBAX_FORMAT

    @functools.cached_property
    def model_kind(self) -> str:
        """The kind of model it holds, which picks its reader family
        (`readers.loading.READER_FAMILIES`): "qanet" / "bidaf" for a QANet / BiDAF export (its
        manifest's), else "encoder" (the BERT family)."""
        from dil_jax.model.char_reader import ENCODER_KIND

        kind = char_reader_kind(self.folder) if self.format == CHAR_READER_FORMAT else None
        return kind or ENCODER_KIND

    @functools.cached_property
    def manifest(self) -> ExportManifest:
        """The folder's `dil_jax_manifest.json` (a Hugging Face export's), read on first use:
        empty for a dil_jax folder or a plain Hugging Face one."""
        return ExportManifest() if self.is_orbax else ExportManifest.read(self.folder)

    @functools.cached_property
    def trained_k(self) -> int | None:
        """The k the reader was trained with, before any --k: a dil_jax folder's saved config,
        a Hugging Face export's manifest (None when neither records one)."""
        if not self.is_orbax:
            return self.manifest.trained_k
        stored = read_json(self.folder / ENCODER_CONFIG_FILE, "dil_jax encoder config")
        trained = stored.get("num_lower_layers") if isinstance(stored, dict) else None
        return trained if isinstance(trained, int) and not isinstance(trained, bool) else None

    @functools.cached_property
    def trained_windows(self) -> TrainedWindows | None:
        """The passage windows the reader was trained on, as recorded: `trained_from.json`'s
        "windows" (a `dil-jax train` export), else the manifest's training config (a Hugging
        Face export: the bundled readers); None when neither records them (a plain Hugging Face
        checkpoint, an export written before the record existed). A malformed record is a
        CheckpointError naming its file and field."""
        path = self.folder / TRAINED_FROM_FILE
        record = read_json(path, "training record") if path.is_file() else None
        if isinstance(record, dict) and WINDOWS_FIELD in record:
            windows = record[WINDOWS_FIELD]
            if not isinstance(windows, dict):
                raise CheckpointError(f"{path}: '{WINDOWS_FIELD}' must be an object, got "
                                      f"{windows!r}; fix or remove it")
            return TrainedWindows.from_record(windows, f"{path} '{WINDOWS_FIELD}'")
        data = self.manifest.training_config.get("data")
        if isinstance(data, dict) and ("max_passage_len" in data or "doc_stride" in data):
            return TrainedWindows.from_record(
                data, f"{self.folder / MANIFEST_FILE} training_config.data")
        return None

    def recorded_null_threshold(self) -> float | None:
        """The SQuAD v2.0 null threshold a trained reader's export records (`trained_from.json`
        beside its params), or None: no such record, or a run that chose none.

        A value that is not a finite number is a CheckpointError naming the file.
        """
        path = self.folder / TRAINED_FROM_FILE
        if not path.is_file():
            return None
        record = read_json(path, "training record")
        value = record.get("null_threshold") if isinstance(record, dict) else None
        if value is None:
            return None
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value)):
            raise CheckpointError(f"{path}: 'null_threshold' must be a finite number, got "
                                  f"{value!r}; fix or remove it (then pass --null-threshold)")
        return float(value)


def resolve_reader_checkpoint(checkpoint: str | os.PathLike | ResolvedCheckpoint
                              ) -> ResolvedCheckpoint:
    """Where a reader checkpoint is and which format: a folder holding `encoder_config.json` is
    a dil_jax one; anything else is a Hugging Face checkpoint (`dil_jax.hub.resolve_checkpoint`:
    a local folder, "default", or a hub id fetched when online). A resolved one is returned as
    it is. CheckpointError when the name points nowhere."""
    if isinstance(checkpoint, ResolvedCheckpoint):
        return checkpoint
    name = str(checkpoint)
    folder = Path(name).expanduser()
    if (folder / ENCODER_CONFIG_FILE).is_file():
        return ResolvedCheckpoint(name, folder, ORBAX_FORMAT)
    if folder.is_dir() and char_reader_kind(folder):
        return ResolvedCheckpoint(name, folder, CHAR_READER_FORMAT)
    return ResolvedCheckpoint(name, resolve_checkpoint(name), HF_FORMAT)

