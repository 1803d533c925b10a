"""QANet (Yu et al. 2018) as a delayed-interaction reader: params in, arrays out.

    model = QANetModel(QANetConfig())
    variables = model.init(jax.random.key(0), word_table=minilm_word_table())
    q_state = model.encode_lower(variables, question)      # once per question
    p_state = model.encode_lower(variables, passage)       # once per passage: cacheable
    out = model.encode_upper(variables, q_state, question.mask, p_state, passage.mask)

QANet is delayed interaction by construction: the question and the passage go through the input
embedding and the embedding encoder separately, with the same weights, and meet only at
context-query attention. So `encode_lower` (input embedding + embedding encoder of ONE segment,
question or passage alike) is the lower part and `encode_upper` (context-query attention, the
model encoder applied three times with shared weights, the start/end pointers) the per-pair
part, as `DelayedInteractionModel.encode_lower` / `encode_upper` split a BERT reader.

    word ids ---- frozen table (MiniLM, 384) --.
                                               +-- concat -> projection (d_model) -> highway x2
    characters -- char CNN, max-pool ----------'          -> embedding encoder block (x1)
                                                          = encode_lower(segment)
    [c, A, c*A, c*B] <- context-query attention(p_state, q_state)
      -> projection (d_model) -> model encoder (7 blocks) x3, shared: M0, M1, M2
      -> start = w1 . [M0; M1], end = w2 . [M0; M2]       = encode_upper(...)

Variables: `{"params": trainable, "frozen": {"word_table": [vocab_size, word_dim]}}`. The word
table is a separate collection so that an optimizer over "params" never sees it, and the
forward pass stops its gradient too. Inputs are `QANetSegment`s (`qanet_inputs`): the repo's own
`[CLS] q [SEP]` / `p [SEP]` token ids and masks, plus each token's characters.

Read by `predict`, the open-domain index, `ask`, `odqa-eval` and `bench` through
`reading.char_grid.CharPairGrid` (docs/qanet.md, "Read").
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from dil_jax.model import word_table as table_lib
from dil_jax.model.delayed import InputError
from dil_jax.model.qanet_config import MODEL_PASSES, QANetConfig
from dil_jax.model.qanet_inputs import QANetSegment
from dil_jax.model.qanet_layers import (
    CharacterCNN,
    ContextQueryAttention,
    EncoderStack,
    Highway,
)
from dil_jax.model.span_reader import PADDED_LOGIT, ReaderOutput
from dil_jax.model.word_table import Variables


class QANetModule(nn.Module):
    """QANet's Flax module; `QANetModel` is its checked, pure-functional face."""

    config: QANetConfig

    def setup(self) -> None:
        cfg = self.config
        self.word_table = table_lib.declare(self, cfg)
        self.word_dropout = nn.Dropout(cfg.word_dropout)
        self.char_cnn = CharacterCNN(cfg)
        self.projection = nn.Dense(cfg.d_model)
        self.highway = Highway(2, cfg.dropout)
        self.embedding_encoder = EncoderStack(cfg, "embedding")
        self.context_query = ContextQueryAttention(cfg)
        self.model_projection = nn.Dense(cfg.d_model)
        self.model_encoder = EncoderStack(cfg, "model")
        self.start_pointer = nn.Dense(1)
        self.end_pointer = nn.Dense(1)

    def embed(self, ids: jax.Array, chars: jax.Array, deterministic: bool = True) -> jax.Array:
        """ids: [batch, seq]; chars: [batch, seq, max_chars] -> [batch, seq, d_model]."""
        words = table_lib.look_up(self.word_table, ids, self.config)
        words = self.word_dropout(words, deterministic=deterministic)
        x = jnp.concatenate([words, self.char_cnn(chars, deterministic)], axis=-1)
        return self.highway(self.projection(x), deterministic)

    def encode_lower(self, ids: jax.Array, chars: jax.Array, mask: jax.Array,
                     deterministic: bool = True) -> jax.Array:
        """Input embedding + embedding encoder of one segment: [batch, seq] -> [batch, seq,
        d_model]. The same for questions and passages (no segment-dependent input)."""
        return self.embedding_encoder(self.embed(ids, chars, deterministic), mask, deterministic)

    def encode_upper(self, q_state: jax.Array, q_mask: jax.Array, p_state: jax.Array,
                     p_mask: jax.Array, deterministic: bool = True) -> ReaderOutput:
        """Context-query attention, the model encoder three times, the pointers.

        q_state: [batch, q_len, d_model]; q_mask: [batch, q_len]; p_state: [batch, p_len,
        d_model]; p_mask: [batch, p_len] -> ReaderOutput over the passage tokens.
        """
        x = self.context_query(p_state, p_mask, q_state, q_mask, deterministic)
        x = self.model_projection(x)
        passes = []
        for _ in range(MODEL_PASSES):
            x = self.model_encoder(x, p_mask, deterministic)
            passes.append(x)
        start = self.start_pointer(jnp.concatenate([passes[0], passes[1]], axis=-1))[..., 0]
        end = self.end_pointer(jnp.concatenate([passes[0], passes[2]], axis=-1))[..., 0]
        real = p_mask > 0
        start = jnp.where(real, start, PADDED_LOGIT)
        end = jnp.where(real, end, PADDED_LOGIT)
        # QANet scores spans inside the passage only (SQuAD v1.1): no no-answer score. The null
        # logits are PADDED_LOGIT, so a null answer never outscores a span.
        null = jnp.full(start.shape[:1], PADDED_LOGIT, start.dtype)
        return ReaderOutput(start, end, null, null)

    def __call__(self, q_ids: jax.Array, q_chars: jax.Array, q_mask: jax.Array,
                 p_ids: jax.Array, p_chars: jax.Array, p_mask: jax.Array,
                 deterministic: bool = True) -> ReaderOutput:
        q_state = self.encode_lower(q_ids, q_chars, q_mask, deterministic)
        p_state = self.encode_lower(p_ids, p_chars, p_mask, deterministic)
        return self.encode_upper(q_state, q_mask, p_state, p_mask, deterministic)


