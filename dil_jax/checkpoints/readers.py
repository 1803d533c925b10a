"""`load_reader`: a ready-to-run (model, params, tokenizer) from any checkpoint a command takes.

A dil_jax folder (orbax params beside `encoder_config.json`, as training saves them) or a
Hugging Face one (local, "default" or a hub id). Checks sit here because only here are the model,
its manifest and its tokenizer all known: the tokenizer must fit the model's vocabulary and be
the one the manifest records, a k other than the one the reader was trained with is logged, and
a command that needs a trained QA head can ask for one.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from dil_jax.checkpoints.files import read_json
from dil_jax.checkpoints.hf_import import load_hf_checkpoint
from dil_jax.checkpoints.integrity import (
    TOKENIZER_FIELD,
    check_finite_params,
    check_tokenizer_record,
)
from dil_jax.checkpoints.manifest import MANIFEST_FILE, read_manifest, trained_k
from dil_jax.checkpoints.orbax_io import ENCODER_CONFIG_FILE, TRAINED_FROM_FILE, load_params
from dil_jax.errors import CheckpointError
from dil_jax.hub import resolve_checkpoint
from dil_jax.model.delayed import DelayedInteractionModel, Params
from dil_jax.tokenization import TOKENIZER_FILES, TokenizationError, load_tokenizer

# One logger for the whole package: its warnings are silenced by that name (sep.prescreener).
log = logging.getLogger(__package__)


def load_reader(checkpoint: str, k: int | None, max_question_len: int,
                tokenizer_path: str | None = None, require_qa_head: bool = False
                ) -> tuple[DelayedInteractionModel, Params, Any]:
    """(model, params, tokenizer) from a dil_jax (orbax) folder or a Hugging Face checkpoint.

    k: the split point (None: the one a dil_jax checkpoint or export records, else 0). A k other
    than the one the reader was trained with is allowed (the same params serve every k) but
    logged as a WARNING: its answers are those of a model it was not trained as.
    require_qa_head: refuse (UntrainedHeadError) a checkpoint without a QA head, whose head
    would be initialised at random: `predict` asks for it; the demo, which says loudly that it
    falls back to the untrained embedded MiniLM, does not.
    Checked: the weights (their recorded digests, finite values: `integrity`), and the
    tokenizer against the model's vocabulary (`check_tokenizer`) and against the one the
    reader's manifest records (`check_tokenizer_record`).
    """
    overrides: dict[str, Any] = {"max_question_len": max_question_len}
    if k is not None:
        overrides["num_lower_layers"] = k
    folder = Path(checkpoint).expanduser()
    manifest: dict[str, Any] = {}
    if (folder / ENCODER_CONFIG_FILE).is_file():
        config, params = load_params(folder, **overrides)
        check_finite_params(params, str(folder))  # orbax params carry no digest
        trained = _saved_k(folder)
        if tokenizer_path is None:
            tokenizer_path = str(_own_tokenizer_folder(folder))
    else:
        folder = resolve_checkpoint(checkpoint)  # once: a hub id is fetched here
        config, params, report = load_hf_checkpoint(folder, **overrides)
        if require_qa_head:
            _require_qa_head(checkpoint, report.initialized)
        trained = trained_k(folder)
        manifest = read_manifest(folder)
    if k is not None and trained is not None and k != trained:
        log.warning("--k %d differs from k=%d that the reader %s was trained with: the same "
                    "weights, but read with a split they were not trained for; expect worse "
                    "answers (pass --k %d, or leave --k out to use it)", k, trained, checkpoint,
                    trained)
    tokenizer = load_tokenizer(tokenizer_path or folder, vocab_size=config.vocab_size,
                               architecture=config.architecture)
    if manifest.get(TOKENIZER_FIELD):
        check_tokenizer_record(tokenizer, manifest[TOKENIZER_FIELD], folder / MANIFEST_FILE,
                               str(tokenizer_path or folder), given=tokenizer_path is not None,
                               folder=resolve_checkpoint(tokenizer_path or folder))
    return DelayedInteractionModel(config), params, tokenizer


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


def recorded_null_threshold(checkpoint: str) -> float | None:
    """The SQuAD v2.0 null threshold a trained reader's export records (`trained_from.json`
    beside its params), or None: not a local dil_jax folder, or a run that chose none.

    A value that is not a finite number is a CheckpointError naming the file.
    """
    path = Path(checkpoint).expanduser() / TRAINED_FROM_FILE
    if not path.is_file():
        return None
    record = read_json(path, "training record")
    value = record.get("null_threshold") if isinstance(record, dict) else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CheckpointError(f"{path}: 'null_threshold' must be a finite number, got {value!r}; "
                              "fix or remove it (then pass --null-threshold)")
    return float(value)


def _saved_k(folder: Path) -> int | None:
    """The k the training loop saved a dil_jax folder with (`save_params`), before any --k."""
    stored = read_json(folder / ENCODER_CONFIG_FILE, "dil_jax encoder config")
    trained = stored.get("num_lower_layers")
    if isinstance(trained, bool) or not isinstance(trained, int):
        return None
    return trained


def _own_tokenizer_folder(folder: Path) -> Path:
    """`folder` itself when it holds tokenizer files; else TokenizationError (pass --tokenizer)."""
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise TokenizationError(
            f"{folder}: a dil_jax checkpoint without tokenizer files (none of "
            f"{', '.join(TOKENIZER_FILES)}); pass --tokenizer (e.g. the folder it was "
            "converted from)")
    return folder
