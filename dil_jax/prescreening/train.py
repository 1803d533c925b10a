"""Training and evaluating the prescreener on SQuAD (sentence embeddings computed once).

    data = build_sentence_data(examples, encoder)
    state = train_prescreener(train_data, PrescreenConfig(), steps=..., seed=0)
    topk_accuracy(data_scores(state.params, config, valid_data), valid_data.label)
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import jax
import numpy as np
import optax

from dil_jax.data.squad import SquadExample
from dil_jax.prescreening.embed import sentence_embeddings
from dil_jax.prescreening.model import PrescreenConfig, Prescreener
from dil_jax.prescreening.prescreener import sentence_scores
from dil_jax.prescreening.sentences import answer_sentence, split_sentences
from dil_jax.rounding import round_up

if TYPE_CHECKING:
    from dil_jax.prescreening.overlap import WordOverlap
    from dil_jax.readers.protocol import Reader

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PassageSentences:
    """[n, S, D] sentence embeddings of n questions' passages, gathered from a table of each
    distinct sentence when indexed (`sentences[rows]`, `sentences[:1]`), as a numpy array would.

    Why not the dense array: the complete SQuAD training set's 87.6k questions share 19k
    passages, so [87.6k, 32, 384] float32 (4.3 GB) would repeat each passage's sentences ~4.6
    times and mostly hold padding; the table is ~0.14 GB.

    table: [T + 1, D], its last row zeros (the padding); index: [n, S] rows of the table.
    """

    table: np.ndarray
    index: np.ndarray

    @property
    def shape(self) -> tuple[int, int, int]:
        return (*self.index.shape, self.table.shape[1])

    @property
    def ndim(self) -> int:
        return 3

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, rows) -> np.ndarray:
        return self.table[self.index[rows]]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        dense = self.table[self.index]
        return dense if dtype is None else dense.astype(dtype)


@dataclasses.dataclass
class SentenceData:
    """Inputs and labels of answerable examples whose answer sentence fits max_sentences.

    question: [n, D]; sentences: [n, S, D] (an array or `PassageSentences`); sentence_mask:
    [n, S]; label: [n] int; qids: the examples' ids; dropped: examples left out (unanswerable or
    answer beyond S); examples, spans: the kept examples and their sentence spans (empty for
    synthetic data).
    """

    question: np.ndarray
    sentences: np.ndarray | PassageSentences
    sentence_mask: np.ndarray
    label: np.ndarray
    qids: list[str]
    dropped: int
    examples: list[SquadExample] = dataclasses.field(default_factory=list)
    spans: list[list[tuple[int, int]]] = dataclasses.field(default_factory=list)
    # [n, S] each question's word overlap with its sentences (`WordOverlap`); None: not read.
    overlap: np.ndarray | None = None


Embed = Callable[[Sequence[str], str], np.ndarray]


def build_sentence_data(examples: Sequence[SquadExample], encoder: Reader | None = None, *,
                        max_sentences: int = 32, max_len: int = 64,
                        embed: Embed | None = None,
                        overlap: WordOverlap | None = None) -> SentenceData:
    """Splits each distinct context once and embeds every sentence and question once: with
    `embed(texts, what)` if given (e.g. an `EmbeddingCache`), else with the sentence `encoder`;
    with `overlap`, each question's word overlap with its sentences too."""
    if embed is None:
        if encoder is None:
            raise ValueError("build_sentence_data needs a sentence encoder or an embed function")

        def embed(texts: Sequence[str], what: str) -> np.ndarray:
            return sentence_embeddings(encoder, texts, max_len=max_len)

    contexts: dict[str, list[tuple[int, int]]] = {}
    for example in examples:
        if example.context not in contexts:
            contexts[example.context] = split_sentences(example.context)[:max_sentences]
    texts, first = [], {}
    for context, spans in contexts.items():
        first[context] = len(texts)
        texts += [context[a:b] for a, b in spans]
    sentence_vectors = embed(texts, "sentences")
    kept = [e for e in examples if e.answer_starts
            and 0 <= answer_sentence(contexts[e.context], e.answer_starts[0]) < max_sentences]
    question_vectors = embed([e.question for e in kept], "questions")
    dim = sentence_vectors.shape[1] if len(texts) else question_vectors.shape[1]
    table = np.concatenate([sentence_vectors.reshape(-1, dim), np.zeros((1, dim), np.float32)])
    index = np.full((len(kept), max_sentences), len(texts), np.int32)  # the zero row: padding
    mask = np.zeros((len(kept), max_sentences), np.int32)
    labels = np.zeros(len(kept), np.int32)
    for row, example in enumerate(kept):
        spans = contexts[example.context]
        start = first[example.context]
        index[row, :len(spans)] = np.arange(start, start + len(spans))
        mask[row, :len(spans)] = 1
        labels[row] = answer_sentence(spans, example.answer_starts[0])
    spans = [contexts[e.context] for e in kept]
    overlaps = None if overlap is None else overlap(
        [e.question for e in kept],
        [[e.context[a:b] for a, b in own] for e, own in zip(kept, spans, strict=True)],
        max_sentences)
    return SentenceData(question_vectors, PassageSentences(table, index), mask, labels,
                        [e.qid for e in kept], len(examples) - len(kept), kept, spans, overlaps)


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
    return sentence_scores(params, config, data.question, data.sentences, data.sentence_mask,
                           data.overlap)


