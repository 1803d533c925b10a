"""`dil_jax_manifest.json`: what an exported reader records beside its Hugging Face files.

`ExportManifest` is the file as a value: written by `export_hf_checkpoint` (`to_json`), read
once per load (`ExportManifest.read`, which checks every known field) and then carried: the
split the reader was exported / trained with (`reader_defaults`, `trained_k`), the tensors it
left to a base checkpoint (`base_checkpoint`, `from_base`), and what its weights and tokenizer
must be (`weights`, `tokenizer`: `dil_jax.checkpoints.integrity`). Fields it does not know
(notes, earlier training stages) are kept as they are in `records`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dil_jax.checkpoints.files import read_json
from dil_jax.errors import CheckpointError
from dil_jax.model.encoder_config import ReaderOverrides

MANIFEST_FILE = "dil_jax_manifest.json"
# What an export records in "reader". A training config's "model" holds them too, under the same
# names: each is recorded once, in "reader", where the two agree (`ExportManifest.with_reader`).
READER_FIELDS = ("num_lower_layers", "max_question_len", "passage_position_offset")
_KNOWN_FIELDS = ("training_config", "reader", "base_checkpoint", "from_base", "weights",
                 "tokenizer")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_FIX = "re-export the reader, or delete the file to load the weights without it"


def _weights_problem(weights: Any) -> str | None:
    """What is wrong with a manifest's 'weights' record ({file: {bytes, sha256}}), or None."""
    if not isinstance(weights, dict) or not weights:
        return f"'weights' must be a non-empty object of file name -> digest, got {weights!r:.80}"
    for name, digest in weights.items():
        if (not isinstance(digest, dict) or isinstance(digest.get("bytes"), bool)
                or not isinstance(digest.get("bytes"), int) or digest["bytes"] < 0
                or not isinstance(digest.get("sha256"), str)
                or not _SHA256.fullmatch(digest["sha256"])):
            return (f"'weights.{name}' must be {{\"bytes\": size, \"sha256\": 64 hex digits}}, "
                    f"got {digest!r:.120}")
    return None


