"""The `Reader` protocol: what every reader family does, each family once.

A Reader is what every command reads with and what training starts from: the model (its
config), its params, its tokenizer and the checkpoint it came from, in one frozen value, passed
whole. Two families implement it: the BERT family (`readers.encoder.EncoderReader`: any k of the
same params) and the character readers QANet / BiDAF (`readers.char.CharReader`: a fixed split,
characters beside the ids). `readers.loading` picks the family once, from the manifest's model
kind (`READER_FAMILIES`); from then on, where the families differ, the difference is a method
or a capability of the reader, never a branch at the call site:

  loading       `Reader.load` (a resolved checkpoint + `LoadOptions`), `save` (the folder
                `load` reads back), `with_config`, `with_params`, `with_lsh_attention`
  reading       `pair_grid` / `local_grid` (the family's grid), `check_lengths` (its position
                table), `characters` (what it reads beside the ids), `encode_questions` /
                `passage_side` / `encode_passage_batch` (one side of the grid, from `TokenRows`)
  the cache     `passage_encoder` (what an open-domain cache stores), `cacheable_passage_side`
  training      `outputs` (a batch's span scores), `optimized` (the optimizer over its variables)
  naming        `kind`, `label`, `describe`
  capabilities  `ReaderCapabilities`: the no-answer score, prescreening, a k of choice, the pair
                program's reuses, characters, a Hugging Face export

The grids themselves (`reading.grid.PairGrid`, `reading.char_grid.CharPairGrid`) read pairs
with one signature; only how a side is encoded differs, and that is the reader's.
"""

from __future__ import annotations

import abc
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from dil_jax.errors import CheckpointError, UsageError
from dil_jax.model.encoder_config import NO_OVERRIDES, ReaderOverrides

if TYPE_CHECKING:
    import jax
    from jax.sharding import Mesh

    from dil_jax.checkpoints.resolved import ResolvedCheckpoint
    from dil_jax.model.span_reader import ReaderOutput
    from dil_jax.reading.grid import MeshGrid


@dataclasses.dataclass(frozen=True)
class ReaderCapabilities:
    """What a reader family can do, where the families differ.

    null_score: a no-answer score (`[CLS]`): SQuAD 2.0 files, --null-threshold,
      handle_impossible_answer; without it every question gets a span.
    prescreening: its upper blocks can read the kept tokens of a window only (sentence
      prescreening); without it pairs read whole windows.
    chosen_k: k is a reading choice (the same params serve every split); without it the split
      is fixed by the architecture (`Reader.split`).
    pair_reuse: its pair program has a `reading.plan.ReusePlan` (the first upper block's
      hoisted q/k/v and statistics, which an open-domain cache may store: --cache-reuse).
    reads_characters: it reads each token's characters beside its id (`Reader.characters`).
    hugging_face_export: transformers has the model, so `dil-jax export` can write it.
    bfloat16_matmuls: it can read with its dense matmuls' operands in bfloat16
      (`Reader.with_matmul_dtype`); without it, float32 only.
    """

    null_score: bool
    prescreening: bool
    chosen_k: bool
    pair_reuse: bool
    reads_characters: bool
    hugging_face_export: bool
    bfloat16_matmuls: bool = False


@dataclasses.dataclass(frozen=True)
class LoadOptions:
    """How a checkpoint is read into a Reader (`Reader.load`).

    k: the split to read with (None: the checkpoint's own; a family without `chosen_k` refuses
    another, `FixedSplitError`). max_question_len: tokens of `[CLS] question [SEP]` (None: the
    checkpoint's own). tokenizer: a tokenizer folder or name instead of the checkpoint's own
    (None: its own). with_tokenizer: False loads none (training: its featurizer has its own).
    require_qa_head: refuse a checkpoint without a trained QA head (`UntrainedHeadError`).
    overrides: config fields set as given, unwarned and unchecked against the checkpoint
    (training's split, dropout, compute dtype), under k and max_question_len; rng: initialises
    a QA head the checkpoint lacks (None: a fixed key).
    """

    k: int | None = None
    max_question_len: int | None = None
    tokenizer: str | None = None
    with_tokenizer: bool = True
    require_qa_head: bool = False
    overrides: ReaderOverrides = NO_OVERRIDES
    rng: jax.Array | None = None


