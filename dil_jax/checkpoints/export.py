"""Writing a reader as a Hugging Face folder that `load_hf_checkpoint` and `transformers` read."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from dil_jax.atomic import staged_directory
from dil_jax.checkpoints.files import CONFIG_FILE, PARTIAL_SAFETENSORS_FILE, SAFETENSORS_FILE
from dil_jax.checkpoints.hf_config import hf_config_from_encoder_config
from dil_jax.checkpoints.hf_tensors import add_backbone_prefix, export_state_dict
from dil_jax.checkpoints.integrity import (
    TOKENIZER_FIELD,
    WEIGHTS_FIELD,
    tokenizer_record,
    weights_record,
)
from dil_jax.checkpoints.manifest import MANIFEST_FILE, ExportManifest
from dil_jax.checkpoints.resolved import ResolvedCheckpoint
from dil_jax.errors import CheckpointError
from dil_jax.model.delayed import Params
from dil_jax.model.encoder_config import EncoderConfig


def export_hf_checkpoint(directory: str | os.PathLike, params: Params, config: EncoderConfig,
                         tokenizer=None, dtype: str = "float32",
                         manifest: dict[str, Any] | None = None,
                         from_base: tuple[str, str] | None = None) -> Path:
    """Writes a Hugging Face folder (config.json, model.safetensors, tokenizer files and an
    optional dil_jax_manifest.json) that `load_hf_checkpoint` and `transformers` read.

    dtype "bfloat16" halves the size (params are cast back to float32 on load).
    from_base: (base checkpoint, name prefix): tensors under that prefix (e.g.
    "embeddings.word_embeddings") are left out and recorded in the manifest as coming from the
    base; the caller asserts they equal the base's (e.g. they were frozen in training). The
    weights then go to `PARTIAL_SAFETENSORS_FILE`, not model.safetensors: transformers would
    load the folder with those tensors at random; it refuses it instead, and
    `dil-jax export --format hf` (`complete_export`) writes the folder it reads.
    The manifest records the digests of the weights written and the tokenizer's fingerprint
    (`integrity_record`), which every load checks. Written to a staging folder and renamed into
    place.
    """
    import ml_dtypes
    from safetensors.numpy import save_file

    if dtype not in ("float32", "bfloat16"):
        raise CheckpointError(f"export dtype must be float32 or bfloat16, got {dtype!r}")
    directory = Path(directory).absolute()
    tensors = {}
    left_to_base = []
    for name, value in export_state_dict(params, config).items():
        full_name = add_backbone_prefix(name, config.architecture)
        if from_base is not None and name.startswith(from_base[1]):
            left_to_base.append(full_name)
            continue
        tensors[full_name] = value.astype(ml_dtypes.bfloat16) if dtype == "bfloat16" else value
    reader = {"num_lower_layers": config.num_lower_layers,
              "max_question_len": config.max_question_len}
    if config.passage_position_offset:
        # A delayed reader trained with passages from position N reads them from N; loaded from 0 it
        # would run on positions it never saw (docs/results/training_log.md, "Where a delayed
        # passage's positions start").
        reader["passage_position_offset"] = config.passage_position_offset
    record = ExportManifest.from_json(dict(manifest or {})).with_reader(reader)
    if from_base is not None:
        record = dataclasses.replace(record, base_checkpoint=from_base[0],
                                     from_base=tuple(left_to_base))
    weights_file = PARTIAL_SAFETENSORS_FILE if left_to_base else SAFETENSORS_FILE
    with staged_directory(directory) as staging:
        save_file(tensors, str(staging / weights_file), metadata={"format": "pt"})
        (staging / CONFIG_FILE).write_text(json.dumps(hf_config_from_encoder_config(config),
                                                      indent=2))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(staging))
        record = dataclasses.replace(record, **integrity_record(staging, tokenizer))
        (staging / MANIFEST_FILE).write_text(json.dumps(record.to_json(), indent=2))
    return directory


def integrity_record(folder: Path, tokenizer=None) -> dict[str, Any]:
    """The manifest fields that let a load check the folder: the digests of its weights files
    as written, and (with a tokenizer) the tokenizer's fingerprint and special tokens.

    Also what `tools/bundle_readers.py --record-integrity` adds to readers exported before these
    fields existed, so a record written later is the one an export writes.
    """
    record: dict[str, Any] = {WEIGHTS_FIELD: weights_record(folder)}
    if tokenizer is not None:
        record[TOKENIZER_FIELD] = tokenizer_record(tokenizer, folder)
    return record


# Manifest fields a complete export writes anew: it holds every tensor (no base) and records the
# digests of its own weights and tokenizer files.
_REWRITTEN_FIELDS = ("base_checkpoint", "from_base", WEIGHTS_FIELD, TOKENIZER_FIELD)


def complete_manifest(checkpoint: ResolvedCheckpoint) -> dict[str, Any]:
    """The manifest of `checkpoint` as a complete float32 export records it: every record of
    the source's (training config, scores, abstention thresholds, notes) but its base, weights
    and tokenizer fields, plus where it was exported from (the source's weights digests too,
    so the export names the exact bytes it came from)."""
    source = {} if checkpoint.is_orbax else checkpoint.manifest.to_json()
    record = {key: value for key, value in source.items() if key not in _REWRITTEN_FIELDS}
    record["stored_dtype"] = "float32"
    exported_from: dict[str, Any] = {"checkpoint": checkpoint.name}
    if not checkpoint.is_orbax and checkpoint.manifest.weights:
        exported_from[WEIGHTS_FIELD] = dict(checkpoint.manifest.weights)
    record["exported_from"] = exported_from
    return record

