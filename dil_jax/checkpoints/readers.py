"""The `Reader` value and its makers: `load_reader` (the BERT family: any dil_jax or Hugging Face
checkpoint), `load_char_reader` (a QANet / BiDAF export) and `init_reader`.

A Reader is what every command reads with and what training starts from: the model (its
config), its params, its tokenizer and the checkpoint it came from, in one frozen value, passed
whole (never as a tuple of parts). `load_reader` is the one loader of a checkpoint: a dil_jax
folder (orbax params beside `encoder_config.json`, as training saves them) or a Hugging Face
one (local, "default" or a hub id), told apart once (`resolve_reader_checkpoint`).

Checks sit here because only here are the model, its manifest and its tokenizer all known: the
weights (their recorded digests, finite values: `integrity`), the tokenizer against the model's
vocabulary and against the one the manifest records, a k other than the one the reader was
trained with (logged), and a QA head when a command needs a trained one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np

from dil_jax.checkpoints.hf_import import load_hf_folder
from dil_jax.checkpoints.integrity import (
    check_finite_params,
    check_tokenizer_record,
    tokenizer_record,
)
from dil_jax.checkpoints.manifest import MANIFEST_FILE
from dil_jax.checkpoints.orbax_io import load_params
from dil_jax.checkpoints.resolved import ResolvedCheckpoint, resolve_reader_checkpoint
from dil_jax.config import EncoderConfig
from dil_jax.errors import CheckpointError
from dil_jax.hub import resolve_checkpoint
from dil_jax.model.char_reader import CharReaderConfig, CharReaderModel, switched_config
from dil_jax.model.delayed import DelayedInteractionModel, Params
from dil_jax.tokenization import TOKENIZER_FILES, TokenizationError, load_tokenizer

# One logger for the whole package: its warnings are silenced by that name
# (prescreening.prescreener).
log = logging.getLogger(__package__)


@dataclasses.dataclass(frozen=True, eq=False)
class Reader:
    """A reader ready to run.

    model: the DelayedInteractionModel (`config` is its EncoderConfig), or a QANet / BiDAF
    `CharReaderModel` (`config`: its QANetConfig / BiDAFConfig; `is_char_reader`); params: its
    weights (a nested dict of float32 arrays; a QANet / BiDAF's whole variables, `{"params",
    "frozen"}`); tokenizer: the fast tokenizer of its ids (None: made
    without one, e.g. for training, whose featurizer tokenizes); checkpoint: where it was
    loaded from (None: initialised at random, `init_reader`). Frozen: another setting is
    another Reader (`with_config`, `with_params`); the model object is kept where the config
    is, so compiled programs keyed by it are reused.
    """

    model: DelayedInteractionModel | CharReaderModel
    params: Params
    tokenizer: Any = None
    checkpoint: ResolvedCheckpoint | None = None

    @property
    def config(self) -> EncoderConfig | CharReaderConfig:
        return self.model.config

    @property
    def is_char_reader(self) -> bool:
        """A QANet / BiDAF (read by `reading.char_grid`), not the BERT family."""
        return isinstance(self.model, CharReaderModel)

    def with_config(self, **changes: Any) -> Reader:
        """The same params and tokenizer read with other config fields: EncoderConfig's (another
        k, LSH attention), or a QANet / BiDAF's run settings (`char_reader.switched_config`,
        ConfigError for a field its params depend on)."""
        if self.is_char_reader:
            model = CharReaderModel(switched_config(self.config, changes))
        else:
            model = DelayedInteractionModel(self.config.replace(**changes))
        return dataclasses.replace(self, model=model)

    def with_params(self, params: Params) -> Reader:
        """The same model and tokenizer with other weights (a training step's)."""
        return dataclasses.replace(self, params=params)


def load_reader(checkpoint: str | os.PathLike | ResolvedCheckpoint, k: int | None = None,
                max_question_len: int | None = None, tokenizer: str | None = None, *,
                require_qa_head: bool = False,
                config_overrides: Mapping[str, Any] | None = None, rng: jax.Array | None = None,
                with_tokenizer: bool = True) -> Reader:
    """The Reader of a dil_jax (orbax) folder or a Hugging Face checkpoint.

    k: the split point to read with (None: the one a dil_jax checkpoint or export records,
    else 0). A k other than the one the reader was trained with is allowed (the same params
    serve every k) but logged as a WARNING: its answers are those of a model it was not trained
    as. max_question_len: tokens of `[CLS] question [SEP]` (None: the checkpoint's own).
    tokenizer: a tokenizer folder or name instead of the checkpoint's own files.
    require_qa_head: refuse (UntrainedHeadError) a checkpoint without a QA head, whose head
    would be initialised at random: `predict` asks for it; the demo, which says loudly that it
    falls back to the untrained embedded MiniLM, does not.
    config_overrides: EncoderConfig fields set as given, unwarned (training's split, dropout,
    compute dtype); rng: initialises a QA head the checkpoint lacks (None: a fixed key).
    with_tokenizer: False loads no tokenizer (training: its featurizer has its own).
    Checked: the weights (their recorded digests, finite values: `integrity`), and the
    tokenizer against the model's vocabulary (`check_tokenizer`) and against the one the
    reader's manifest records (`check_tokenizer_record`).
    """
    checkpoint = resolve_reader_checkpoint(checkpoint)
    if checkpoint.is_char_reader:
        # predict, index, ask, odqa-eval, bench and serve load it with `load_char_reader`
        # (docs/qanet.md); what calls this loader reads the BERT family only (demo, prescreen,
        # a training teacher).
        raise CheckpointError(f"{checkpoint.name}: a {checkpoint.char_reader_kind} reader (its "
                              "manifest's model_kind); predict, index, ask, odqa-eval, bench "
                              "and serve read it, this reads the BERT family only")
    overrides = dict(config_overrides or {})
    if max_question_len is not None:
        overrides["max_question_len"] = max_question_len
    if k is not None:
        overrides["num_lower_layers"] = k
    if checkpoint.is_orbax:
        config, params = load_params(checkpoint.folder, **overrides)
        check_finite_params(params, str(checkpoint.folder))  # orbax params carry no digest
    else:
        config, params, report = load_hf_folder(checkpoint, rng=rng, **overrides)
        if require_qa_head:
            _require_qa_head(checkpoint.name, report.initialized)
    _warn_other_k(checkpoint, k)
    model = DelayedInteractionModel(config)
    if not with_tokenizer:
        return Reader(model, params, None, checkpoint)
    return Reader(model, params, _reader_tokenizer(checkpoint, config, tokenizer), checkpoint)


def load_char_reader(checkpoint: str | os.PathLike | ResolvedCheckpoint, kind: str | None = None,
                     max_question_len: int | None = None, tokenizer: str | None = None, *,
                     with_tokenizer: bool = True) -> Reader:
    """The Reader of a QANet / BiDAF folder `save_char_reader` wrote (`dil-jax train` exports
    of config.model.kind "qanet" / "bidaf"): model a CharReaderModel, params its whole
    variables (the frozen word table included).

    kind: refuse a folder of another kind. max_question_len: the question length to read with
    (None: the one its config records). tokenizer: a tokenizer folder or name (None: the
    embedded MiniLM's, whose vocabulary the word table rows follow), checked against the
    reader's vocabulary. CheckpointError naming the folder and what is wrong (another kind, a
    bad manifest, missing or damaged params, non-finite weights).
    """
    import orbax.checkpoint as ocp

    from dil_jax.checkpoints.char_readers import CONFIG_FIELD, KIND_FIELD
    from dil_jax.checkpoints.files import DAMAGED_FIX, read_json
    from dil_jax.checkpoints.orbax_io import PARAMS_DIR
    from dil_jax.config import ConfigError
    from dil_jax.model.char_reader import QUESTION_LEN_FIELD, reader_config

    checkpoint = resolve_reader_checkpoint(checkpoint)
    directory = checkpoint.folder.absolute()
    found = checkpoint.char_reader_kind
    if found is None:
        raise CheckpointError(f"{directory}: not a QANet / BiDAF reader (no {MANIFEST_FILE} "
                              f"naming its {KIND_FIELD})")
    if kind is not None and found != kind:
        raise CheckpointError(f"{directory}: a {found} reader, not a {kind} one")
    manifest = read_json(directory / MANIFEST_FILE, "dil_jax manifest")
    fields = dict(manifest.get(CONFIG_FIELD) or {})
    if max_question_len is not None:
        fields[QUESTION_LEN_FIELD] = max_question_len
    try:
        config = reader_config(found, fields)
    except (ConfigError, TypeError) as error:
        raise CheckpointError(f"{directory / MANIFEST_FILE}: {error}") from error
    model = CharReaderModel(config)
    if not (directory / PARAMS_DIR).is_dir():
        raise CheckpointError(f"{directory / PARAMS_DIR}: missing; {DAMAGED_FIX}")
    abstract = jax.eval_shape(model.init, jax.random.key(0))
    try:
        variables = ocp.StandardCheckpointer().restore(directory / PARAMS_DIR, abstract)
    except Exception as error:  # orbax/tensorstore: truncated files, another shape...
        raise CheckpointError(f"{directory / PARAMS_DIR}: cannot restore the {found} variables "
                              f"({type(error).__name__}: {str(error)[:300]}); {DAMAGED_FIX}"
                              ) from error
    check_finite_params(variables, str(directory))
    if not with_tokenizer:
        return Reader(model, variables, None, checkpoint)
    folder = resolve_checkpoint(tokenizer or "default")
    return Reader(model, variables, load_tokenizer(folder, vocab_size=config.vocab_size),
                  checkpoint)


def init_reader(config: EncoderConfig, rng: jax.Array, tokenizer: Any = None) -> Reader:
    """A Reader of `config` with fresh params (`DelayedInteractionModel.init`), as host
    (numpy) arrays; no checkpoint."""
    model = DelayedInteractionModel(config)
    return Reader(model, jax.tree.map(np.asarray, model.init(rng)), tokenizer)


def _warn_other_k(checkpoint: ResolvedCheckpoint, k: int | None) -> None:
    """Logs a WARNING when --k differs from the k the reader was trained with."""
    if k is None:
        return
    trained = checkpoint.trained_k
    if trained is not None and k != trained:
        log.warning("--k %d differs from k=%d that the reader %s was trained with: the same "
                    "weights, but read with a split they were not trained for; expect worse "
                    "answers (pass --k %d, or leave --k out to use it)", k, trained,
                    checkpoint.name, trained)


def _reader_tokenizer(checkpoint: ResolvedCheckpoint, config: EncoderConfig,
                      tokenizer: str | None) -> Any:
    """The tokenizer of `tokenizer` (a folder or name) or else of the checkpoint's own files,
    checked against the model's vocabulary and against the one the manifest records."""
    if tokenizer is None and checkpoint.is_orbax:
        _check_own_tokenizer_files(checkpoint.folder)
    folder = checkpoint.folder if tokenizer is None else resolve_checkpoint(tokenizer)
    loaded = load_tokenizer(folder, vocab_size=config.vocab_size,
                            architecture=config.architecture)
    recorded, record_path = checkpoint.manifest.tokenizer, checkpoint.folder / MANIFEST_FILE
    if not recorded and tokenizer is not None:
        recorded, record_path = _own_tokenizer_record(checkpoint, config)
    if recorded:
        check_tokenizer_record(loaded, recorded, record_path,
                               str(tokenizer or checkpoint.folder), given=tokenizer is not None,
                               folder=folder)
    return loaded


def _own_tokenizer_record(checkpoint: ResolvedCheckpoint, config: EncoderConfig
                          ) -> tuple[dict[str, Any], Path | None]:
    """(record, path) of the tokenizer files a reader folder holds, for a manifest without a
    tokenizer record (older exports, Hugging Face folders): a tokenizer given in their place
    must be the same (a permuted vocabulary read a reader at EM 7 with no word of warning).
    ({}, None) when the folder holds no tokenizer files: nothing to compare with."""
    own = next((checkpoint.folder / name for name in TOKENIZER_FILES
                if (checkpoint.folder / name).is_file()), None)
    if own is None:
        log.warning("%s records no tokenizer and holds none: the tokenizer given cannot be "
                    "checked against the one it was trained with", checkpoint.folder)
        return {}, None
    own_tokenizer = load_tokenizer(checkpoint.folder, vocab_size=config.vocab_size,
                                   architecture=config.architecture)
    return tokenizer_record(own_tokenizer, checkpoint.folder), own


class UntrainedHeadError(CheckpointError):
    """A checkpoint without a QA head was given where answers must mean something."""


def _require_qa_head(checkpoint: str, initialized: list[str]) -> None:
    """Raises UntrainedHeadError when the QA head was initialised, not loaded (a plain
    `BertModel`-style checkpoint, e.g. the embedded "default" MiniLM)."""
    head = [name for name in initialized if name.startswith("qa_outputs.")]
    if head:
        raise UntrainedHeadError(
            f"checkpoint {checkpoint!r} has no QA head ({', '.join(head)} absent): it would be "
            "initialised at random and every answer would be an arbitrary span. It must be "
            "fine-tuned for question answering first (dil-jax train; docs/training.md), or give "
            "a fine-tuned reader (e.g. --checkpoint dil_jax/assets/minilm-squad-full); "
            "--allow-untrained-head reads with the random head anyway (timing and plumbing only)")


def _check_own_tokenizer_files(folder: Path) -> None:
    """Refuses (TokenizationError: pass --tokenizer) a dil_jax folder without tokenizer files."""
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise TokenizationError(
            f"{folder}: a dil_jax checkpoint without tokenizer files (none of "
            f"{', '.join(TOKENIZER_FILES)}); pass --tokenizer (e.g. the folder it was "
            "converted from)")