class FixedSplitError(CheckpointError):
    """A k other than the fixed split of a reader without `chosen_k`: `kind` (its model kind),
    `split` (the k it is read at) and `side` (what its passages' cached side is)."""

    def __init__(self, name: str, kind: str, split: int, side: str, k: int):
        self.kind, self.split, self.side, self.k = kind, split, side, k
        super().__init__(f"{name}: a {kind} reader's split is fixed (its passages' cached side "
                         f"is its {side}, k = {split}); read it at k = {split}, not {k}")


class LshLayersError(UsageError):
    """LSH attention asked in a form the reader does not take (`Reader.with_lsh_attention`):
    the message says what it takes instead."""


@dataclasses.dataclass(frozen=True)
class TokenRows:
    """Rows of one side of a grid (questions, or passage windows), on the host.

    ids, mask: [n, length]; chars: [n, length, slots] each token's characters for a reader that
    reads them (`ReaderCapabilities.reads_characters`), else None.
    """

    ids: np.ndarray
    mask: np.ndarray
    chars: np.ndarray | None = None

    def __len__(self) -> int:
        return self.ids.shape[0]

    def take(self, index: slice | np.ndarray, size: int) -> TokenRows:
        """The rows `index` picks, zero-padded to `size` rows (one compiled shape)."""
        def take(array: np.ndarray | None) -> np.ndarray | None:
            if array is None:
                return None
            picked = array[index]
            return np.pad(picked, ((0, size - picked.shape[0]),) + ((0, 0),) * (picked.ndim - 1))

        return TokenRows(take(self.ids), take(self.mask), take(self.chars))

    @staticmethod
    def join(parts: Sequence[TokenRows]) -> TokenRows:
        """The rows of every part, in order (all with characters, or none)."""
        chars = [part.chars for part in parts]
        return TokenRows(np.concatenate([part.ids for part in parts]),
                         np.concatenate([part.mask for part in parts]),
                         None if chars[0] is None else np.concatenate(chars))


class TokenWindows(Protocol):
    """Passage windows as a cache builder hands them to a `PassageEncoder`
    (`open_domain.cache.store.WindowBatch`): index rows [n], ids and mask [n, p_len], character
    offsets into each window's passage text [n, p_len, 2]."""

    rows: np.ndarray
    ids: np.ndarray
    mask: np.ndarray
    offsets: np.ndarray


# Windows -> the passage side a cache stores for them ([n, p_len, width] states).
PassageEncoder = Callable[[TokenWindows], np.ndarray]
# Window rows [n] -> the text of each window's passage, in order (`OpenDomainIndex.window_texts`).
WindowTexts = Callable[[np.ndarray], Sequence[str]]


