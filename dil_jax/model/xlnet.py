"""XLNet as a delayed-interaction reader: relative positional attention, single stream.

Hugging Face's `XLNetModel` / `XLNetForQuestionAnsweringSimple` in the fine-tuning form: one
content stream with bidirectional attention (attn_type "bi"), no memory, no permutation mask, no
two-stream query attention. A block is post-LayerNorm like BERT's, but its attention scores are

    score_ij = ((q_i + r_w) . k_j  +  (q_i + r_r) . R[pos_i - pos_j] W_r
                + (q_i + r_s) . seg_embed[segment_i != segment_j]) / sqrt(head_dim)

with R[d] the sinusoid of the relative distance d (`relative_position_table`), recomputed from
the tokens' positions in every block: XLNet has no position or token-type embedding tables.

Layout. XLNet's SQuAD input is `P [SEP] Q [SEP] [CLS]` with segment ids P 0, Q 1, CLS 2 (the
original run_squad.py's SEG_ID_P / SEG_ID_Q / SEG_ID_CLS). Our two-segment API keeps its
storage order (question segment `[CLS] q [SEP]`, CLS first so the null score is row 0 as for
every backbone; passage segment `p [SEP]`), and gives each token the POSITION it has in XLNet's
order (`question_layout`, `pair_layout`): the passage at 0..P-1, the question's `q [SEP]` after
it, `[CLS]` last. Attention depends on positions only through differences, so storage order,
padding between the segments and left or right padding change nothing; k = 0 is exactly
Hugging Face on `P [SEP] Q [SEP] [CLS]`.

Delayed interaction (DeFormer): blocks 1..k run on each segment alone, with the same positions
and segment ids, so relative distances within a segment are those of the full layout (an offset
of a whole segment cancels in pos_i - pos_j) and the segment term is "same segment" everywhere
but between `[CLS]` and the question tokens (CLS is its own segment in XLNet). A passage's lower
state depends on the passage alone. Blocks k+1..l see the pair in XLNet's full layout. This is
the full model with a block-diagonal attention mask in blocks 1..k (tests/model/test_xlnet.py checks
it against a NumPy reader written that way).
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from dil_jax.model.attention import QKV, PassageAttentionStats, attention_bias, dense
from dil_jax.model.encoder_config import ConfigError, EncoderConfig
from dil_jax.model.layers import activation_fn, layer_norm, pair_rows
from dil_jax.model.span_reader import (
    QUESTION_SEGMENT,
    ReaderOutput,
    pair_qkv,
    read_aligned_pairs,
    span_output,
)

# XLNet's segment ids (original run_squad.py): passage 0, question 1, [CLS] 2.
XLNET_PASSAGE_ID, XLNET_QUESTION_ID, XLNET_CLS_ID = 0, 1, 2


class XLNetUnsupportedError(ConfigError):
    """A reuse or option that XLNet's relative attention does not support here, by name."""


