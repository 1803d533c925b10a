"""SQuAD training data and validation metric for `dil-jax train`.

`featurize` is the `data.featurizer` of the SQuAD configs: it reads `data.squad_file`, keeps the
articles of the split (`data.train_articles` / `data.validation_articles`, slices of the file's
article order, so the split is by article, never by question) and featurizes them with
`dil_jax.data.features.featurize` (each question once, strided passage windows, labels inside
the window or -1; with `data.answer_candidates_file`, every occurrence of an ambiguous answer,
`dil_jax.train.answer_candidates`). Training may add distractor windows
(`data.distractors_per_question`) and distillation-only questions (`data.distill_file`,
`distillation_examples`; cloze questions on the training paragraphs, `data.cloze_per_paragraph`,
`dil_jax.train.cloze`).

`evaluator` is the `eval.evaluator`: EM/F1 (the official SQuAD metric) of the model being trained
on the validation articles, through the same `predict_squad` path as `dil-jax predict`. On SQuAD
v2.0 it first chooses the null threshold on training questions (never on validation).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import ml_collections
import numpy as np

from dil_jax.data.features import Features
from dil_jax.data.features import featurize as featurize_examples
from dil_jax.data.squad import SquadExample, load_squad, select_articles
from dil_jax.errors import DilJaxError, InputFileError, UsageError
from dil_jax.train.answer_candidates import load_answer_candidates, window_candidates
from dil_jax.train.cloze import cloze_examples
from dil_jax.train.data import TrainingFeatures, append_unlabelled, with_candidates
from dil_jax.train.distractors import add_distractors, source_names, wikipedia_paragraphs

if TYPE_CHECKING:
    from dil_jax.readers.protocol import Reader

log = logging.getLogger(__name__)


def split_examples(data_cfg: ml_collections.ConfigDict, split: str) -> list[SquadExample]:
    """The examples of the split's articles (file order), at most data.max_questions of them
    for training and data.max_validation_questions for validation (a training subset must not
    shrink the validation set it is compared on)."""
    if split not in ("train", "validation"):
        raise UsageError(f"split must be 'train' or 'validation', got {split!r}")
    file_key = "squad_file"
    if split == "validation" and data_cfg.get("validation_file"):
        file_key = "validation_file"
    path = data_cfg[file_key]
    spec_key = "train_articles" if split == "train" else "validation_articles"
    spec = data_cfg[spec_key]
    try:
        squad = load_squad(path)
    except (DilJaxError, OSError, ValueError) as error:  # the file's problem, by its config key
        raise InputFileError(f"config.data.{file_key} = {path!r}: {error}") from None
    try:
        examples = select_articles(squad.examples, spec)
    except ValueError as error:
        raise UsageError(f"{path}: {split} split (config.data.{spec_key} = {spec!r}): "
                         f"{error}") from None
    limit = data_cfg.max_questions if split == "train" else data_cfg.max_validation_questions
    if limit > 0:
        examples = examples[:limit]
    return examples


def featurize(data_cfg: ml_collections.ConfigDict, split: str, *,
              max_question_len: int) -> Features | TrainingFeatures:
    """Features of the split's examples; for "train" with data.distractors_per_question > 0,
    plus distractor windows (dil_jax.train.distractors) retrieved among the paragraphs of all
    training articles (also those of questions cut by data.max_questions). Validation never gets
    distractors: it measures reading the question's own paragraph; nor do the validation
    articles give any (their Wikipedia leads are left out too)."""
    from dil_jax.tokenization import load_tokenizer

    examples = split_examples(data_cfg, split)
    tokenizer = load_tokenizer(data_cfg.tokenizer)
    options = dict(max_question_len=max_question_len, max_passage_len=data_cfg.max_passage_len,
                   doc_stride=data_cfg.doc_stride)
    features = featurize_examples(examples, tokenizer, **options)
    if split != "train":
        return features
    spans = None
    if data_cfg.get("answer_candidates_file", ""):
        spans = window_candidates(features, examples,
                                  load_answer_candidates(data_cfg.answer_candidates_file))
        features = dataclasses.replace(features, start_positions=spans.start_positions,
                                       end_positions=spans.end_positions)
    # Whole articles: every training paragraph and every validation title, whatever the
    # question limits.
    unlimited = ml_collections.ConfigDict(data_cfg.to_dict())
    unlimited.max_questions = unlimited.max_validation_questions = -1
    all_training = split_examples(unlimited, "train")
    # Whose Wikipedia leads distractors and cloze questions leave out.
    validation_titles = sorted({e.title for e in split_examples(unlimited, "validation")})
    if data_cfg.get("distractors_per_question", 0) > 0:
        paragraphs = list(dict.fromkeys(e.context for e in all_training))
        features = add_distractors(features, examples, paragraphs, tokenizer, data_cfg,
                                   validation_titles)
    extra: list[SquadExample] = []
    if data_cfg.get("distill_file", ""):
        extra += distillation_examples(data_cfg, all_training)
        log.info("distillation-only questions: %d from %s", len(extra), data_cfg.distill_file)
    if data_cfg.get("cloze_per_paragraph", 0) > 0:
        extra += training_cloze_examples(data_cfg, all_training, validation_titles)
    if extra:
        features = append_unlabelled(features, featurize_examples(extra, tokenizer, **options))
        log.info("unlabelled windows: %d", int(np.sum(features.is_unlabelled)))
    if spans is not None:  # computed on the first windows; the added ones follow them
        features = with_candidates(features, spans.start_candidates, spans.end_candidates)
    return features


def training_cloze_examples(data_cfg: ml_collections.ConfigDict,
                            training: list[SquadExample],
                            validation_titles: list[str]) -> list[SquadExample]:
    """Up to data.cloze_per_paragraph cloze questions (`dil_jax.train.cloze`) on each paragraph
    of data.cloze_sources: the training articles' paragraphs (`training`: all of them, whatever
    data.max_questions) and/or the Wikipedia leads' except the validation articles'. Without
    their rule answers: like every distillation-only question, they are labelled -1 / -1 and
    learnt from the teacher only."""
    sources = source_names(data_cfg.get("cloze_sources", "paragraphs"))
    paragraphs: list[tuple[str, str]] = []
    if "paragraphs" in sources:
        paragraphs += [(example.title, example.context) for example in training]
    if "wikipedia" in sources:
        paragraphs += wikipedia_paragraphs(validation_titles, "config.data.cloze_sources")
    cloze = cloze_examples(paragraphs, max_per_paragraph=data_cfg.cloze_per_paragraph)
    log.info("cloze questions: %d on %d paragraphs (%s)", len(cloze),
             len(dict.fromkeys(paragraphs)), ",".join(sources))
    return [dataclasses.replace(example, answer_texts=(), answer_starts=())
            for example in cloze]


def distillation_examples(data_cfg: ml_collections.ConfigDict,
                          training: list[SquadExample]) -> list[SquadExample]:
    """The questions of data.distill_file on the training articles (matched by title, so a
    file in another article order cannot leak a validation article) that are not labelled
    training questions (by id), in file order, at most data.max_distill_questions of them.

    training: every labelled example of the training split (whatever data.max_questions), so a
    learning-curve subset never gets the rest of its own questions back as unlabelled ones.
    With dev-v2.0.json beside the v1.1 file these are the training articles' unanswerable
    questions: questions on the same paragraphs whose teacher distributions KD and LRS learn
    from (their v2.0 "no answer" label is not used).
    """
    path = data_cfg.distill_file
    try:
        squad = load_squad(path)
    except (DilJaxError, OSError, ValueError) as error:
        raise InputFileError(f"config.data.distill_file = {path!r}: {error}") from None
    titles = {example.title for example in training}
    labelled_ids = {example.qid for example in training}
    chosen = [example for example in squad.examples
              if example.title in titles and example.qid not in labelled_ids]
    if not chosen:
        raise UsageError(f"config.data.distill_file = {path!r}: none of its questions is on a "
                         f"training article ({len(titles)} titles) and not already a labelled "
                         "training question")
    limit = int(data_cfg.get("max_distill_questions", -1))
    return chosen[:limit] if limit > 0 else chosen


def spread_subset(examples: list[SquadExample], count: int) -> list[SquadExample]:
    """`count` examples spread evenly over `examples` (so over all of its articles, not the
    first few): indices floor(i * n / count), i < count; all of them when count is -1 or >= n."""
    n = len(examples)
    if count < 0 or count >= n:
        return list(examples)
    return [examples[i * n // count] for i in range(count)]


V2_METRICS = ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1")


def evaluator(config: ml_collections.ConfigDict, student: Reader
              ) -> Callable[..., dict[str, float]]:
    """factory(config, student) -> evaluate_fn(params) -> {"exact", "f1"} on validation.

    SQuAD v2.0 (the validation file's version): evaluate_fn first predicts
    `eval.threshold_questions` training questions (`spread_subset`), chooses the null threshold
    that maximises their F1 (`best_null_threshold`, the official script's search) and predicts
    validation with it; it returns exact, f1 and the HasAns_/NoAns_ exact and f1 of validation
    (those present), and "null_threshold".
    """
    import math

    from dil_jax.data.decoding import answers, null_score_differences
    from dil_jax.data.squad import gold_answers
    from dil_jax.metrics.squad_metric import best_null_threshold, squad_scores
    from dil_jax.predict import predict_squad, predict_squad_spans
    from dil_jax.tokenization import load_tokenizer

    examples = split_examples(config.data, "validation")
    gold = gold_answers(examples)
    version = load_squad(config.data.get("validation_file") or config.data.squad_file).version
    # The student with the data's tokenizer: each evaluation reads with that step's params.
    student = dataclasses.replace(student, params=None,
                                  tokenizer=load_tokenizer(config.data.tokenizer))
    options = dict(max_passage_len=config.data.max_passage_len,
                   doc_stride=config.data.doc_stride, batch_size=config.eval.batch_size,
                   progress=False)
    if version != "2.0":
        def evaluate_fn(params) -> dict[str, float]:
            predictions = predict_squad(student.with_params(params), examples, **options)
            scores = squad_scores(gold, predictions, version=version)
            return {"exact": float(scores["exact"]), "f1": float(scores["f1"])}

        return evaluate_fn

    threshold_examples = spread_subset(split_examples(config.data, "train"),
                                       int(config.eval.threshold_questions))

    def evaluate_v2(params) -> dict[str, float]:
        # Every best span with its null score (an infinite threshold nulls nothing).
        reader = student.with_params(params)
        spans = predict_squad_spans(reader, threshold_examples, null_threshold=math.inf,
                                    **options)
        threshold, _ = best_null_threshold(gold_answers(threshold_examples), answers(spans),
                                           null_score_differences(spans))
        predictions = predict_squad(reader, examples, null_threshold=threshold, **options)
        scores = squad_scores(gold, predictions, version="2.0")
        metrics = {key: float(scores[key]) for key in V2_METRICS if key in scores}
        return {**metrics, "null_threshold": float(threshold)}

    return evaluate_v2