@dataclasses.dataclass(frozen=True, eq=False)
class Reader(abc.ABC):
    """A reader ready to run: model, params, tokenizer (None: made without one, e.g. for
    training, whose featurizer tokenizes) and the checkpoint it came from (None: initialised at
    random). Frozen: another setting is another Reader (`with_config`, `with_params`); the
    model object is kept where the config is, so compiled programs keyed by it are reused.
    Compared by identity."""

    model: Any
    params: Any
    tokenizer: Any = None
    checkpoint: ResolvedCheckpoint | None = None
    # The fingerprint of the float32 weights `params` were rounded from (`with_matmul_dtype`);
    # None: params are those weights. Caches are keyed by the weights, not their rounding.
    rounded_from: str | None = None

    capabilities: ClassVar[ReaderCapabilities]

    # ------------------------------------------------------------------ loading

    @classmethod
    @abc.abstractmethod
    def load(cls, checkpoint: ResolvedCheckpoint, options: LoadOptions) -> Reader:
        """The reader of a resolved checkpoint of this family, read as `options` say; checks
        of weights and tokenizer wired in (CheckpointError naming what is wrong)."""

    @abc.abstractmethod
    def save(self, directory: str | os.PathLike) -> Path:
        """Writes the params and config as the folder `load` reads back (which must not
        exist; atomically: a reader never sees half a folder); returns it. What a training
        run exports."""

    @property
    def config(self) -> Any:
        """The model's config (`EncoderConfig`, `QANetConfig`, `BiDAFConfig`)."""
        return self.model.config

    @property
    def split(self) -> int:
        """k: the blocks that read question and passage apart (a fixed one for a family
        without `chosen_k`)."""
        return self.config.num_lower_layers

    def with_params(self, params: Any) -> Reader:
        """The same model and tokenizer with other weights (a training step's)."""
        return dataclasses.replace(self, params=params, rounded_from=None)

    def with_placed_params(self, params: Any) -> Reader:
        """The same weights placed elsewhere (copied to the devices): what was said of them,
        `rounded_from` included, still holds."""
        return dataclasses.replace(self, params=params)

    def weights_fingerprint(self) -> str:
        """The fingerprint of the weights this reader reads (`params_fingerprint`), those its
        params were rounded from where they were: what its caches are keyed by."""
        from dil_jax.checkpoints.fingerprint import params_fingerprint

        return self.rounded_from or params_fingerprint(self.params)

    @property
    def matmul_dtype(self) -> str:
        """What its dense matmuls read ("float32", or "bfloat16" operands:
        `EncoderConfig.matmul_dtype`); float32 for a family without `bfloat16_matmuls`."""
        return "float32"

    def with_matmul_dtype(self, dtype: str) -> Reader:
        """The same reader with its dense matmuls reading `dtype` operands ("float32",
        "bfloat16": `EncoderConfig.matmul_dtype`); a family without `bfloat16_matmuls` reads
        float32 only (UsageError for another)."""
        if dtype != "float32":
            raise UsageError(f"{self.label} reader ({self.kind}): matmul dtype {dtype!r} is "
                             "for BERT-family readers; this one reads in float32")
        return self

    @abc.abstractmethod
    def with_config(self, **changes: Any) -> Reader:
        """The same params and tokenizer read with other config fields (ConfigError for a
        field the params depend on)."""

    @abc.abstractmethod
    def with_lsh_attention(self, layers: str | tuple[int, ...] | tuple[str, ...],
                           num_hashes: int | None = None, bucket_size: int | None = None,
                           source: str = "lsh_attention_layers") -> Reader:
        """The same params read with Reformer LSH attention where `layers` says: the BERT
        family's "lower" or layer indices, a QANet's encoder names; `source` names the
        setting in messages. LshLayersError saying what this reader takes instead (a BiDAF:
        none, it has no self-attention); ConfigError for a bad layer."""

    # ------------------------------------------------------------------ naming

    @property
    @abc.abstractmethod
    def kind(self) -> str:
        """The model kind a manifest records: "encoder" (the BERT family), "qanet", "bidaf"."""

    @property
    @abc.abstractmethod
    def label(self) -> str:
        """Its name in results: "full" (k = 0), "DIL k=K", or its kind ("qanet")."""

    @abc.abstractmethod
    def describe(self) -> str:
        """How it reads, for a log line: "k=2", "k=2, LSH attention in layers [0, 1]",
        "qanet, LSH attention in the model encoder(s)"."""

    # ------------------------------------------------------------------ reading

    @abc.abstractmethod
    def check_lengths(self, max_question_len: int, max_passage_len: int, fix: str) -> None:
        """InputError (ending in `fix`: the flags to change) unless segments of these lengths
        fit the model's position table; nothing to check without one."""

    @abc.abstractmethod
    def characters(self, texts: Sequence[str], offsets: np.ndarray, mask: np.ndarray
                   ) -> np.ndarray | None:
        """What it reads of each token beside its id, from the token's [start, end) `offsets`
        [n, length, 2] into its row's text (`texts`, one per row; mask [n, length]): the
        characters [n, length, max_chars] where `reads_characters`, else None."""

    @abc.abstractmethod
    def pair_grid(self, mesh: Mesh | None = None, batch_size: int = 32,
                  chunk_size: int | None = None,
                  *, reuse: bool = True, trim_padding: bool = True) -> MeshGrid:
        """The family's grid over its model (`PairGrid`, `CharPairGrid`), the one way a
        reader's grid is made: `batch_size` segments per encode batch, `chunk_size` pairs per
        step (None: the platform's default). reuse: the pair program's exact reuses where it
        has them (`pair_reuse`; False: the reference computation); trim_padding: chunks cut to
        their real tokens where that is exact."""

    def local_grid(self, batch_size: int) -> MeshGrid:
        """The family's grid over this process's devices only, `batch_size` rows per device
        per step: what cache builds encode with, so that each process of a sharded build
        encodes its own rows with no collective and a row's values do not depend on how the
        build was split."""
        import jax

        from dil_jax.mesh import data_mesh

        return self.pair_grid(data_mesh(jax.local_devices()),
                              batch_size * jax.local_device_count())

    @abc.abstractmethod
    def encode_questions(self, grid: MeshGrid, rows: TokenRows) -> jax.Array:
        """The questions' states [n, q_len, width] (replicated for the pair phase), encoded
        by `grid` (this reader's `pair_grid`) with this reader's params."""

    @abc.abstractmethod
    def passage_side(self, grid: MeshGrid, rows: TokenRows) -> jax.Array | np.ndarray:
        """What the pairs read of each passage window (`read_pairs`' p_source): its lower
        states [n, p_len, width], or its ids [n, p_len] where the side is not cacheable."""

    @abc.abstractmethod
    def encode_passage_batch(self, grid: MeshGrid, rows: TokenRows) -> jax.Array:
        """One batch of passage windows through the grid's lower program as it is, rows split
        over the devices, nothing padded or joined: [b, p_len, width]. For callers that pad
        and join on the host (a server: one program per batch shape, not per window count);
        only where `cacheable_passage_side`."""

    # ------------------------------------------------------------------ the cache

    @property
    @abc.abstractmethod
    def cacheable_passage_side(self) -> bool:
        """Whether a passage's side is a state of the passage alone that a cache can hold
        (False for the BERT family at k = 0: its positions follow the question's, so the
        cache keeps the tokens and each pair embeds them)."""

    @abc.abstractmethod
    def passage_encoder(self, batch_size: int = 32, window_texts: WindowTexts | None = None
                        ) -> PassageEncoder | None:
        """What a passage cache stores for this reader, encoded on this process's devices
        (`local_grid`, batch_size rows per device); None where it stores no states
        (`cacheable_passage_side` false). window_texts: required by a reader that reads
        characters (they are read from the windows' passage texts)."""

    # ------------------------------------------------------------------ training

    def optimized(self, tx: Any) -> Any:
        """`tx` (an optax transformation) as a training run applies it to this reader's
        variables: as it is, where every variable trains."""
        return tx

    @abc.abstractmethod
    def outputs(self, params: Any, batch: Mapping[str, jax.Array], *,
                deterministic: bool = True, rngs: dict[str, jax.Array] | None = None,
                output_hidden_states: bool = False) -> ReaderOutput:
        """The span scores of one micro-batch of aligned (question, window) pairs with
        `params` (traced inside jit): "q_ids", "q_mask" [M, Lq], "p_ids", "p_mask" [M, Lp], and
        "q_chars", "p_chars" [M, L, slots] where `reads_characters`. output_hidden_states: the
        per-layer states LRS distils (the BERT family only)."""

