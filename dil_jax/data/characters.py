"""Each token's characters for featurized SQuAD examples: what QANet and BiDAF read beside the ids.

Characters come from the texts through the tokenizer's character offsets, as
`model.qanet_inputs.qanet_segment` reads them (case and accents kept, which the lower-cased
WordPiece strings lose): the questions are encoded again with their offsets (the featurizer keeps
only the passages'; the ids are checked equal), each distinct passage window once. Stored as
uint16 (ids < 512), `MAX_CHARS` (16, the paper's) slots per token. Used by training
(`train.char_data`) and by prediction (`predict`) alike, so both read the same characters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from dil_jax.data.features import Features, FeaturizationError
from dil_jax.data.squad import SquadExample
from dil_jax.model.qanet_inputs import MAX_CHARS, token_characters

CHAR_DTYPE = np.uint16  # character ids are < CHAR_VOCAB_SIZE = 512


@dataclasses.dataclass(frozen=True)
class SquadCharacters:
    """The characters of featurized SQuAD examples (uint16 `CHAR_DTYPE`).

    q_chars: [n_questions, Lq, MAX_CHARS], each question token's;
    p_chars: [n_passages, Lp, MAX_CHARS], each distinct passage window's tokens' (windows with
      equal `window_passage_index` hold the same tokens: stored once);
    p_source: [n_windows] int, each window's row of p_chars.
    """

    q_chars: np.ndarray
    p_chars: np.ndarray
    p_source: np.ndarray


def squad_characters(examples: Sequence[SquadExample], features: Features, tokenizer
                     ) -> SquadCharacters:
    """The characters of featurized SQuAD examples, from the texts and the tokens' offsets."""
    from dil_jax.tokenization import encode_questions

    texts = [example.question for example in examples]
    questions = encode_questions(tokenizer, texts, features.q_ids.shape[1])
    if not np.array_equal(questions.ids, features.q_ids):
        raise FeaturizationError("the questions encoded with offsets differ from the features' "
                                 "q_ids (another tokenizer or question length?)")
    q_chars = token_characters(texts, questions.offsets, questions.mask, MAX_CHARS)
    # One row per distinct passage window (equal window_passage_index = equal tokens).
    _, first, p_source = np.unique(features.window_passage_index, return_index=True,
                                   return_inverse=True)
    contexts = [examples[i].context for i in features.example_index[first]]
    p_chars = token_characters(contexts, features.offsets[first], features.p_mask[first],
                               MAX_CHARS)
    return SquadCharacters(q_chars.astype(CHAR_DTYPE), p_chars.astype(CHAR_DTYPE),
                           p_source.reshape(-1))