def _manifest_problem(manifest: Any) -> str | None:
    """What is wrong with a manifest's known fields (`ExportManifest.from_json`), or None."""
    if not isinstance(manifest, dict):
        return f"expected a JSON object, got {type(manifest).__name__}"
    reader = manifest.get("reader", {})
    if not isinstance(reader, dict):
        return f"'reader' must be an object, got {reader!r}"
    for key, value in reader.items():
        if key not in READER_FIELDS:
            return f"unknown field 'reader.{key}' (known: {', '.join(READER_FIELDS)})"
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"'reader.{key}' must be a non-negative integer, got {value!r}"
    training = manifest.get("training_config", {})
    if not isinstance(training, dict) or not isinstance(training.get("model", {}), dict):
        return "'training_config' (and its 'model') must be objects"
    from_base = manifest.get("from_base") or []
    if not isinstance(from_base, list) or not all(isinstance(n, str) for n in from_base):
        return f"'from_base' must be a list of tensor names, got {from_base!r}"
    if "weights" in manifest and (problem := _weights_problem(manifest["weights"])):
        return problem
    tokenizer = manifest.get("tokenizer", {})
    if not isinstance(tokenizer, dict) or not all(
            isinstance(tokenizer.get(field, {}), dict) for field in ("special_tokens", "files")):
        return ("'tokenizer' (and its 'special_tokens' and 'files') must be objects, got "
                f"{tokenizer!r:.80}")
    if from_base and not isinstance(manifest.get("base_checkpoint"), str):
        return ("'from_base' names tensors but 'base_checkpoint' (the checkpoint they come "
                f"from) is {manifest.get('base_checkpoint')!r}")
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True)
class ExportManifest:
    """An exported reader's `dil_jax_manifest.json` (an empty one: the folder has none).

    reader: READER_FIELDS as exported, the one record of k, the question length and the
    passage offset (absent offset: 0); training_config: the run's config (its "model" records
    num_lower_layers, max_question_len and passage_position_offset only where they are not the
    reader's: `with_reader`; manifests written before record them there too); base_checkpoint /
    from_base: tensors
    left to a base checkpoint; weights: {file: {"bytes", "sha256"}} or None; tokenizer: the
    tokenizer record ({} when none); records: every other field, free-form, kept as read.
    """

    reader: Mapping[str, int] = dataclasses.field(default_factory=dict)
    training_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    base_checkpoint: str | None = None
    from_base: tuple[str, ...] = ()
    weights: Mapping[str, Mapping[str, Any]] | None = None
    tokenizer: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    records: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_json(cls, value: Any, path: Path | str = MANIFEST_FILE) -> ExportManifest:
        """The manifest of a parsed JSON value; CheckpointError naming `path` and the field."""
        problem = _manifest_problem(value)
        if problem:
            raise CheckpointError(f"{path}: {problem}; {_FIX}")
        return cls(reader=dict(value.get("reader", {})),
                   training_config=value.get("training_config", {}),
                   base_checkpoint=value.get("base_checkpoint"),
                   from_base=tuple(value.get("from_base") or ()),
                   weights=value.get("weights"), tokenizer=value.get("tokenizer", {}),
                   records={key: field for key, field in value.items()
                            if key not in _KNOWN_FIELDS})

    @classmethod
    def read(cls, folder: Path | str) -> ExportManifest:
        """The folder's manifest (an empty one if it has none), its known fields checked."""
        path = Path(folder) / MANIFEST_FILE
        if not path.is_file():
            return cls()
        return cls.from_json(read_json(path, "dil_jax manifest"), path)

    def to_json(self) -> dict[str, Any]:
        """The JSON object `from_json` reads back: free-form records first, then the known
        fields that are set, in the order an export adds them."""
        value = dict(self.records)
        if self.training_config:
            value["training_config"] = dict(self.training_config)
        if self.reader:
            value["reader"] = dict(self.reader)
        if self.base_checkpoint is not None:
            value.update(base_checkpoint=self.base_checkpoint, from_base=list(self.from_base))
        if self.weights is not None:
            value["weights"] = dict(self.weights)
        if self.tokenizer:
            value["tokenizer"] = dict(self.tokenizer)
        return value

    @property
    def reader_defaults(self) -> ReaderOverrides:
        """Reader settings (k, max_question_len, passage_position_offset) the export recorded,
        as what a load sets over the checkpoint's config unless asked otherwise.

        Exports written before the "reader" record's passage_position_offset existed held the
        offset only in their training config: it is read from there, since a delayed reader must
        read passages from the positions it was trained on. (A newer export without it in `reader`
        was exported at offset 0, and its training config names no other offset: see
        `with_reader`.)
        """
        defaults = dict(self.reader)
        trained_offset = self.training_config.get("model", {}).get("passage_position_offset")
        if ("passage_position_offset" not in defaults and _is_int(trained_offset)
                and trained_offset > 0):
            defaults["passage_position_offset"] = trained_offset
        return ReaderOverrides(**defaults)

    def with_reader(self, reader: Mapping[str, int]) -> ExportManifest:
        """This manifest with `reader` (READER_FIELDS, as an export writes them: the passage
        offset only when it is not 0) as the exported settings, each of READER_FIELDS recorded
        once: the training config's model.num_lower_layers, model.max_question_len and
        model.passage_position_offset are left out where they are the reader's (`trained_k`
        and `reader_defaults` derive k and the offset back on load; the question length is
        the reader's). One that differs (a reader exported at another k, question length or
        offset than it was trained with) is a fact of its own and stays; the
        reader's offset is then written even when it is 0, so that no load takes the training
        config's for it."""
        exported = {"passage_position_offset": 0, **reader}
        model = self.training_config.get("model", {})
        same = {key for key in READER_FIELDS if key in model and model[key] == exported.get(key)}
        training = self.training_config
        if same:
            training = {**training, "model": {key: value for key, value in model.items()
                                              if key not in same}}
        reader = dict(reader)
        if "passage_position_offset" in model and "passage_position_offset" not in same:
            reader["passage_position_offset"] = exported["passage_position_offset"]
        return dataclasses.replace(self, reader=reader, training_config=training)

    @property
    def trained_k(self) -> int | None:
        """The k the reader was trained with (None if unrecorded): the training config's
        model.num_lower_layers when recorded (how it was trained, where it differs from the
        exported split; manifests written before `with_reader` record it there always), else
        the exported split."""
        k = self.training_config.get("model", {}).get("num_lower_layers")
        return k if _is_int(k) else self.reader.get("num_lower_layers")

