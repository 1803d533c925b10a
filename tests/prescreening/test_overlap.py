"""The word overlap the prescreener reads (dil_jax.prescreening.overlap), by hand."""

from __future__ import annotations

import numpy as np
import pytest

from dil_jax.prescreening.overlap import WordOverlap, fit_idf, overlap_scores, piece_sets


class WordTokenizer:
    """A stand-in for the encoder's tokenizer: lower-cased words, ids from a fixed vocabulary
    (specials never added: the overlap asks for none)."""

    VOCAB = ("[PAD]", "the", "river", "flows", "paris", "rome", "capital", "city", "is")

    def __len__(self) -> int:
        return len(self.VOCAB)

    def __call__(self, texts, add_special_tokens=True, verbose=True):
        assert add_special_tokens is False
        return {"input_ids": [[self.VOCAB.index(w) for w in text.lower().split()]
                              for text in texts]}


def test_idf_by_hand():
    """3 documents: "the" in all 3 -> log(4/4) = 0; "river" in 1 -> log(4/2); "rome" in none
    -> log(4/1); repeats in a document count once."""
    idf = fit_idf(WordTokenizer(), ["the river the river", "the city", "the capital"])
    vocab = WordTokenizer.VOCAB
    assert idf.dtype == np.float32 and idf.shape == (len(vocab),)
    assert idf[vocab.index("the")] == pytest.approx(0.0)
    assert idf[vocab.index("river")] == pytest.approx(np.log(2.0))
    assert idf[vocab.index("rome")] == pytest.approx(np.log(4.0))


def test_overlap_scores_sum_the_idf_of_shared_distinct_pieces():
    """Question {the, river, paris}; sentence 0 shares river and the (twice: once counted),
    sentence 1 only paris; a second question has no sentence. idf: the 0.5, river 2, paris 3."""
    idf = np.zeros(9, np.float32)
    idf[[1, 2, 4]] = [0.5, 2.0, 3.0]
    tokenizer = WordTokenizer()
    questions = piece_sets(tokenizer, ["the river paris", "rome"])
    sentences = [piece_sets(tokenizer, ["the river the river flows", "paris is"]), []]
    scores = overlap_scores(idf, questions, sentences, max_sentences=3)
    np.testing.assert_allclose(scores, [[2.5, 3.0, 0.0], [0.0, 0.0, 0.0]])
    from_texts = WordOverlap(tokenizer, idf)(["the river paris", "rome"],
                                             [["the river the river flows", "paris is"], []], 3)
    np.testing.assert_array_equal(from_texts, scores)
    # A passage's sentences past max_sentences are left out.
    assert WordOverlap(tokenizer, idf)(["paris"], [["paris", "paris"]], 1).tolist() == [[3.0]]
