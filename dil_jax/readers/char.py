"""QANet and BiDAF as a `Reader`: `CharReader`, loaded from the folder `dil-jax train` exports
(`checkpoints.char_readers`: orbax variables beside a manifest naming the model kind).

What sets the family apart: each token's characters are read beside its id (`characters`:
through the token's offsets into its text, as `model.qanet_inputs.token_characters` reads them),
the word table lives in a second variable collection (`{"params", "frozen"}`), the split is fixed
by the architecture (the embedding encoder / contextual layer per segment, the rest per pair:
`Reader.split`), and there is no no-answer score (SQuAD v1.1 only) and no prescreening (the pair
program reads whole windows). The pairs read through `reading.char_grid.CharPairGrid`; a passage's
side is always its lower state, so a cache always holds it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from dil_jax.checkpoints.char_readers import (
    read_reader_fields,
    restore_char_variables,
    save_char_reader,
)
from dil_jax.checkpoints.integrity import check_finite_params
from dil_jax.checkpoints.manifest import MANIFEST_FILE
from dil_jax.checkpoints.resolved import ResolvedCheckpoint
from dil_jax.errors import CheckpointError
from dil_jax.hub import resolve_checkpoint
from dil_jax.model.char_reader import (
    QUESTION_LEN_FIELD,
    char_model,
    kind_of,
    reader_config,
    switched_config,
)
from dil_jax.model.encoder_config import ConfigError
from dil_jax.model.qanet import Variables
from dil_jax.model.qanet_inputs import QANetSegment, fit_chars, token_characters
from dil_jax.model.span_reader import ReaderOutput
from dil_jax.model.word_table import FROZEN_COLLECTION
from dil_jax.readers.protocol import (
    FixedSplitError,
    LoadOptions,
    LshLayersError,
    PassageEncoder,
    Reader,
    ReaderCapabilities,
    TokenRows,
    TokenWindows,
    WindowTexts,
)
from dil_jax.reading.char_grid import CharPairGrid
from dil_jax.tokenization import load_tokenizer

# What each kind's passage side is (its fixed split), for messages.
_PASSAGE_SIDE = {"qanet": "embedding encoder", "bidaf": "contextual layer"}


@dataclasses.dataclass(frozen=True, eq=False)
class CharReader(Reader):
    """A QANet / BiDAF reader: model a `CharModel` (`config`: its QANetConfig / BiDAFConfig),
    params its whole variables (the frozen word table included): `CharReader(char_model(config),
    variables)` for fresh or trained ones."""

    capabilities: ClassVar[ReaderCapabilities] = ReaderCapabilities(
        null_score=False, prescreening=False, chosen_k=False, pair_reuse=False,
        reads_characters=True, hugging_face_export=False, bfloat16_matmuls=False)

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(cls, checkpoint: ResolvedCheckpoint, options: LoadOptions) -> CharReader:
        """The export's own config (the question length as `options` says), its variables
        restored into the model's tree and checked finite, and the tokenizer of
        `LoadOptions.tokenizer` (None: the embedded MiniLM's, whose vocabulary the word table
        rows follow), checked against the reader's vocabulary. CheckpointError naming the folder and
        what is wrong (a bad manifest, missing or damaged params, non-finite weights, a k
        other than its fixed split: `FixedSplitError`)."""
        directory = checkpoint.folder.absolute()
        kind = checkpoint.model_kind
        fields = read_reader_fields(directory)
        if options.max_question_len is not None:
            fields[QUESTION_LEN_FIELD] = options.max_question_len
        try:
            config = reader_config(kind, fields)
        except (ConfigError, TypeError) as error:
            raise CheckpointError(f"{directory / MANIFEST_FILE}: {error}") from error
        model = char_model(config)
        variables = restore_char_variables(directory, jax.eval_shape(model.init,
                                                                     jax.random.key(0)), kind)
        check_finite_params(variables, str(directory))
        if options.k is not None and options.k != config.num_lower_layers:
            raise FixedSplitError(checkpoint.name, kind, config.num_lower_layers,
                                  _PASSAGE_SIDE[kind], options.k)
        tokenizer = (load_tokenizer(resolve_checkpoint(options.tokenizer or "default"),
                                    vocab_size=config.vocab_size)
                     if options.with_tokenizer else None)
        reader = cls(model, variables, tokenizer, checkpoint)
        changes = options.overrides.fields()
        return reader.with_config(**changes) if changes else reader

    def save(self, directory: str | os.PathLike) -> Path:
        """Its whole variables (the word table included) beside a manifest naming its kind and
        config (`save_char_reader`)."""
        return save_char_reader(directory, self.params, self.config)

    def with_config(self, **changes: Any) -> CharReader:
        """Other run settings (`char_reader.switched_config`: LSH / reversible / chunked
        computation, dropout, question length); ConfigError for a field its params depend
        on."""
        return dataclasses.replace(self, model=char_model(switched_config(self.config, changes)))

    def with_lsh_attention(self, layers: str | tuple[int, ...] | tuple[str, ...],
                           num_hashes: int | None = None, bucket_size: int | None = None,
                           source: str = "lsh_encoders") -> CharReader:
        """LSH attention in a QANet's encoders, named ("embedding", "model")."""
        if not hasattr(self.config, "lsh_encoders"):
            raise LshLayersError(f"is a {self.kind} reader: it has no self-attention")
        if not (isinstance(layers, tuple) and all(isinstance(v, str) for v in layers)):
            raise LshLayersError(f"is a {self.kind} reader: it takes its encoders by name "
                                 "('embedding', 'model')")
        changes: dict[str, Any] = {"lsh_encoders": layers}
        if num_hashes is not None:
            changes["lsh_num_hashes"] = num_hashes
        if bucket_size is not None:
            changes["lsh_bucket_size"] = bucket_size
        return self.with_config(**changes)

    # ------------------------------------------------------------------ naming

    @property
    def kind(self) -> str:
        return kind_of(self.config)

    @property
    def label(self) -> str:
        return self.kind

    def describe(self) -> str:
        encoders = getattr(self.config, "lsh_encoders", ())
        lsh = (f", LSH attention in the {' and '.join(encoders)} encoder(s)" if encoders else "")
        return f"{self.kind}{lsh}"

    # ------------------------------------------------------------------ reading

    def check_lengths(self, max_question_len: int, max_passage_len: int, fix: str) -> None:
        return None  # positions are sinusoids per segment: no table to outgrow

    def characters(self, texts: Sequence[str], offsets: np.ndarray, mask: np.ndarray
                   ) -> np.ndarray:
        return token_characters(texts, offsets, mask, self.config.max_chars)

    def pair_grid(self, mesh: Mesh | None = None, batch_size: int = 32,
                  chunk_size: int | None = None,
                  *, reuse: bool = True, trim_padding: bool = True) -> CharPairGrid:
        """`reuse` has nothing to switch: the pair program hoists nothing."""
        return CharPairGrid(self.model, mesh=mesh, batch_size=batch_size, chunk_size=chunk_size,
                            trim_padding=trim_padding)

    def encode_questions(self, grid: CharPairGrid, rows: TokenRows) -> jax.Array:
        return grid.encode_questions(self.params, _segment(rows))

    def passage_side(self, grid: CharPairGrid, rows: TokenRows) -> jax.Array:
        return grid.encode_passages(self.params, _segment(rows))

    def encode_passage_batch(self, grid: CharPairGrid, rows: TokenRows) -> jax.Array:
        return grid.encode_batch(self.params, _segment(rows))

    # ------------------------------------------------------------------ the cache

    @property
    def cacheable_passage_side(self) -> bool:
        return True

    def passage_encoder(self, batch_size: int = 32, window_texts: WindowTexts | None = None
                        ) -> PassageEncoder:
        """`encode_lower` of the ids and each token's characters, read from the window's
        passage text (`window_texts`, by the windows' index rows) through its offsets."""
        if window_texts is None:
            raise ValueError(f"a {self.kind} reader reads characters: its cache encoder needs "
                             "the windows' passage texts (window_texts)")
        grid = self.local_grid(batch_size)

        def encode(windows: TokenWindows) -> np.ndarray:
            texts = list(window_texts(windows.rows))
            rows = TokenRows(windows.ids, windows.mask,
                             self.characters(texts, windows.offsets, windows.mask))
            return np.asarray(self.passage_side(grid, rows))

        return encode

    # ------------------------------------------------------------------ training

    def optimized(self, tx: Any) -> Any:
        """`tx` over the "params" collection; the frozen word table's collection gets no update
        and no optimizer state (`optax.set_to_zero`): no weight decay, no Adam moments, 2 x 47
        MB less per checkpoint than masking inside AdamW."""
        import optax

        def labels(variables: dict[str, Any]) -> dict[str, str]:
            # A prefix tree of the variables: each top-level collection gets one label.
            return {name: "fixed" if name == FROZEN_COLLECTION else "trained"
                    for name in variables}

        return optax.multi_transform({"trained": tx, "fixed": optax.set_to_zero()}, labels)

    def outputs(self, params: Variables, batch: Mapping[str, jax.Array], *,
                deterministic: bool = True, rngs: dict[str, jax.Array] | None = None,
                output_hidden_states: bool = False) -> ReaderOutput:
        """Training (`deterministic` False) with a "dropout" rng also draws fresh LSH rotations
        (an "lsh" rng folded from it), as the Reformer trains; inference keeps `lsh_seed`'s.
        No hidden states (LRS, which the config rules refuse for these kinds)."""
        if rngs is not None and "dropout" in rngs and "lsh" not in rngs:
            rngs = {**rngs, "lsh": jax.random.fold_in(rngs["dropout"], 1)}
        max_chars = self.config.max_chars
        question = QANetSegment(batch["q_ids"].astype(jnp.int32),
                                fit_chars(batch["q_chars"], max_chars),
                                batch["q_mask"].astype(jnp.int32))
        passage = QANetSegment(batch["p_ids"].astype(jnp.int32),
                               fit_chars(batch["p_chars"], max_chars),
                               batch["p_mask"].astype(jnp.int32))
        return self.model(params, question, passage, deterministic=deterministic, rngs=rngs)


def _segment(rows: TokenRows) -> QANetSegment:
    """Rows as the char grid takes them (it fits the characters to the model's own slots)."""
    return QANetSegment(rows.ids, rows.chars, rows.mask)

