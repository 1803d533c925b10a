"""A synthetic corpus of any size with realistic term statistics, for measuring retrieval and
caching at scale on a machine that holds no large corpus.

Each passage is a run of sentences drawn at random (with replacement, seeded) from a pool of
real sentences (the shared SQuAD paragraphs and Wikipedia leads), added until the passage holds
at least `min_words` words (100 by default: the DPR split of Wikipedia into 100-word passages).
Word frequencies, sentence lengths and passage lengths are thus those of real text; what the
resampling cannot give is the vocabulary's growth with the corpus (a million passages reuse the
pool's terms, where Wikipedia would add rare ones), so idf values are flatter than Wikipedia's
at the same size and posting lists of rare terms longer: query times here are, if anything,
pessimistic.

    passages = resampled_passages(sentence_pool(documents), 1_000_000, seed=0)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from dil_jax.open_domain.index.corpus import Document
from dil_jax.prescreening.sentences import split_sentences

DPR_PASSAGE_WORDS = 100


def sentence_pool(documents: Sequence[Document], min_words: int = 4) -> list[str]:
    """Every sentence of `documents` with at least `min_words` words (drops headings and
    fragments), in order."""
    pool = []
    for document in documents:
        for start, end in split_sentences(document.text):
            sentence = document.text[start:end]
            if len(sentence.split()) >= min_words:
                pool.append(sentence)
    return pool


def resampled_passages(pool: Sequence[str], count: int, seed: int = 0,
                       min_words: int = DPR_PASSAGE_WORDS) -> Iterator[str]:
    """`count` passages of sentences drawn from `pool` until each holds >= `min_words` words;
    the same (pool, count, seed) gives the same passages."""
    if not pool:
        raise ValueError("the sentence pool is empty")
    rng = np.random.default_rng(seed)
    words = np.asarray([len(sentence.split()) for sentence in pool])
    # Sentences are drawn in blocks: one rng call per block, not per sentence.
    block = rng.integers(0, len(pool), size=1 << 16)
    position = 0
    for _ in range(count):
        chosen, total = [], 0
        while total < min_words:
            if position == len(block):
                block, position = rng.integers(0, len(pool), size=1 << 16), 0
            sentence = int(block[position])
            position += 1
            chosen.append(pool[sentence])
            total += int(words[sentence])
        yield " ".join(chosen)
