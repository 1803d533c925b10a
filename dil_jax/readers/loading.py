"""Loading any reader: the family registry keyed by the manifest's model kind, and `load_reader`.

    reader = load_reader("dil_jax/assets/minilm-squad-k2")        # an EncoderReader, k = 2
    reader = load_reader("runs/qanet/params")                     # a CharReader (QANet)

A checkpoint is resolved once (`checkpoints.resolved.resolve_reader_checkpoint`: a dil_jax
folder, a Hugging Face one, "default", a hub id, or a QANet / BiDAF export), its model kind picks
the family (`READER_FAMILIES`, as big_vision picks a model module by name), and the family loads
it (`Reader.load`). Nothing after this asks which family a reader is. `complete_export` writes a
loaded reader back as a complete Hugging Face folder.
"""

from __future__ import annotations

import os

import jax

from dil_jax.checkpoints.export import complete_manifest, export_hf_checkpoint
from dil_jax.checkpoints.resolved import ResolvedCheckpoint, resolve_reader_checkpoint
from dil_jax.errors import CheckpointError
from dil_jax.model.char_reader import CHAR_READER_KINDS, ENCODER_KIND
from dil_jax.model.encoder_config import NO_OVERRIDES, ReaderOverrides
from dil_jax.readers.char import CharReader
from dil_jax.readers.encoder import EncoderReader
from dil_jax.readers.protocol import LoadOptions, Reader

# The manifest's model kind -> the family that reads it.
READER_FAMILIES: dict[str, type[Reader]] = {
    ENCODER_KIND: EncoderReader, **dict.fromkeys(CHAR_READER_KINDS, CharReader)}
# How a kind is named where a checkpoint of another was asked for.
_KIND_NAMES = {ENCODER_KIND: "BERT-family"}


def reader_family(kind: str) -> type[Reader]:
    """The Reader class of a model kind; CheckpointError for a kind no family reads."""
    family = READER_FAMILIES.get(kind)
    if family is None:
        raise CheckpointError(f"model kind {kind!r}: no reader reads it; kinds: "
                              f"{sorted(READER_FAMILIES)}")
    return family


def load_reader(checkpoint: str | os.PathLike | ResolvedCheckpoint, k: int | None = None,
                max_question_len: int | None = None, tokenizer: str | None = None, *,
                kind: str | None = None, require_qa_head: bool = False,
                overrides: ReaderOverrides = NO_OVERRIDES,
                rng: jax.Array | None = None, with_tokenizer: bool = True) -> Reader:
    """The Reader of any checkpoint, of the family its model kind names.

    k: the split to read with (None: the checkpoint's own, else 0 for a Hugging Face one); a
    BERT-family reader reads any k (one other than it was trained with is logged), a QANet /
    BiDAF only its fixed split (`FixedSplitError`). max_question_len: tokens of
    `[CLS] question [SEP]` (None: the checkpoint's own). tokenizer: a tokenizer folder or name
    instead of the checkpoint's own files. kind: refuse a checkpoint of another model kind
    (CheckpointError). require_qa_head: refuse (UntrainedHeadError) a checkpoint without a QA
    head, whose head would be initialised at random. overrides: config fields set as given,
    unwarned (training's split, dropout, compute dtype); rng: initialises a QA head the
    checkpoint lacks (None: a fixed key). with_tokenizer: False loads no tokenizer (training:
    its featurizer has its own). Checked: the weights (their recorded digests, finite values)
    and the tokenizer against the model's vocabulary and the one the manifest records.
    """
    resolved = resolve_reader_checkpoint(checkpoint)
    found = resolved.model_kind
    if kind is not None and found != kind:
        raise CheckpointError(f"{resolved.folder.absolute()}: a {_KIND_NAMES.get(found, found)} "
                              f"reader, not a {_KIND_NAMES.get(kind, kind)} one")
    options = LoadOptions(k=k, max_question_len=max_question_len, tokenizer=tokenizer,
                          with_tokenizer=with_tokenizer, require_qa_head=require_qa_head,
                          overrides=overrides, rng=rng)
    return reader_family(found).load(resolved, options)


def complete_export(checkpoint: str | os.PathLike | ResolvedCheckpoint,
                    directory: str | os.PathLike, *, tokenizer: str | None = None,
                    allow_untrained_head: bool = False) -> Reader:
    """Writes the reader `checkpoint` (a bundled reader, a Hugging Face folder, a `dil-jax
    train` export of the BERT family) as a complete Hugging Face folder: every tensor, those a
    partial export leaves to its base included, in float32 (a bfloat16 file is upcast exactly,
    as every load does), config.json, the tokenizer files and a manifest recording the
    reader's k. `transformers.AutoModelForQuestionAnswering.from_pretrained` reads it with no
    missing tensor; dil_jax reads it as the same reader. Returns the reader exported.

    tokenizer: a tokenizer folder or name to write beside the weights instead of the
    checkpoint's own files (a `dil-jax train` export holds none), checked as every load checks
    it; allow_untrained_head: export a checkpoint without a QA head (its head initialised at
    random) instead of refusing it (UntrainedHeadError). A reader transformers has no model
    for (QANet, BiDAF) is a CheckpointError.
    """
    resolved = resolve_reader_checkpoint(checkpoint)
    if not reader_family(resolved.model_kind).capabilities.hugging_face_export:
        raise CheckpointError(f"{resolved.name}: a {resolved.model_kind} reader; transformers "
                              "has no such model, so only BERT-family readers export to a "
                              "Hugging Face folder")
    reader = load_reader(resolved, tokenizer=tokenizer, require_qa_head=not allow_untrained_head)
    export_hf_checkpoint(directory, reader.params, reader.config, tokenizer=reader.tokenizer,
                         dtype="float32", manifest=complete_manifest(reader.checkpoint))
    return reader
