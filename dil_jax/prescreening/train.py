"""Training and evaluating the prescreener on SQuAD (sentence embeddings computed once).

    data = build_sentence_data(examples, encoder)
    state = train_prescreener(train_data, PrescreenConfig(), steps=..., seed=0)
    topk_accuracy(data_scores(state.params, config, valid_data), valid_data.label)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import jax
import numpy as np
import optax

from dil_jax.data.squad import SquadExample
from dil_jax.prescreening.embed import sentence_embeddings
from dil_jax.prescreening.model import PrescreenConfig, Prescreener
from dil_jax.prescreening.prescreener import sentence_scores
from dil_jax.prescreening.sentences import answer_sentence, split_sentences

if TYPE_CHECKING:
    from dil_jax.readers.protocol import Reader


@dataclasses.dataclass
class SentenceData:
    """Inputs and labels of answerable examples whose answer sentence fits max_sentences.

    question: [n, D]; sentences: [n, S, D]; sentence_mask: [n, S]; label: [n] int;
    qids: the examples' ids; dropped: examples left out (unanswerable or answer beyond S);
    examples, spans: the kept examples and their sentence spans (empty for synthetic data).
    """

    question: np.ndarray
    sentences: np.ndarray
    sentence_mask: np.ndarray
    label: np.ndarray
    qids: list[str]
    dropped: int
    examples: list[SquadExample] = dataclasses.field(default_factory=list)
    spans: list[list[tuple[int, int]]] = dataclasses.field(default_factory=list)


def build_sentence_data(examples: Sequence[SquadExample], encoder: Reader, *,
                        max_sentences: int = 32, max_len: int = 64) -> SentenceData:
    """Splits each distinct context once, embeds every sentence and question once with the
    sentence `encoder`."""
    contexts: dict[str, list[tuple[int, int]]] = {}
    for example in examples:
        if example.context not in contexts:
            contexts[example.context] = split_sentences(example.context)[:max_sentences]
    texts, first = [], {}
    for context, spans in contexts.items():
        first[context] = len(texts)
        texts += [context[a:b] for a, b in spans]
    sentence_vectors = sentence_embeddings(encoder, texts, max_len=max_len)
    kept = [e for e in examples if e.answer_starts
            and 0 <= answer_sentence(contexts[e.context], e.answer_starts[0]) < max_sentences]
    question_vectors = sentence_embeddings(encoder, [e.question for e in kept], max_len=max_len)
    dim = sentence_vectors.shape[1] if len(texts) else question_vectors.shape[1]
    sentences = np.zeros((len(kept), max_sentences, dim), np.float32)
    mask = np.zeros((len(kept), max_sentences), np.int32)
    labels = np.zeros(len(kept), np.int32)
    for row, example in enumerate(kept):
        spans = contexts[example.context]
        start = first[example.context]
        sentences[row, :len(spans)] = sentence_vectors[start:start + len(spans)]
        mask[row, :len(spans)] = 1
        labels[row] = answer_sentence(spans, example.answer_starts[0])
    return SentenceData(question_vectors, sentences, mask, labels, [e.qid for e in kept],
                        len(examples) - len(kept), kept, [contexts[e.context] for e in kept])


@dataclasses.dataclass
class PrescreenerTrainResult:
    """params: the final ones, or with `dev` data the best on it; dev_top1: (step, accuracy)
    of each evaluation; best_step: the step params come from."""

    params: dict
    losses: list[float]
    dev_top1: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    best_step: int = -1


def data_scores(params, config: PrescreenConfig, data: SentenceData) -> np.ndarray:
    """[n, S] sentence logits of every example of `data`."""
    return sentence_scores(params, config, data.question, data.sentences, data.sentence_mask)


def train_prescreener(data: SentenceData, config: PrescreenConfig, *, steps: int = 1500,
                      batch_size: int = 64, learning_rate: float = 1e-3,
                      weight_decay: float = 0.01, seed: int = 0,
                      dev: SentenceData | None = None,
                      eval_every: int = 100) -> PrescreenerTrainResult:
    """AdamW with cosine decay on softmax cross-entropy over each passage's sentences.

    With `dev` (held-out articles, not the validation ones), top-1 accuracy on it is measured
    every `eval_every` steps and the best params are returned: early stopping, because a few
    thousand questions are overfitted long before a fixed step count ends.
    """
    model = Prescreener(config)
    rng = jax.random.key(seed)
    init_rng, rng = jax.random.split(rng)
    params = model.init(init_rng, data.question[:1], data.sentences[:1],
                        data.sentence_mask[:1])["params"]
    tx = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, learning_rate, steps // 10, steps),
                     weight_decay=weight_decay)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, batch, dropout_rng):
        def loss_fn(p):
            logits = model.apply({"params": p}, batch["question"], batch["sentences"],
                                 batch["mask"], deterministic=False,
                                 rngs={"dropout": dropout_rng})
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    order_rng = np.random.default_rng(seed)
    result = PrescreenerTrainResult(params, [])
    best = -1.0
    n = len(data.label)
    for i in range(steps):
        rows = order_rng.integers(0, n, batch_size)
        batch = {"question": data.question[rows], "sentences": data.sentences[rows],
                 "mask": data.sentence_mask[rows], "label": data.label[rows]}
        params, opt_state, loss = step(params, opt_state, batch, jax.random.fold_in(rng, i))
        result.losses.append(float(loss))
        if dev is not None and ((i + 1) % eval_every == 0 or i + 1 == steps):
            top1 = topk_accuracy(data_scores(params, config, dev), dev.label, (1,))["top1"]
            result.dev_top1.append((i + 1, top1))
            if top1 > best:
                best, result.params, result.best_step = top1, params, i + 1
    if dev is None:
        result.params, result.best_step = params, steps
    return result


def topk_accuracy(scores: np.ndarray, labels: np.ndarray, ks: Sequence[int] = (1, 2)
                  ) -> dict[str, float]:
    """Share of examples whose answer sentence is among the k best-scored, for each k."""
    ranked = np.argsort(-scores, axis=1, kind="stable")
    return {f"top{k}": float(np.mean(np.any(ranked[:, :k] == labels[:, None], axis=1)))
            for k in ks}


def first_sentence_accuracy(data: SentenceData) -> float:
    """The baseline: always pick the first sentence."""
    return float(np.mean(data.label == 0))

