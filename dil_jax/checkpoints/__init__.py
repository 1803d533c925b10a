"""Checkpoints: Hugging Face import and export, dil_jax's orbax format, QANet / BiDAF exports.

One module per job (each name below is importable from this package too):
  files        reading a Hugging Face folder's JSON and weights files (damage named)
  hf_config    Hugging Face config.json <-> EncoderConfig
  hf_tensors   Hugging Face tensor names <-> Flax param paths, shapes checked, import report
  manifest     ExportManifest: dil_jax_manifest.json, the split a reader was exported / trained
               with, its base tensors, weights digests and tokenizer record
  resolved     ResolvedCheckpoint: a checkpoint name resolved once (folder, dil_jax or Hugging
               Face format, its manifest, the k it was trained with, its recorded SQuAD v2.0
               null threshold)
  hf_import    load_hf_checkpoint: a Hugging Face folder or hub id -> (config, params, report)
  orbax_io     save_params / load_params: dil_jax's own orbax format
  export       export_hf_checkpoint: params -> a Hugging Face folder; complete_manifest: what
               a complete float32 export records (`readers.complete_export` writes one)
  char_readers QANet / BiDAF exports on disk: save_char_reader, the manifest's model kind and
               config, restoring the variables
  fingerprint  params_fingerprint: the hash caches record their weights by; file_digest
  integrity    what a manifest records of a reader's weights (sha256) and tokenizer
               (fingerprint, special tokens), the checks of both on load, and the finite scan
Where a checkpoint name points ("default", a folder, a hub id) is `dil_jax.hub`, and the error
type is `dil_jax.errors.CheckpointError`: both sit below this package, so the tokenizer loader
can use them without importing it. A loaded reader (a checkpoint read into a model, its params
and its tokenizer) is `dil_jax.readers`', the package above this one.
"""

from dil_jax.checkpoints.export import complete_manifest, export_hf_checkpoint, integrity_record
from dil_jax.checkpoints.files import (
    CONFIG_FILE,
    PARTIAL_SAFETENSORS_FILE,
    SAFETENSORS_FILE,
    SAFETENSORS_INDEX,
    TORCH_FILE,
    read_state_dict,
)
from dil_jax.checkpoints.fingerprint import file_digest, params_fingerprint
from dil_jax.checkpoints.hf_config import encoder_config_from_hf, hf_config_from_encoder_config
from dil_jax.checkpoints.hf_import import load_hf_checkpoint, load_hf_folder, with_base_tensors
from dil_jax.checkpoints.hf_tensors import (
    ImportReport,
    convert_state_dict,
    export_state_dict,
    name_map,
)
from dil_jax.checkpoints.integrity import (
    check_tokenizer_record,
    check_weights,
    tokenizer_record,
    weights_record,
)
from dil_jax.checkpoints.manifest import MANIFEST_FILE, ExportManifest
from dil_jax.checkpoints.orbax_io import (
    ENCODER_CONFIG_FILE,
    PARAMS_DIR,
    TRAINED_FROM_FILE,
    load_params,
    save_params,
)
from dil_jax.checkpoints.resolved import ResolvedCheckpoint, resolve_reader_checkpoint
from dil_jax.errors import CheckpointError
from dil_jax.hub import resolve_checkpoint

__all__ = [
    "CONFIG_FILE", "ENCODER_CONFIG_FILE", "MANIFEST_FILE", "PARAMS_DIR",
    "PARTIAL_SAFETENSORS_FILE", "SAFETENSORS_FILE", "SAFETENSORS_INDEX", "TORCH_FILE",
    "TRAINED_FROM_FILE", "CheckpointError", "ExportManifest", "ImportReport",
    "ResolvedCheckpoint", "check_tokenizer_record", "check_weights", "complete_manifest",
    "convert_state_dict", "encoder_config_from_hf", "export_hf_checkpoint", "export_state_dict",
    "file_digest", "hf_config_from_encoder_config", "integrity_record", "load_hf_checkpoint",
    "load_hf_folder", "load_params", "name_map", "params_fingerprint", "read_state_dict",
    "resolve_checkpoint", "resolve_reader_checkpoint", "save_params", "tokenizer_record",
    "weights_record", "with_base_tensors",
]
