"""The grid a benchmark reads: q questions x p passages of random tokens, every pair read.

A grid is read in three phases, each timed apart (`PHASES`):

  NI Q   question lower blocks: `encode_lower` over the q questions (k blocks each), then the
         first upper block's q/k/v projections of each question (`project_upper`);
  NI P   passage lower blocks and projections, the same over the p passages, and (with the
         pair program's reuses, 0 < k < l) each passage's first-upper-block attention
         statistics over its own keys (`PairGrid.passage_attention_stats`);
  I Q-P  pair upper blocks: `encode_upper` (blocks k+1..l, the first without its projections,
         and the span head) over the q*p pairs, streamed through `PairGrid` in fixed-size
         chunks; with the reuses (the default) the first upper block's passage rows score only
         the question's keys and the last block computes only `[CLS]` and the passage rows.

The variants that read it (`variant_name`): the full model, k = 0 (its NI Q is the question
embeddings only, it has no NI P: a passage's positions follow the question, so nothing is
question-independent, and I Q-P runs all l blocks on every pair), each split k, and the Hugging
Face PyTorch peer (`HF_PEER`, every pair as `[CLS] q [SEP] p [SEP]`). Token ids are random: the
cost of a dense transformer does not depend on which tokens it reads.

QANet and BiDAF (`char_suites`) have one fixed split and two variants: `WHOLE`, every pair
through the whole reader (both segments encoded per pair, as QANet normally runs: all its time is
I Q-P), and `DELAYED`, `CharPairGrid` (NI Q: the questions' `encode_lower`; NI P: the passages',
what a cache holds; I Q-P: `encode_upper` per pair). Their grids carry each token's characters
too (`random_char_grid`), random as the ids: the character CNN reads a fixed number of slots.
"""

from __future__ import annotations

import dataclasses

import numpy as np

PHASES = ("ni_q", "ni_p", "pairs")  # keys of every pass's times and of the programs
PHASE_TITLES = {"ni_q": "NI Q", "ni_p": "NI P", "pairs": "I Q-P"}  # the paper's names
# Names of the variants, the keys of a suite's runs and results.
FULL = "full (k=0)"
HF_PEER = "HF PyTorch"
WHOLE = "whole"  # QANet / BiDAF: every pair through the whole reader
DELAYED = "delayed"  # QANet / BiDAF: CharPairGrid, segments encoded once
CLS_ID, SEP_ID = 101, 102  # BERT uncased vocabulary; any ids < vocab_size would time the same
FIRST_WORD_ID = 1000  # random "words" are drawn from [FIRST_WORD_ID, vocab_size)
# Random characters are drawn from [FIRST_CHAR_ID, CHAR_VOCAB_SIZE): `qanet_inputs.char_id`'s
# ids of real characters (0..3 pad a token, mark a special token or an empty span).
FIRST_CHAR_ID = 4


def variant_name(k: int) -> str:
    """The record's name of our reader at split k (k = 0 is the full model)."""
    return FULL if k == 0 else f"k={k}"


@dataclasses.dataclass(frozen=True)
class GridSpec:
    """A grid of `num_questions` x `num_passages` pairs and its padded segment lengths.

    question_len counts `[CLS] q [SEP]`, passage_len counts `p [SEP]`; a pair is
    question_len + passage_len tokens, the same total the full model and the peer read.
    """

    num_questions: int
    num_passages: int
    question_len: int = 64
    passage_len: int = 256

    @property
    def num_pairs(self) -> int:
        return self.num_questions * self.num_passages

    @property
    def pair_len(self) -> int:
        return self.question_len + self.passage_len


@dataclasses.dataclass
class GridInputs:
    """Token ids and masks (numpy int32) of a grid's segments.

    q_ids, q_mask: [num_questions, question_len]; p_ids, p_mask: [num_passages, passage_len].
    """

    q_ids: np.ndarray
    q_mask: np.ndarray
    p_ids: np.ndarray
    p_mask: np.ndarray


def random_grid(spec: GridSpec, vocab_size: int, seed: int = 0) -> GridInputs:
    """Random words, no padding: `[CLS] w.. [SEP]` questions and `w.. [SEP]` passages.

    Every position is a real token, so `[CLS] q [SEP] p [SEP]` of the peer and our full model
    see exactly the same positions and token types (padding would sit between the segments).
    """
    rng = np.random.default_rng(seed)
    low = min(FIRST_WORD_ID, vocab_size // 2)

    def words(n: int, length: int) -> np.ndarray:
        return rng.integers(low, vocab_size, size=(n, length), dtype=np.int32)

    q_ids = words(spec.num_questions, spec.question_len)
    q_ids[:, 0], q_ids[:, -1] = CLS_ID, SEP_ID
    p_ids = words(spec.num_passages, spec.passage_len)
    p_ids[:, -1] = SEP_ID
    return GridInputs(q_ids, np.ones_like(q_ids), p_ids, np.ones_like(p_ids))


@dataclasses.dataclass
class CharGridInputs(GridInputs):
    """A grid as QANet / BiDAF read it: `GridInputs` plus each token's characters.

    q_chars: [num_questions, question_len, max_chars], p_chars: [num_passages, passage_len,
    max_chars], uint16 (`data.characters.CHAR_DTYPE`, as the trainer and predict keep them).
    """

    q_chars: np.ndarray
    p_chars: np.ndarray


def random_char_grid(spec: GridSpec, vocab_size: int, max_chars: int, seed: int = 0
                     ) -> CharGridInputs:
    """`random_grid`'s ids and masks, and random characters: each word 1 to `max_chars` real
    characters (ids of `qanet_inputs.char_id`'s range), `[CLS]` and `[SEP]` one CHAR_SPECIAL
    each, as `token_characters` gives special tokens. The character CNN reads all `max_chars`
    slots of every token whatever they hold, so the cost does not depend on them either."""
    from dil_jax.data.characters import CHAR_DTYPE
    from dil_jax.model.qanet_inputs import CHAR_PAD, CHAR_SPECIAL, CHAR_VOCAB_SIZE

    grid = random_grid(spec, vocab_size, seed)
    rng = np.random.default_rng([seed, 1])

    def characters(ids: np.ndarray) -> np.ndarray:
        chars = rng.integers(FIRST_CHAR_ID, CHAR_VOCAB_SIZE, size=(*ids.shape, max_chars))
        counts = rng.integers(1, max_chars + 1, size=(*ids.shape, 1))
        chars = np.where(np.arange(max_chars) < counts, chars, CHAR_PAD)
        special = (ids == CLS_ID) | (ids == SEP_ID)
        chars[special] = CHAR_PAD
        chars[special, 0] = CHAR_SPECIAL
        return chars.astype(CHAR_DTYPE)

    return CharGridInputs(grid.q_ids, grid.q_mask, grid.p_ids, grid.p_mask,
                          characters(grid.q_ids), characters(grid.p_ids))
