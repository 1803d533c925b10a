"""QANet / BiDAF readers on disk: orbax variables beside a manifest that names the model kind.

    save_char_reader(folder, variables, config)     # what `dil-jax train` exports
    reader = load_reader(folder)                     # dil_jax.readers: a CharReader

A folder holds `params/` (orbax: the whole `{"params", "frozen"}` variables, the frozen word
table included, so a folder reads back alone) and `dil_jax_manifest.json` with
`{"model_kind": "qanet" | "bidaf", "reader_config": {QANetConfig / BiDAFConfig fields}}`, the
manifest file name every exported reader uses (`ExportManifest` keeps fields it does not know,
so these do not disturb it). The kind is read before anything else: a folder of another kind is
refused by name, never restored into the wrong tree (`read_reader_fields` and
`restore_char_variables`: what `readers.char.CharReader.load` reads; `CharReader.save` writes
with `save_char_reader`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dil_jax.checkpoints.files import read_json
from dil_jax.checkpoints.manifest import MANIFEST_FILE
from dil_jax.checkpoints.orbax_io import PARAMS_DIR
from dil_jax.errors import CheckpointError

KIND_FIELD = "model_kind"
CONFIG_FIELD = "reader_config"


def char_reader_kind(folder: str | os.PathLike) -> str | None:
    """The model kind a folder's manifest names ("qanet", "bidaf"), or None (no manifest, or
    one without a kind: a BERT-family reader)."""
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        return None
    manifest = read_json(path, "dil_jax manifest")
    kind = manifest.get(KIND_FIELD) if isinstance(manifest, dict) else None
    return None if kind in (None, "encoder") else str(kind)


def read_reader_fields(directory: Path) -> dict[str, Any]:
    """The config fields the manifest of the QANet / BiDAF folder `directory` records."""
    manifest = read_json(directory / MANIFEST_FILE, "dil_jax manifest")
    return dict(manifest.get(CONFIG_FIELD) or {})


def restore_char_variables(directory: Path, abstract: Any, kind: str) -> Any:
    """The variables of the `kind` reader folder `directory`, restored into the tree of
    `abstract` (`jax.eval_shape` of its model's init). CheckpointError naming the folder when
    params/ is missing or does not restore (truncated files, another shape)."""
    import orbax.checkpoint as ocp

    from dil_jax.checkpoints.files import DAMAGED_FIX

    if not (directory / PARAMS_DIR).is_dir():
        raise CheckpointError(f"{directory / PARAMS_DIR}: missing; {DAMAGED_FIX}")
    try:
        return ocp.StandardCheckpointer().restore(directory / PARAMS_DIR, abstract)
    except Exception as error:  # orbax/tensorstore: truncated files, another shape...
        raise CheckpointError(f"{directory / PARAMS_DIR}: cannot restore the {kind} variables "
                              f"({type(error).__name__}: {str(error)[:300]}); {DAMAGED_FIX}"
                              ) from error


def save_char_reader(directory: str | os.PathLike, variables: Any, config: Any) -> Path:
    """Writes `variables` ({"params", "frozen"}) of the QANet / BiDAF `config` to `directory`
    (which must not exist), atomically: a reader never sees half a folder."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    from dil_jax.atomic import staged_directory
    from dil_jax.model.char_reader import config_fields, kind_of

    directory = Path(directory).absolute()
    if directory.exists():
        raise CheckpointError(f"{directory} already exists; refusing to overwrite it")
    manifest = {KIND_FIELD: kind_of(config), CONFIG_FIELD: config_fields(config),
                "note": "a QANet / BiDAF reader: params/ holds its whole variables, the frozen "
                        "word table included (dil_jax.checkpoints.char_readers)"}
    with staged_directory(directory, overwrite=False) as staging:
        checkpointer = ocp.StandardCheckpointer()
        checkpointer.save(staging / PARAMS_DIR, jax.tree.map(np.asarray, variables))
        checkpointer.wait_until_finished()
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
    return directory

