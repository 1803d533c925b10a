"""`dil_jax_manifest.json`: what an exported reader records beside its Hugging Face files.

Written by `export_hf_checkpoint`; read back for the split a reader was exported / trained with
(`reader_defaults`, `trained_k`), for tensors it left to a base checkpoint (`from_base`), and for
what its weights and tokenizer must be (`weights`, `tokenizer`: `dil_jax.checkpoints.integrity`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dil_jax.checkpoints.files import read_json
from dil_jax.errors import CheckpointError

MANIFEST_FILE = "dil_jax_manifest.json"
READER_FIELDS = ("num_lower_layers", "max_question_len", "passage_position_offset")
_SHA256 = re.compile(r"[0-9a-f]{64}")


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


def read_manifest(folder: Path) -> dict[str, Any]:
    """The folder's `dil_jax_manifest.json` ({} if it has none), its known fields checked.

    Known fields: "reader" {num_lower_layers, max_question_len, passage_position_offset: int},
    "training_config" (an object; its "model" may record num_lower_layers and
    passage_position_offset), "base_checkpoint" (str),
    "from_base" (list of tensor names), "weights" ({file: {"bytes", "sha256"}}) and
    "tokenizer" (an object). Others are kept as they are (free-form records).
    Raises CheckpointError naming the file and the field.
    """
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        return {}
    manifest = read_json(path, "dil_jax manifest")
    fix = "re-export the reader, or delete the file to load the weights without it"

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{path}: {what}; {fix}")

    if not isinstance(manifest, dict):
        raise bad(f"expected a JSON object, got {type(manifest).__name__}")
    reader = manifest.get("reader", {})
    if not isinstance(reader, dict):
        raise bad(f"'reader' must be an object, got {reader!r}")
    for key, value in reader.items():
        if key not in READER_FIELDS:
            raise bad(f"unknown field 'reader.{key}' (known: {', '.join(READER_FIELDS)})")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise bad(f"'reader.{key}' must be a non-negative integer, got {value!r}")
    training = manifest.get("training_config", {})
    if not isinstance(training, dict) or not isinstance(training.get("model", {}), dict):
        raise bad("'training_config' (and its 'model') must be objects")
    from_base = manifest.get("from_base") or []
    if not isinstance(from_base, list) or not all(isinstance(n, str) for n in from_base):
        raise bad(f"'from_base' must be a list of tensor names, got {from_base!r}")
    if "weights" in manifest and (problem := _weights_problem(manifest["weights"])):
        raise bad(problem)
    tokenizer = manifest.get("tokenizer", {})
    if not isinstance(tokenizer, dict) or not all(
            isinstance(tokenizer.get(field, {}), dict) for field in ("special_tokens", "files")):
        raise bad("'tokenizer' (and its 'special_tokens' and 'files') must be objects, got "
                  f"{tokenizer!r:.80}")
    if from_base and not isinstance(manifest.get("base_checkpoint"), str):
        raise bad("'from_base' names tensors but 'base_checkpoint' (the checkpoint they come "
                  f"from) is {manifest.get('base_checkpoint')!r}")
    return manifest


def reader_defaults(folder: Path) -> dict[str, Any]:
    """Reader settings (k, max_question_len, passage_position_offset) recorded by
    `export_hf_checkpoint`, if any.

    Exports written before `reader.passage_position_offset` existed recorded the offset only in
    their training config: it is read from there, since a delayed reader must read passages
    from the positions it was trained on.
    """
    manifest = read_manifest(folder)
    defaults = dict(manifest.get("reader", {}))
    trained_offset = manifest.get("training_config", {}).get("model", {}).get(
        "passage_position_offset")
    if ("passage_position_offset" not in defaults and isinstance(trained_offset, int)
            and not isinstance(trained_offset, bool) and trained_offset > 0):
        defaults["passage_position_offset"] = trained_offset
    return defaults


def trained_k(folder: Path) -> int | None:
    """The k a reader was trained with, as its manifest records it (None if it does not).

    The training config's model.num_lower_layers when recorded (how it was trained), else the
    split the export recorded.
    """
    manifest = read_manifest(folder)
    k = manifest.get("training_config", {}).get("model", {}).get("num_lower_layers")
    if isinstance(k, int) and not isinstance(k, bool):
        return k
    return manifest.get("reader", {}).get("num_lower_layers")