def question_layout(mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Positions and XLNet segment ids of question segments stored as `[CLS] q [SEP]`.

    mask: [batch, q_len] (1 = token) -> (positions [batch, q_len] int32, segment ids [batch,
    q_len] int32). XLNet's order is `q [SEP] [CLS]`: token t >= 1 sits at t - 1, `[CLS]` (row 0)
    last, at n - 1 (n = real length). Padding rows get position 0 (masked as keys; their rows
    are never read).
    """
    rows = jnp.arange(mask.shape[1], dtype=jnp.int32)[None, :]
    length = jnp.sum(mask, axis=1, dtype=jnp.int32)[:, None]
    positions = jnp.where(rows == 0, length - 1, rows - 1)
    positions = jnp.where(mask > 0, positions, 0)
    segments = jnp.where(rows == 0, XLNET_CLS_ID, XLNET_QUESTION_ID)
    return positions, jnp.broadcast_to(segments, mask.shape).astype(jnp.int32)


def passage_layout(mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Positions (0..p_len-1) and XLNet segment ids (0) of passage segments `p [SEP]`.

    mask: [batch, p_len] -> ([batch, p_len], [batch, p_len]) int32."""
    positions = jnp.broadcast_to(jnp.arange(mask.shape[1], dtype=jnp.int32), mask.shape)
    return positions, jnp.full(mask.shape, XLNET_PASSAGE_ID, jnp.int32)


def segment_layout(mask: jax.Array, segment: int) -> tuple[jax.Array, jax.Array]:
    """`question_layout` or `passage_layout` by our segment (QUESTION_SEGMENT / PASSAGE_SEGMENT)."""
    return question_layout(mask) if segment == QUESTION_SEGMENT else passage_layout(mask)


def pair_layout(q_mask: jax.Array, p_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Positions and segment ids of `[question ; passage]` pairs in XLNet's order.

    q_mask: [batch, q_len], p_mask: [batch, p_len] -> ([batch, q_len + p_len] positions,
    [batch, q_len + p_len] segment ids): the passage's P real tokens at 0..P-1, the question's
    tokens after them (P + t - 1 for row t >= 1), `[CLS]` last (P + n_q - 1): exactly the
    positions of `P [SEP] Q [SEP] [CLS]`.
    """
    q_positions, q_segments = question_layout(q_mask)
    p_positions, p_segments = passage_layout(p_mask)
    passage_len = jnp.sum(p_mask, axis=1, dtype=jnp.int32)[:, None]
    q_positions = jnp.where(q_mask > 0, q_positions + passage_len, 0)
    return (jnp.concatenate([q_positions, p_positions], axis=1),
            jnp.concatenate([q_segments, p_segments], axis=1))


def xlnet_input_order(q_ids: Sequence[int], p_ids: Sequence[int]
                      ) -> tuple[list[int], list[int]]:
    """One pair's unpadded segments (`[CLS] q [SEP]`, `p [SEP]`) as XLNet's own input
    `P [SEP] Q [SEP] [CLS]`: (token ids, segment ids 0 / 1 / 2), what Hugging Face's XLNet
    models and tokenizer take (for peers and checks; the reader itself never reorders)."""
    q_ids, p_ids = [int(i) for i in q_ids], [int(i) for i in p_ids]
    ids = p_ids + q_ids[1:] + q_ids[:1]
    segments = ([XLNET_PASSAGE_ID] * len(p_ids) + [XLNET_QUESTION_ID] * (len(q_ids) - 1)
                + [XLNET_CLS_ID])
    return ids, segments


def relative_position_table(seq_len: int, hidden: int) -> jax.Array:
    """Sinusoids of the relative distances -(seq_len-1)..seq_len-1 -> [2 seq_len - 1, hidden].

    Row d + seq_len - 1 holds [sin(d f), cos(d f)] with f_m = 1 / 10000^(2m / hidden), as
    transformers' `XLNetModel.relative_positional_encoding` (float32, like its torch code).
    """
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, hidden, 2.0, dtype=np.float32) / hidden))
    distances = np.arange(-(seq_len - 1), seq_len, dtype=np.float32)
    angles = jnp.asarray(distances)[:, None] * jnp.asarray(inv_freq, jnp.float32)[None, :]
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


class RelativeAttention(nn.Module):
    """XLNet's relative positional self-attention (content stream) + residual + LayerNorm.

    Params keep Hugging Face's layouts: query/key/value/output/position kernels [hidden, heads,
    head_dim] (no biases), content_bias (r_w_bias), position_bias (r_r_bias), segment_bias
    (r_s_bias) [heads, head_dim], segment_embedding (seg_embed) [2, heads, head_dim]: row 0
    "same segment", row 1 "different".
    """

    config: EncoderConfig

    def setup(self) -> None:
        cfg = self.config
        init = nn.initializers.normal(cfg.initializer_range)
        shape = (cfg.hidden_size, cfg.num_heads, cfg.head_dim)
        for name in ("query", "key", "value", "output", "position"):
            setattr(self, name, self.param(name, init, shape, jnp.float32))
        for name in ("content_bias", "position_bias", "segment_bias"):
            setattr(self, name, self.param(name, init, (cfg.num_heads, cfg.head_dim),
                                           jnp.float32))
        self.segment_embedding = self.param("segment_embedding", init,
                                            (2, cfg.num_heads, cfg.head_dim), jnp.float32)
        self.norm = layer_norm(cfg)
        self.dropout = nn.Dropout(cfg.attention_dropout)

    def _heads(self, x: jax.Array, kernel: jax.Array) -> jax.Array:
        """x: [batch, seq, hidden] -> [batch, heads, seq, head_dim] (compute dtype)."""
        dtype = self.config.compute_dtype
        return jnp.einsum("bsh,hnd->bnsd", x.astype(dtype), kernel.astype(dtype))

    def project(self, x: jax.Array) -> QKV:
        """Content query, key, value of x: [batch, seq, hidden] -> 3 x [batch, heads, seq,
        head_dim] (the query NOT scaled: the position and segment terms share its bias-added
        forms). A token's projections depend on that token alone."""
        return self._heads(x, self.query), self._heads(x, self.key), self._heads(x, self.value)

    def __call__(self, x: jax.Array, mask: jax.Array, positions: jax.Array, segments: jax.Array,
                 position_table: jax.Array, deterministic: bool = True,
                 qkv: QKV | None = None, rows: tuple[int, int] | None = None) -> jax.Array:
        """x: [batch, seq, hidden]; mask, positions, segments: [batch, seq]; position_table:
        [2 seq - 1, hidden] (`relative_position_table(seq)`) -> [batch, seq, hidden].

        rows: None, or (question_len, question_rows) of a `[question ; passage]` pair: only the
        first question_rows question rows and every passage row are computed (queries, scores,
        output), every token still a key and value -> [batch, question_rows + p_len, hidden].
        """
        cfg = self.config
        seq = x.shape[1]
        row_positions, row_segments = positions, segments
        if rows is not None:
            question_len, question_rows = rows
            row_positions = pair_rows(positions, question_len, question_rows, axis=1)
            row_segments = pair_rows(segments, question_len, question_rows, axis=1)
        if qkv is None:
            x_rows = x if rows is None else pair_rows(x, *rows, axis=1)
            query = self._heads(x_rows, self.query)
            key, value = self._heads(x, self.key), self._heads(x, self.value)
        else:
            query, key, value = qkv
            x_rows = x
            if rows is not None:
                x_rows = pair_rows(x, *rows, axis=1)
                query = pair_rows(query, *rows, axis=2)
        f32 = jnp.float32

        def biased(bias: jax.Array) -> jax.Array:
            return query + bias[None, :, None, :].astype(query.dtype)

        content = jnp.einsum("bnid,bnjd->bnij", biased(self.content_bias), key,
                             preferred_element_type=f32)
        position_keys = jnp.einsum("rh,hnd->nrd", position_table.astype(cfg.compute_dtype),
                                   self.position.astype(cfg.compute_dtype))
        by_distance = jnp.einsum("bnid,nrd->bnir", biased(self.position_bias), position_keys,
                                 preferred_element_type=f32)  # [batch, heads, seq, 2 seq - 1]
        distance = row_positions[:, :, None] - positions[:, None, :] + (seq - 1)  # [b, i, j]
        position = jnp.take_along_axis(by_distance, distance[:, None], axis=-1)
        by_segment = jnp.einsum("bnid,snd->bnis", biased(self.segment_bias),
                                self.segment_embedding.astype(cfg.compute_dtype),
                                preferred_element_type=f32)  # [batch, heads, seq, 2]
        different = (row_segments[:, :, None] != segments[:, None, :])[:, None]
        segment = jnp.where(different, by_segment[..., 1:], by_segment[..., :1])
        scores = (content + position + segment) * (1.0 / float(np.sqrt(cfg.head_dim)))
        scores = scores + attention_bias(mask)
        weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
        probs = self.dropout(weights / jnp.sum(weights, axis=-1, keepdims=True),
                             deterministic=deterministic)
        context = jnp.einsum("bnij,bnjd->bnid", probs.astype(cfg.compute_dtype), value)
        out = jnp.einsum("bnid,hnd->bih", context, self.output.astype(cfg.compute_dtype))
        return self.norm(x_rows + self.dropout(out, deterministic=deterministic))


class XLNetBlock(nn.Module):
    """Relative attention (+ residual, LayerNorm), then XLNet's feed-forward (+ residual,
    LayerNorm): Hugging Face's `XLNetLayer` without the query stream."""

    config: EncoderConfig

    def setup(self) -> None:
        cfg = self.config
        self.attention = RelativeAttention(cfg)
        self.ffn_in = dense(cfg, cfg.intermediate_size)
        self.ffn_out = dense(cfg, cfg.hidden_size)
        self.output_norm = layer_norm(cfg)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def __call__(self, x: jax.Array, mask: jax.Array, positions: jax.Array, segments: jax.Array,
                 position_table: jax.Array, deterministic: bool = True,
                 qkv: QKV | None = None, rows: tuple[int, int] | None = None) -> jax.Array:
        """x: [batch, seq, hidden] -> [batch, seq (or the rows), hidden] (arguments as
        RelativeAttention; the feed-forward is row by row)."""
        x = self.attention(x, mask, positions, segments, position_table, deterministic, qkv,
                           rows)
        hidden = self.dropout(activation_fn(self.config.hidden_act)(self.ffn_in(x)),
                              deterministic=deterministic)
        out = self.dropout(self.ffn_out(hidden), deterministic=deterministic)
        return self.output_norm(x + out)


class XLNetEmbeddings(nn.Module):
    """Word embeddings and dropout: XLNet has no position, token-type table or LayerNorm here."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, ids: jax.Array, deterministic: bool = True) -> jax.Array:
        """ids: [batch, seq] -> [batch, seq, hidden]."""
        cfg = self.config
        x = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=cfg.compute_dtype,
                     param_dtype=jnp.float32,
                     embedding_init=nn.initializers.normal(cfg.initializer_range),
                     name="word_embeddings")(ids)
        return nn.Dropout(cfg.hidden_dropout)(x, deterministic=deterministic)


class XLNetSpanReaderModule(nn.Module):
    """XLNet reader with the API of `SpanReaderModule` (see the module docstring)."""

    config: EncoderConfig

    def setup(self) -> None:
        cfg = self.config
        self.embeddings = XLNetEmbeddings(cfg)
        self.blocks = [XLNetBlock(cfg, name=f"block_{i}") for i in range(cfg.num_layers)]
        self.qa_outputs = dense(cfg, 2, "qa_outputs")
        self.position_dropout = nn.Dropout(cfg.hidden_dropout)
        # transformers drops out XLNetModel's output before the span head (training only).
        self.output_dropout = nn.Dropout(cfg.hidden_dropout)

    def _run_layers(self, x: jax.Array, mask: jax.Array, positions: jax.Array,
                    segments: jax.Array, layers: Sequence[int], deterministic: bool,
                    first_qkv: QKV | None = None, last_rows: tuple[int, int] | None = None
                    ) -> list[jax.Array]:
        """Blocks `layers` over x: [batch, seq, hidden] -> each block's output. The relative
        position table is built once per call (and dropped out once, as transformers does).
        last_rows: (question_len, question_rows) computed by the last block (see
        RelativeAttention), None for every row."""
        table = self.position_dropout(relative_position_table(x.shape[1], self.config.hidden_size),
                                      deterministic=deterministic)
        states = []
        for i, layer in enumerate(layers):
            rows = last_rows if i == len(layers) - 1 else None
            x = self.blocks[layer](x, mask, positions, segments, table, deterministic,
                                   first_qkv if i == 0 else None, rows)
            states.append(x)
        return states

    def encode_lower(self, ids: jax.Array, mask: jax.Array, segment: int,
                     position_offset: jax.Array | None = None, deterministic: bool = True,
                     output_hidden_states: bool = False):
        """Word embeddings + the first k blocks on one segment alone.

        ids, mask: [batch, seq] of `[CLS] q [SEP]` (QUESTION_SEGMENT) or `p [SEP]`
        (PASSAGE_SEGMENT). position_offset is accepted for the common API and has no effect:
        XLNet's attention reads positions only through differences within the call, and an
        offset of a whole segment cancels in them. -> [batch, seq, hidden] (and the k+1 states).
        """
        del position_offset
        positions, segments = segment_layout(mask, segment)
        x = self.embeddings(ids, deterministic)
        states = [x] + self._run_layers(x, mask, positions, segments,
                                        range(self.config.num_lower_layers), deterministic)
        if output_hidden_states:
            return states[-1], tuple(states)
        return states[-1]

    def project_upper(self, lower: jax.Array) -> QKV:
        """The first upper block's content query/key/value of one segment's lower states:
        [batch, seq, hidden] -> 3 x [batch, heads, seq, head_dim] (query unscaled; only
        `encode_upper` of this module reads them)."""
        return self.blocks[self.config.num_lower_layers].attention.project(lower)

    def encode_upper(self, q_lower: jax.Array, q_mask: jax.Array, p_lower: jax.Array,
                     p_mask: jax.Array, deterministic: bool = True,
                     output_hidden_states: bool = False) -> ReaderOutput:
        """Blocks k+1..l over `[question ; passage]` in XLNet's positions, and the span head.

        q_lower: [batch, q_len, hidden], q_mask: [batch, q_len], p_lower: [batch, p_len,
        hidden], p_mask: [batch, p_len] -> ReaderOutput.
        """
        return self._upper(q_lower, q_mask, p_lower, p_mask, deterministic, output_hidden_states,
                           None, False)

    def read_upper(self, q_lower: jax.Array, q_mask: jax.Array, p_lower: jax.Array,
                   p_mask: jax.Array, q_qkv: QKV | None = None, p_qkv: QKV | None = None,
                   p_stats: PassageAttentionStats | None = None,
                   span_rows_only: bool = False) -> ReaderOutput:
        """`encode_upper` at inference (deterministic, no hidden states) with the pair
        program's exact reuses. q_qkv / p_qkv: `project_upper` of either side, if computed
        already. span_rows_only: the last block computes only `[CLS]` (row 0) and the passage
        rows, all the span head reads. p_stats is refused: a passage's softmax statistics over
        its own keys would need XLNet's position and segment terms.
        """
        if p_stats is not None:
            raise XLNetUnsupportedError("p_stats (passage attention statistics) are not "
                                        "implemented for architecture 'xlnet'")
        return self._upper(q_lower, q_mask, p_lower, p_mask, True, False,
                           pair_qkv(self, q_lower, p_lower, q_qkv, p_qkv), span_rows_only)

    def _upper(self, q_lower: jax.Array, q_mask: jax.Array, p_lower: jax.Array,
               p_mask: jax.Array, deterministic: bool, output_hidden_states: bool,
               first_qkv: QKV | None, span_rows_only: bool) -> ReaderOutput:
        """The upper blocks and the span head; first_qkv: the pair's first-upper-block q/k/v
        if precomputed; span_rows_only: the last block computes `[CLS]` and the passage only."""
        x = jnp.concatenate([q_lower, p_lower], axis=1)
        mask = jnp.concatenate([q_mask, p_mask], axis=1)
        positions, segments = pair_layout(q_mask, p_mask)
        layers = range(self.config.num_lower_layers, self.config.num_layers)
        q_len = q_lower.shape[1]
        states = self._run_layers(x, mask, positions, segments, layers, deterministic,
                                  first_qkv, (q_len, 1) if span_rows_only else None)
        final = states[-1] if states else x
        logits = self.qa_outputs(self.output_dropout(final, deterministic=deterministic))
        logits = logits.astype(jnp.float32)  # [batch, rows, 2]
        return span_output(logits, p_mask, tuple(states) if output_hidden_states else None)

    def __call__(self, q_ids: jax.Array, q_mask: jax.Array, p_ids: jax.Array, p_mask: jax.Array,
                 deterministic: bool = True, output_hidden_states: bool = False) -> ReaderOutput:
        """The whole reader on aligned pairs; q_ids, q_mask: [batch, q_len]; p_ids, p_mask:
        [batch, p_len]. The same for every k but the block-diagonal lower blocks."""
        return read_aligned_pairs(self, q_ids, q_mask, p_ids, p_mask, None, deterministic,
                                  output_hidden_states)