class QANetModel:
    """QANet with the delayed readers' split: `encode_lower` per segment, `encode_upper` per
    pair. Every method is a plain function of its array arguments (jit-, vmap-able)."""

    def __init__(self, config: QANetConfig):
        self.config = config
        self.module = QANetModule(config)

    def init(self, rng: jax.Array, word_table: Any = None) -> Variables:
        """Fresh variables: Flax's default initializers for the trainable params; the word table
        given ([vocab_size, word_dim], e.g. `qanet_inputs.minilm_word_table()`) or random."""
        cfg = self.config
        ids = jnp.ones((1, 4), jnp.int32)
        chars = jnp.ones((1, 4, cfg.max_chars), jnp.int32)
        variables = self.module.init(rng, ids, chars, ids, ids, chars, ids)
        return table_lib.with_table(variables, word_table, cfg)

    def _check_segment(self, segment: QANetSegment, what: str) -> None:
        ids, chars, mask = segment.ids, segment.chars, segment.mask
        if ids.ndim != 2 or tuple(mask.shape) != tuple(ids.shape):
            raise InputError(f"{what} ids and mask must be [batch, seq] alike, got "
                             f"{tuple(ids.shape)} and {tuple(mask.shape)}")
        if tuple(chars.shape) != (*ids.shape, self.config.max_chars):
            raise InputError(f"{what} chars must be [batch, seq, {self.config.max_chars}] "
                             f"(max_chars), got {tuple(chars.shape)}")
        for name, array in (("ids", ids), ("chars", chars)):
            if not jnp.issubdtype(array.dtype, jnp.integer):
                raise InputError(f"{what} {name} must be integers, got dtype {array.dtype}")

    def _check_state(self, state: Any, mask: Any, what: str) -> None:
        if state.ndim != 3 or state.shape[-1] != self.config.d_model:
            raise InputError(f"{what} state must be [batch, seq, {self.config.d_model}], got "
                             f"{tuple(state.shape)}")
        if tuple(mask.shape) != tuple(state.shape[:2]):
            raise InputError(f"{what} mask shape {tuple(mask.shape)} does not match its state "
                             f"{tuple(state.shape)}")

    def encode_lower(self, variables: Variables, segment: QANetSegment, *,
                     deterministic: bool = True, rngs: dict[str, jax.Array] | None = None
                     ) -> jax.Array:
        """Input embedding + embedding encoder of one segment (questions or passages, the same
        weights) -> [batch, seq, d_model]. A passage's state depends on the passage alone."""
        self._check_segment(segment, "segment")
        return self.module.apply(variables, segment.ids, segment.chars, segment.mask,
                                 deterministic, rngs=rngs, method="encode_lower")

    def encode_upper(self, variables: Variables, q_state: jax.Array, q_mask: jax.Array,
                     p_state: jax.Array, p_mask: jax.Array, *, deterministic: bool = True,
                     rngs: dict[str, jax.Array] | None = None) -> ReaderOutput:
        """Context-query attention + model encoder + pointers of aligned (question, passage)
        pairs: q_state [batch, q_len, d_model], p_state [batch, p_len, d_model] (their
        `encode_lower`) -> ReaderOutput, start/end logits [batch, p_len]."""
        self._check_state(q_state, q_mask, "question")
        self._check_state(p_state, p_mask, "passage")
        if q_state.shape[0] != p_state.shape[0]:
            raise InputError(f"question batch {q_state.shape[0]} differs from passage batch "
                             f"{p_state.shape[0]}")
        return self.module.apply(variables, q_state, q_mask, p_state, p_mask, deterministic,
                                 rngs=rngs, method="encode_upper")

    def __call__(self, variables: Variables, question: QANetSegment, passage: QANetSegment, *,
                 deterministic: bool = True, rngs: dict[str, jax.Array] | None = None
                 ) -> ReaderOutput:
        """The whole reader on aligned pairs (both segments encoded in one apply)."""
        self._check_segment(question, "question")
        self._check_segment(passage, "passage")
        if question.ids.shape[0] != passage.ids.shape[0]:
            raise InputError(f"question batch {question.ids.shape[0]} differs from passage "
                             f"batch {passage.ids.shape[0]}")
        return self.module.apply(variables, question.ids, question.chars, question.mask,
                                 passage.ids, passage.chars, passage.mask, deterministic,
                                 rngs=rngs)
