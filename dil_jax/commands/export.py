"""`dil-jax export --format hf`: a reader as a complete Hugging Face folder that transformers reads.

    dil-jax export --format hf --checkpoint dil_jax/assets/minilm-squad-full --out runs/full-hf

The bundled readers (dil_jax/assets/) are not Hugging Face folders transformers can load: they
leave their word embeddings to the embedded MiniLM (their manifest's `from_base`) and keep their
bfloat16 weights in `dil_jax_partial.safetensors`, a name transformers does not look for, so it
refuses them rather than loading random word embeddings. This writes the folder it loads: every
tensor, those left to the base included, in float32 (bfloat16 upcast exactly, as every dil_jax
load does), config.json, the tokenizer files, and the reader's manifest (its k, thresholds and
training record, so dil_jax reads the export as the same reader). Then
`transformers.AutoModelForQuestionAnswering.from_pretrained(OUT)` loads it with no missing
tensor and gives dil_jax's start/end logits, up to float32 rounding.

A delayed reader (k > 0) is exported too, with a warning: transformers runs every block on the
joined question and passage, as dil_jax does at k = 0, a model it was not trained as.
The folder is written beside --out and renamed into place; --out must be new or empty and not
inside the reader's folder.
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

FORMATS = ("hf",)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export", help="write a reader as a complete Hugging Face folder (transformers reads it)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--format", required=True, choices=FORMATS,
                        help="hf: a Hugging Face folder (config.json, model.safetensors in "
                             "float32, tokenizer files, dil_jax_manifest.json)")
    parser.add_argument("--checkpoint", required=True,
                        help="the reader: a bundled one (e.g. dil_jax/assets/minilm-squad-full),"
                             " a Hugging Face folder or hub id, or a dil_jax (orbax) export of "
                             "`dil-jax train` (its params/)")
    parser.add_argument("--out", required=True,
                        help="the folder to write: new or empty, not inside the reader's")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer folder or name to write beside the weights (default: "
                             "the checkpoint's own files; a `dil-jax train` export holds none: "
                             "give the one it was trained with, e.g. 'default')")
    parser.add_argument("--allow-untrained-head", action="store_true",
                        help="export a checkpoint that has no QA head (e.g. 'default'), its "
                             "head initialised at random; without it such a checkpoint is "
                             "refused")
    parser.set_defaults(func=run)


def export_folder_problem(out: Path, source: Path) -> str | None:
    """Why --out must not be written for the reader in `source`, beyond what
    `check_output_folder` refuses: a folder inside the reader's (it would change the reader
    folder), or one that is not empty (the export replaces the folder as a whole)."""
    if out.resolve() != source.resolve() and source.resolve() in out.resolve().parents:
        return (f"--out {out} lies inside the --checkpoint folder {source}: the export would "
                "add a folder to the reader; choose a folder outside it")
    if out.is_dir() and any(out.iterdir()):
        return (f"--out {out} is a folder that is not empty: the export replaces it as a whole, "
                "which would delete what is in it; choose a new or empty folder")
    return None


def run(args: argparse.Namespace) -> int:
    from dil_jax.atomic import check_output_folder
    from dil_jax.checkpoints import (
        CONFIG_FILE,
        MANIFEST_FILE,
        SAFETENSORS_FILE,
        resolve_reader_checkpoint,
    )
    from dil_jax.errors import CheckpointError, OutputPathError
    from dil_jax.readers import complete_export, reader_family

    checkpoint = resolve_reader_checkpoint(args.checkpoint)
    if not reader_family(checkpoint.model_kind).capabilities.hugging_face_export:
        raise CheckpointError(f"--checkpoint {args.checkpoint}: a {checkpoint.model_kind} "
                              "reader; transformers has no QANet / BiDAF model, so only BERT-"
                              "family readers export to a Hugging Face folder")
    out = Path(args.out)
    # Before the reader loads: a bad --out costs a second, and never touches the input.
    check_output_folder(out, "--out", inputs={"--checkpoint": checkpoint.folder})
    problem = export_folder_problem(out, checkpoint.folder)
    if problem:
        raise OutputPathError(problem)
    reader = complete_export(checkpoint, out, tokenizer=args.tokenizer,
                             allow_untrained_head=args.allow_untrained_head)
    config = reader.config
    if config.num_lower_layers:
        log.warning("%s is a delayed reader (k = %d of %d): transformers runs every block on the "
                    "joined question and passage, as dil_jax does at k = 0, so there it answers "
                    "as a full reader it was not trained as (expect worse answers); dil_jax "
                    "reads the export at k = %d (its %s records it)", args.checkpoint,
                    config.num_lower_layers, config.num_layers, config.num_lower_layers,
                    MANIFEST_FILE)
    size = os.path.getsize(out / SAFETENSORS_FILE) / 1e6
    print(f"{out}: a complete Hugging Face folder of {args.checkpoint} ({CONFIG_FILE}, "
          f"{SAFETENSORS_FILE} in float32, {size:.1f} MB, tokenizer files, {MANIFEST_FILE}); "
          f"transformers reads it with AutoModelForQuestionAnswering.from_pretrained({str(out)!r})")
    return 0
