"""Sentence prescreening: splitting by hand, embeddings vs Hugging Face, a model that learns."""

from __future__ import annotations

import numpy as np

from dil_jax.sep.model import PrescreenConfig
from dil_jax.sep.sentences import answer_sentence, split_sentences
from dil_jax.sep.train import SentenceData, sentence_scores, topk_accuracy, train_prescreener


def test_split_sentences_by_hand():
    text = ("Mr. Smith went to Washington D.C. in 1990. He met J. R. R. Tolkien there! "
            "Was it raining? \"Yes,\" said the U.S. officer. 3 days later it stopped.")
    spans = split_sentences(text)
    assert [text[a:b] for a, b in spans] == [
        "Mr. Smith went to Washington D.C. in 1990.",
        "He met J. R. R. Tolkien there!",
        "Was it raining?",
        "\"Yes,\" said the U.S. officer.",
        "3 days later it stopped.",
    ]
    assert split_sentences("") == []
    assert split_sentences("no stop at all") == [(0, 14)]
    assert answer_sentence(spans, text.index("Tolkien")) == 1
    assert answer_sentence(spans, text.index("3 days")) == 4
    assert answer_sentence(spans, 0) == 0


def test_sentence_embeddings_match_hf_mean_pooling(minilm_dir):
    """all-MiniLM-L6-v2's recipe computed independently with transformers + torch."""
    import torch
    from transformers import AutoModel

    from dil_jax.checkpoints import load_reader
    from dil_jax.sep.embed import sentence_embeddings

    model, params, tokenizer = load_reader(str(minilm_dir), None, 16)
    texts = ["The cat sat on the mat.", "Paris is the capital of France.", "Hi"]
    ours = sentence_embeddings(model, params, tokenizer, texts, max_len=16, batch_size=2)
    hf = AutoModel.from_pretrained(str(minilm_dir)).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        states = hf(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    reference = (states * mask).sum(1) / mask.sum(1)
    reference = torch.nn.functional.normalize(reference, dim=-1).numpy()
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    assert ours[0] @ ours[1] < 0.5 < ours[0] @ ours[0]


def _synthetic(n: int, seed: int) -> SentenceData:
    """The answer sentence is the one most aligned with the question (plus noise)."""
    rng = np.random.default_rng(seed)
    dim, s = 16, 6
    sentences = rng.normal(size=(n, s, dim)).astype(np.float32)
    counts = rng.integers(2, s + 1, n)
    mask = (np.arange(s)[None] < counts[:, None]).astype(np.int32)
    labels = rng.integers(0, counts)
    question = sentences[np.arange(n), labels] + 0.3 * rng.normal(size=(n, dim))
    return SentenceData(question.astype(np.float32), sentences, mask, labels.astype(np.int32),
                        [str(i) for i in range(n)], 0)


def test_prescreener_learns_and_respects_the_mask():
    config = PrescreenConfig(embedding_dim=16, width=32, num_layers=2, num_heads=2, mlp_dim=64,
                             max_sentences=6, dropout=0.0)
    train, valid = _synthetic(512, 0), _synthetic(128, 1)
    result = train_prescreener(train, config, steps=300, batch_size=32, learning_rate=3e-3)
    assert np.mean(result.losses[-20:]) < 0.5 * np.mean(result.losses[:20])
    scores = sentence_scores(result.params, config, valid)
    assert np.all(scores[valid.sentence_mask == 0] <= -1e8)
    accuracy = topk_accuracy(scores, valid.label)
    chance = float(np.mean(1 / valid.sentence_mask.sum(1)))
    assert accuracy["top1"] > chance + 0.3 and accuracy["top2"] >= accuracy["top1"]


def test_topk_accuracy_by_hand():
    scores = np.array([[0.1, 0.9, 0.0], [0.5, 0.2, 0.3]])
    assert topk_accuracy(scores, np.array([1, 2])) == {"top1": 0.5, "top2": 1.0}


def test_reduced_context_maps_answers_back():
    from dil_jax.data.squad import SquadExample
    from dil_jax.sep.integrate import map_span_back, prescreen_examples, reduce_context

    context = "First one here. Second has Paris in it. Third is last."
    spans = split_sentences(context)
    text, offsets = reduce_context(context, spans, [2, 1])
    assert text == "Second has Paris in it. Third is last."
    start = text.index("Paris")
    a, b = map_span_back(offsets, start, start + 5)
    assert context[a:b] == "Paris"
    last = text.index("last")
    assert context[slice(*map_span_back(offsets, last, last + 4))] == "last"
    example = SquadExample("q", "T", context, "Where?", ("Paris",), (context.index("Paris"),))
    scores = np.array([[0.1, 0.9, 0.5]])
    screened = prescreen_examples([example], [spans], scores, np.array([1]), top_m=1)
    assert screened.examples[0].context == "Second has Paris in it."
    assert screened.kept_answer_sentence.tolist() == [True]
    assert screened.examples[0].question == "Where?" and screened.examples[0].qid == "q"
