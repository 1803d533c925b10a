"""QANet's inputs: the segments' characters, the frozen word table, the segment struct.

    QANetSegment        one segment's arrays (token ids, characters, mask) as the model reads them
    char_id, token_characters
                        each token's characters from its character offsets into its own text
    fit_chars           a token's character slots cut or padded to the model's max_chars
    qanet_segment       `tokenization.Segments` + the texts -> QANetSegment
    minilm_word_table   the embedded MiniLM's pre-trained WordPiece input embedding table

QANet (Yu et al. 2018) embeds a word by a pre-trained word vector (GloVe there) and a character
CNN. GloVe cannot be fetched here, so the words are the tokens of the tokenizer every reader of
this repo uses (the embedded MiniLM's WordPiece) and their vectors are MiniLM's input embedding
table, frozen; the segments are the repo's own (`[CLS] q [SEP]`, `p [SEP]`, the same ids, masks
and character offsets), so answers map through the same offsets as every other reader.

A token's characters are read from its text through its offsets, not from the WordPiece string:
the vocabulary is lower-cased and marks word pieces with "##", the text keeps the case and the
piece's own characters. Characters get ids without a vocabulary file (`char_id`): code points
below 256 their own id, the rest hashed into a fixed range, so the table never depends on data.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

# Character ids. 0 pads a token's character slots (and fills padding tokens); a special token
# ([CLS], [SEP]: no offsets) is one CHAR_SPECIAL; a real token with an empty span one CHAR_EMPTY.
CHAR_PAD, CHAR_SPECIAL, CHAR_EMPTY = 0, 1, 2
_LATIN1_FIRST = 4  # code points 0..255 -> 4..259
_HASHED_FIRST = _LATIN1_FIRST + 256
_HASHED_ROWS = 252  # code points >= 256 -> 260..511 by code point modulo 252
CHAR_VOCAB_SIZE = _HASHED_FIRST + _HASHED_ROWS  # 512
# The paper truncates or pads every word to 16 characters.
MAX_CHARS = 16
# The weights inside the embedded MiniLM's model.safetensors read as QANet's word vectors.
WORD_TABLE_TENSOR = "embeddings.word_embeddings.weight"


@flax.struct.dataclass
class QANetSegment:
    """One segment (questions or passages) as QANet reads it.

    Attributes:
      ids: [batch, seq] int32 token ids (rows of the frozen word table).
      chars: [batch, seq, max_chars] int32 character ids (`char_id`; CHAR_PAD after the last).
      mask: [batch, seq] int32, 1 for tokens, 0 for padding.
    """

    ids: jax.Array
    chars: jax.Array
    mask: jax.Array


def char_id(character: str) -> int:
    """The id of one character: Latin-1 code points their own row, the others hashed."""
    point = ord(character)
    if point < 256:
        return _LATIN1_FIRST + point
    return _HASHED_FIRST + point % _HASHED_ROWS


def token_characters(texts: Sequence[str], offsets: np.ndarray, mask: np.ndarray,
                     max_chars: int = MAX_CHARS) -> np.ndarray:
    """Each token's character ids from its [start, end) offsets into its own text.

    texts: one per row; offsets: [batch, seq, 2] int (`tokenization.NO_OFFSET` = -1 for special
    tokens and padding); mask: [batch, seq] -> [batch, seq, max_chars] int32. Tokens longer than
    max_chars keep their first max_chars characters (the paper's truncation).
    """
    offsets = np.asarray(offsets)
    mask = np.asarray(mask)
    if offsets.shape[:2] != mask.shape or offsets.shape[2:] != (2,):
        raise ValueError(f"offsets {offsets.shape} must be [batch, seq, 2] over mask "
                         f"{mask.shape}")
    if len(texts) != mask.shape[0]:
        raise ValueError(f"{len(texts)} texts for a batch of {mask.shape[0]}")
    chars = np.zeros(mask.shape + (max_chars,), np.int32)
    for row, text in enumerate(texts):
        for col in np.flatnonzero(mask[row]):
            start, end = (int(v) for v in offsets[row, col])
            if start < 0:
                chars[row, col, 0] = CHAR_SPECIAL
                continue
            piece = text[start:min(end, start + max_chars)]
            if not piece:
                chars[row, col, 0] = CHAR_EMPTY
                continue
            chars[row, col, :len(piece)] = [char_id(c) for c in piece]
    return chars


def fit_chars(chars: jax.Array | np.ndarray, max_chars: int) -> jax.Array:
    """[..., slots] character ids -> [..., max_chars] int32: the first max_chars of each token's
    (the paper's truncation), or CHAR_PAD (0) slots added after them. Any integer dtype in (the
    host keeps characters as uint16, half the bytes to move)."""
    slots = chars.shape[-1]
    chars = jnp.asarray(chars)[..., :max_chars].astype(jnp.int32)
    if slots < max_chars:
        chars = jnp.pad(chars, [(0, 0)] * (chars.ndim - 1) + [(0, max_chars - slots)])
    return chars


def qanet_segment(segments, texts: Sequence[str], max_chars: int = MAX_CHARS) -> QANetSegment:
    """`tokenization.Segments` (from `encode_questions` / `encode_passages`) of `texts` ->
    QANetSegment of numpy arrays: the same ids and mask, the tokens' characters added."""
    return QANetSegment(
        ids=np.asarray(segments.ids, np.int32),
        chars=token_characters(texts, segments.offsets, segments.mask, max_chars),
        mask=np.asarray(segments.mask, np.int32))


def minilm_word_table(folder: str | Path | None = None) -> np.ndarray:
    """The pre-trained WordPiece input embedding table, [vocab, width] float32 (all-MiniLM-L6-v2:
    [30522, 384]), read alone from `model.safetensors` of `folder` (default: the embedded MiniLM,
    `defaults.default_checkpoint_dir`)."""
    from safetensors import safe_open

    from dil_jax.defaults import default_checkpoint_dir

    path = Path(folder if folder is not None else default_checkpoint_dir()) / "model.safetensors"
    with safe_open(str(path), framework="numpy") as weights:
        names = list(weights.keys())
        name = next((n for n in names if n.endswith(WORD_TABLE_TENSOR)), None)
        if name is None:
            raise KeyError(f"{path}: no {WORD_TABLE_TENSOR} among {len(names)} tensors")
        return np.asarray(weights.get_tensor(name), np.float32)