def training_batch(data: SentenceData, rows: np.ndarray, bucket: int = 8) -> dict:
    """The examples `rows` of `data`, their sentences cut to the batch's longest passage
    rounded up to `bucket` (at most S).

    Why: SQuAD passages have ~5 sentences but S = 32 slots, so full-width batches spend ~2/3 of
    the work on padding. The cut changes no score: padded sentences are masked out of attention
    and of the softmax, and positions are per slot (tested); a few widths, one compile each.
    """
    mask = data.sentence_mask[rows]
    width = min(round_up(max(int(mask.sum(axis=1).max()), 1), bucket), mask.shape[1])
    overlap = (np.zeros(mask.shape, np.float32) if data.overlap is None
               else data.overlap[rows])
    return {"question": data.question[rows], "sentences": data.sentences[rows][:, :width],
            "mask": mask[:, :width], "overlap": overlap[:, :width], "label": data.label[rows]}


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
    # Jitted: run op by op, the init compiles each of its ~100 small ops (20 s of a 4-step run).
    if config.overlap and data.overlap is None:
        raise ValueError("config.overlap: the training data needs its word overlaps "
                         "(build_sentence_data(overlap=...))")
    params = jax.jit(model.init)(init_rng, data.question[:1], data.sentences[:1],
                                 data.sentence_mask[:1],
                                 np.zeros(data.sentence_mask[:1].shape, np.float32))["params"]
    tx = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, learning_rate, steps // 10, steps),
                     weight_decay=weight_decay)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, batch, dropout_rng):
        def loss_fn(p):
            logits = model.apply({"params": p}, batch["question"], batch["sentences"],
                                 batch["mask"], batch["overlap"], deterministic=False,
                                 rngs={"dropout": dropout_rng})
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    order_rng = np.random.default_rng(seed)
    started = time.perf_counter()
    result = PrescreenerTrainResult(params, [])
    best = -1.0
    n = len(data.label)
    for i in range(steps):
        batch = training_batch(data, order_rng.integers(0, n, batch_size))
        params, opt_state, loss = step(params, opt_state, batch, jax.random.fold_in(rng, i))
        result.losses.append(float(loss))
        if dev is not None and ((i + 1) % eval_every == 0 or i + 1 == steps):
            top1 = topk_accuracy(data_scores(params, config, dev), dev.label, (1,))["top1"]
            result.dev_top1.append((i + 1, top1))
            # A long run on the complete training set is watched through these lines.
            log.info("step %d / %d: dev top-1 %.4f, train loss %.3f (last %d steps), %.0f s",
                     i + 1, steps, top1, float(np.mean(result.losses[-eval_every:])),
                     min(eval_every, len(result.losses)), time.perf_counter() - started)
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

