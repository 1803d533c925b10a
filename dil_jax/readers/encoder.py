"""The BERT family as a `Reader`: `EncoderReader` (DelayedInteractionModel: BERT, RoBERTa,
ALBERT, DistilBERT, ELECTRA, MiniLM, XLNet), loaded from a dil_jax (orbax) folder or a Hugging
Face checkpoint (local, "default" or a hub id), or initialised at random (`init_reader`).

Any k of the same params reads (`LoadOptions.k`: another than the trained one is logged); the
pairs read through `reading.grid.PairGrid` and its `ReusePlan`; a passage's cacheable side is
its lower states (at k = 0 its tokens: positions follow the question). Checks sit in `load`
because only there are the model, its manifest and its tokenizer all known: the weights (their
recorded digests, finite values: `checkpoints.integrity`), the tokenizer against the model's
vocabulary and against the one the manifest records, a k other than the trained one (logged),
and a QA head when a command needs a trained one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import jax
import numpy as np
from jax.sharding import Mesh

from dil_jax.checkpoints.hf_import import load_hf_folder
from dil_jax.checkpoints.integrity import (
    check_finite_params,
    check_tokenizer_record,
    tokenizer_record,
)
from dil_jax.checkpoints.manifest import MANIFEST_FILE
from dil_jax.checkpoints.orbax_io import load_params, save_params
from dil_jax.checkpoints.resolved import ResolvedCheckpoint
from dil_jax.errors import CheckpointError
from dil_jax.hub import resolve_checkpoint
from dil_jax.model.attention import matmul_params
from dil_jax.model.char_reader import ENCODER_KIND
from dil_jax.model.delayed import DelayedInteractionModel, Params, check_segment_lengths
from dil_jax.model.encoder_config import EncoderConfig, ReaderOverrides, lsh_layers_of
from dil_jax.model.span_reader import PASSAGE_SEGMENT, ReaderOutput
from dil_jax.readers.protocol import (
    LoadOptions,
    LshLayersError,
    PassageEncoder,
    Reader,
    ReaderCapabilities,
    TokenRows,
    TokenWindows,
    WindowTexts,
)
from dil_jax.reading.grid import PairGrid
from dil_jax.reading.plan import ReusePlan
from dil_jax.tokenization import TOKENIZER_FILES, TokenizationError, load_tokenizer

# One logger for the package: its warnings are silenced by that name where a load's are noise.
log = logging.getLogger(__package__)


@dataclasses.dataclass(frozen=True, eq=False)
class EncoderReader(Reader):
    """A BERT-family reader: model a DelayedInteractionModel (`config`: its EncoderConfig),
    params its weights (a nested dict of float32 arrays)."""

    capabilities: ClassVar[ReaderCapabilities] = ReaderCapabilities(
        null_score=True, prescreening=True, chosen_k=True, pair_reuse=True,
        reads_characters=False, hugging_face_export=True, bfloat16_matmuls=True)

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(cls, checkpoint: ResolvedCheckpoint, options: LoadOptions) -> EncoderReader:
        """A dil_jax folder (orbax params beside `encoder_config.json`) or a Hugging Face one.

        A k other than the one the reader was trained with is allowed (the same params serve
        every k) but logged as a WARNING: its answers are those of a model it was not trained
        as. A Hugging Face checkpoint without a QA head gets one initialised
        (`LoadOptions.rng`), refused under `LoadOptions.require_qa_head` (UntrainedHeadError):
        `predict` asks for that;
        the demo, which says loudly that it falls back to the untrained embedded MiniLM, does
        not.
        """
        overrides = ReaderOverrides(num_lower_layers=options.k,
                                    max_question_len=options.max_question_len
                                    ).over(options.overrides)
        if checkpoint.is_orbax:
            config, params = load_params(checkpoint.folder, overrides)
            check_finite_params(params, str(checkpoint.folder))  # orbax params carry no digest
        else:
            config, params, report = load_hf_folder(checkpoint, overrides, rng=options.rng)
            if options.require_qa_head:
                _require_qa_head(checkpoint.name, report.initialized)
        _warn_other_k(checkpoint, options.k)
        tokenizer = (_reader_tokenizer(checkpoint, config, options.tokenizer)
                     if options.with_tokenizer else None)
        return cls(DelayedInteractionModel(config), params, tokenizer, checkpoint)

    def save(self, directory: str | os.PathLike) -> Path:
        """A dil_jax folder: orbax params beside `encoder_config.json` (`save_params`). A
        reader loaded at `matmul_dtype` "bfloat16" holds rounded kernels: refused."""
        if self.config.matmul_dtype != "float32":
            raise CheckpointError(
                f"this reader was loaded with matmul_dtype {self.config.matmul_dtype!r} "
                "(its dense kernels rounded for reading): load it at float32 to save it")
        return save_params(directory, self.params, self.config)

    def with_config(self, **changes: Any) -> EncoderReader:
        """Other EncoderConfig fields (another k, LSH attention), the same params (their dense
        kernels rounded once at a new `matmul_dtype` "bfloat16", `matmul_params`; a reader
        whose kernels are rounded cannot go back: CheckpointError)."""
        config = self.config.replace(**changes)
        if config.matmul_dtype != self.config.matmul_dtype:
            if self.config.matmul_dtype != "float32":
                raise CheckpointError(
                    f"this reader's dense kernels were rounded for matmul_dtype "
                    f"{self.config.matmul_dtype!r}: load it again for {config.matmul_dtype!r}")
            return dataclasses.replace(self, model=DelayedInteractionModel(config),
                                       params=matmul_params(self.params, config),
                                       rounded_from=self.weights_fingerprint())
        return dataclasses.replace(self, model=DelayedInteractionModel(config))

    @property
    def matmul_dtype(self) -> str:
        return self.config.matmul_dtype

    def with_matmul_dtype(self, dtype: str) -> EncoderReader:
        return self if dtype == self.matmul_dtype else self.with_config(matmul_dtype=dtype)

    def with_lsh_attention(self, layers: str | tuple[int, ...] | tuple[str, ...],
                           num_hashes: int | None = None, bucket_size: int | None = None,
                           source: str = "lsh_attention_layers") -> EncoderReader:
        """LSH attention in "lower" (the blocks 0..k-1) or the layers given by index; `source`
        names the setting in messages."""
        if isinstance(layers, tuple) and layers and all(isinstance(v, str) for v in layers):
            raise LshLayersError("takes 'lower' or layer indices (encoder names are a QANet's)")
        changes: dict[str, Any] = {
            "lsh_attention_layers": lsh_layers_of(layers, self.config.num_lower_layers, source)}
        if num_hashes is not None:
            changes["lsh_num_hashes"] = num_hashes
        if bucket_size is not None:
            changes["lsh_bucket_size"] = bucket_size
        return self.with_config(**changes)  # ConfigError names a bad layer

    # ------------------------------------------------------------------ naming

    @property
    def kind(self) -> str:
        return ENCODER_KIND

    @property
    def label(self) -> str:
        return "full" if self.split == 0 else f"DIL k={self.split}"

    def describe(self) -> str:
        config = self.config
        lsh = (f", LSH attention in layers {list(config.lsh_attention_layers)}"
               if config.uses_lsh else "")
        return f"k={config.num_lower_layers}{lsh}"

    # ------------------------------------------------------------------ reading

    def check_lengths(self, max_question_len: int, max_passage_len: int, fix: str) -> None:
        check_segment_lengths(self.config, max_question_len, max_passage_len, fix=fix)

    def characters(self, texts: Sequence[str], offsets: np.ndarray, mask: np.ndarray) -> None:
        return None  # the ids alone

    def pair_grid(self, mesh: Mesh | None = None, batch_size: int = 32,
                  chunk_size: int | None = None,
                  *, reuse: bool = True, trim_padding: bool = True) -> PairGrid:
        return PairGrid(self.model, mesh=mesh, batch_size=batch_size, chunk_size=chunk_size,
                        reuse=reuse, trim_padding=trim_padding)

    def encode_questions(self, grid: PairGrid, rows: TokenRows) -> jax.Array:
        return grid.encode_questions(self.params, rows.ids, rows.mask)

    def passage_side(self, grid: PairGrid, rows: TokenRows) -> jax.Array | np.ndarray:
        return grid.passage_side(self.params, rows.ids, rows.mask)

    def encode_passage_batch(self, grid: PairGrid, rows: TokenRows) -> jax.Array:
        return grid.encode_batch(self.params, rows.ids, rows.mask, PASSAGE_SEGMENT)

    # ------------------------------------------------------------------ the cache

    @property
    def cacheable_passage_side(self) -> bool:
        return not ReusePlan.for_config(self.config).reads_passage_ids

    def passage_encoder(self, batch_size: int = 32, window_texts: WindowTexts | None = None
                        ) -> PassageEncoder | None:
        """`encode_lower` of the windows' ids (the texts are not read)."""
        if not self.cacheable_passage_side:
            return None
        grid = self.local_grid(batch_size)

        def encode(windows: TokenWindows) -> np.ndarray:
            return np.asarray(grid.encode_passages(self.params, windows.ids, windows.mask))

        return encode

    # ------------------------------------------------------------------ training

    def outputs(self, params: Params, batch: Mapping[str, jax.Array], *,
                deterministic: bool = True, rngs: dict[str, jax.Array] | None = None,
                output_hidden_states: bool = False) -> ReaderOutput:
        return self.model(params, batch["q_ids"], batch["q_mask"], batch["p_ids"],
                          batch["p_mask"], deterministic=deterministic, rngs=rngs,
                          output_hidden_states=output_hidden_states)


def init_reader(config: EncoderConfig, rng: jax.Array, tokenizer: Any = None) -> EncoderReader:
    """A reader of `config` with fresh params (`DelayedInteractionModel.init`), as host
    (numpy) arrays; no checkpoint."""
    model = DelayedInteractionModel(config)
    return EncoderReader(model, jax.tree.map(np.asarray, model.init(rng)), tokenizer)


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
