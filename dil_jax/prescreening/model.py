"""The prescreening model ("Prototype 4" of Sentence Encoding Prescreening for Q&A).

The question embedding and the passage's sentence embeddings form one sequence
`[q, s_1, ..., s_S]`; a small transformer encoder (self-attention over the combined input,
pre-LayerNorm blocks) mixes them, a dense layer gives one score per sentence, and a softmax over
the passage's sentences says which one holds the answer. Sentence order matters (a first-sentence
guess is right a third of the time), so each input also gets a learned position embedding
(position 0 = the question).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

NEG_INF = -1e9


@dataclasses.dataclass(frozen=True)
class PrescreenConfig:
    embedding_dim: int = 384      # input sentence-embedding width
    width: int = 128              # transformer width
    num_layers: int = 4
    num_heads: int = 4
    mlp_dim: int = 256
    max_sentences: int = 32
    dropout: float = 0.1
    # Each sentence's input also holds its elementwise product with the question (projected),
    # and its score adds the question-sentence cosine times a learned scale. Why: the sentence
    # encoder is trained so that this cosine is high for an answer sentence (argmax alone: 74.5%
    # top-1 on the dev articles), but after the projection to `width` the model had to relearn it
    # and barely beat it. False: the model of the first bundled prescreener (no such params).
    interaction: bool = False
    # Each sentence's input also holds its IDF-weighted word overlap with the question
    # (dil_jax.prescreening.overlap), projected, and its score adds that overlap times a
    # learned scale. Why: the sentence embeddings lose which words a sentence holds, and
    # SQuAD's questions reuse their sentence's rarer words (docs/prescreening.md, "Sentence
    # accuracy"). False: no such input or params (the prescreeners saved before it).
    overlap: bool = False


class _Block(nn.Module):
    config: PrescreenConfig

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool) -> jax.Array:
        """x: [batch, 1 + S, width]; mask: [batch, 1 + S]."""
        cfg = self.config
        attention_mask = nn.make_attention_mask(mask, mask)
        h = nn.LayerNorm()(x)
        h = nn.MultiHeadDotProductAttention(num_heads=cfg.num_heads, dropout_rate=cfg.dropout,
                                            deterministic=deterministic)(h, h, mask=attention_mask)
        x = x + nn.Dropout(cfg.dropout)(h, deterministic=deterministic)
        h = nn.Dense(cfg.mlp_dim)(nn.LayerNorm()(x))
        h = nn.Dense(cfg.width)(nn.gelu(h))
        return x + nn.Dropout(cfg.dropout)(h, deterministic=deterministic)


class Prescreener(nn.Module):
    config: PrescreenConfig

    @nn.compact
    def __call__(self, question: jax.Array, sentences: jax.Array, sentence_mask: jax.Array,
                 overlap: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
        """question: [batch, D]; sentences: [batch, S, D]; sentence_mask: [batch, S];
        overlap: [batch, S] (`overlap_scores`; required with `config.overlap`, else unused)
        -> [batch, S] sentence logits (NEG_INF where masked)."""
        cfg = self.config
        if cfg.overlap and overlap is None:
            raise ValueError("this prescreener reads each sentence's word overlap with the "
                             "question: give `overlap` [batch, S]")
        x = jnp.concatenate([question[:, None, :], sentences], axis=1)
        mask = jnp.concatenate([jnp.ones_like(sentence_mask[:, :1]), sentence_mask], axis=1)
        x = nn.Dense(cfg.width)(x)
        # The new modules are named: flax's automatic names (Dense_1, ...) of the others, hence
        # the params of prescreeners saved without them, stay as they were.
        product = question[:, None, :] * sentences  # [batch, S, D]
        if cfg.interaction:
            x = x.at[:, 1:].add(nn.Dense(cfg.width, name="interaction")(product))
        if cfg.overlap:
            # / 10: overlaps run 0-30; the projection's input then has the embeddings' scale.
            x = x.at[:, 1:].add(nn.Dense(cfg.width, name="overlap")(overlap[..., None] / 10.0))
        positions = jnp.arange(x.shape[1])
        x = x + nn.Embed(cfg.max_sentences + 1, cfg.width)(positions)[None]
        for _ in range(cfg.num_layers):
            x = _Block(cfg)(x, mask, deterministic)
        scores = nn.Dense(1)(nn.LayerNorm()(x[:, 1:]))[..., 0]
        if cfg.interaction:
            # Unit vectors: the product's sum is the cosine. 10 makes a typical gap between
            # sentences (0.1-0.3) a logit gap of 1-3 from the start.
            scale = self.param("similarity_scale", nn.initializers.constant(10.0), ())
            scores = scores + scale * product.sum(axis=-1)
        if cfg.overlap:
            # Overlaps run 0-30 (a rare piece weighs ~7): 0.2 makes a typical gap between the
            # best sentence and the next (2-5) a logit gap of about 1 from the start.
            weight = self.param("overlap_scale", nn.initializers.constant(0.2), ())
            scores = scores + weight * overlap
        return jnp.where(sentence_mask > 0, scores, NEG_INF)
