"""A trained prescreener with its sentence encoder: checkpoint, embedding, scoring, screening.

    prescreener = SentencePrescreener.load("default")      # or a folder `dil-jax prescreen` wrote
    keep = screen_features(prescreener, SentenceRule(top_m=2), examples, features).keep

A prescreener checkpoint folder follows the reader's conventions: `params/` (orbax) beside a JSON
(`prescreener.json`) with the model config, the sentence encoder it was trained on (a checkpoint
reference, "default" = the embedded all-MiniLM-L6-v2, and the fingerprint of its weights: other
embeddings would feed the model vectors it never saw, so a mismatch is an error) and what the
training measured. Written atomically.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from dil_jax.atomic import staged_directory
from dil_jax.errors import DilJaxError
from dil_jax.prescreening.model import PrescreenConfig, Prescreener
from dil_jax.prescreening.overlap import IDF_FILE
from dil_jax.prescreening.screen import SentenceRule, token_sentences, window_keep
from dil_jax.prescreening.sentences import answer_sentence, split_sentences
from dil_jax.rounding import round_up

if TYPE_CHECKING:
    from dil_jax.prescreening.overlap import WordOverlap
    from dil_jax.readers.protocol import Reader

PRESCREENER_FORMAT = "dil_jax.prescreener/1"
MANIFEST_FILE = "prescreener.json"
PARAMS_DIR = "params"
BUNDLED_PRESCREENER = Path(__file__).resolve().parents[1] / "assets" / "prescreener-minilm"


class PrescreenerError(DilJaxError, ValueError):
    """A prescreener folder that is missing, malformed or made for another sentence encoder."""


@functools.lru_cache(maxsize=8)
def _apply_fn(config: PrescreenConfig):
    model = Prescreener(config)
    return jax.jit(lambda params, q, s, m, o: model.apply({"params": params}, q, s, m, o))


def sentence_scores(params: Any, config: PrescreenConfig, question: np.ndarray,
                    sentences: np.ndarray, mask: np.ndarray, overlap: np.ndarray | None = None,
                    batch_size: int = 256) -> np.ndarray:
    """[n, S] sentence logits (-1e9 where masked).

    question: [n, D]; sentences: [n, S, D]; mask: [n, S]; overlap: [n, S] (required with
    `config.overlap`, else unused). Rows are padded to a multiple of 32 (few shapes, one
    compilation each).
    """
    if config.overlap and overlap is None:
        raise PrescreenerError("this prescreener reads each sentence's word overlap with the "
                               "question (config.overlap): give `overlap` [n, S]")
    if overlap is None:
        overlap = np.zeros(np.shape(mask), np.float32)
    apply = _apply_fn(config)
    n = len(question)
    out = []
    for first in range(0, n, batch_size):
        rows = slice(first, min(first + batch_size, n))
        count = rows.stop - rows.start
        pad = round_up(count, 32) - count
        pieces = [np.pad(np.asarray(a[rows]), ((0, pad),) + ((0, 0),) * (a.ndim - 1))
                  for a in (question, sentences, mask, overlap)]
        out.append(np.asarray(apply(params, *pieces))[:count])
    return np.concatenate(out) if out else np.zeros((0, sentences.shape[1]), np.float32)


# The span head's params in a reader's tree: unused when the reader embeds sentences.
QA_HEAD = "qa_outputs"


def encoder_fingerprint(encoder: Reader) -> str:
    """The sentence encoder's weights but its QA head: sentences never reach the head, and a
    checkpoint without one (the embedded MiniLM) gets a randomly initialised head whose float
    bits depend on the CPU's instruction set (the bundled prescreener was refused under
    --xla_cpu_max_isa=SSE4_2)."""
    from dil_jax.checkpoints.fingerprint import params_fingerprint

    return params_fingerprint({name: value for name, value in encoder.params.items()
                               if name != QA_HEAD})


@dataclasses.dataclass
class SentencePrescreener:
    """The prescreening model and the sentence encoder whose embeddings it reads."""

    config: PrescreenConfig
    params: Any
    encoder: Reader  # the sentence encoder (all its blocks, mean-pooled: `embed`)
    encoder_name: str = "default"
    max_sentence_len: int = 64
    # [vocab] IDF of the encoder's word pieces (`overlap.fit_idf`), with `config.overlap`.
    idf: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.config.overlap and self.idf is None:
            raise PrescreenerError("this prescreener reads word overlaps (config.overlap): it "
                                   "needs the IDF table of its training passages")

    @functools.cached_property
    def encoder_fingerprint(self) -> str:
        """See `encoder_fingerprint` (the module's function)."""
        return encoder_fingerprint(self.encoder)

    @functools.cached_property
    def legacy_encoder_fingerprint(self) -> str:
        """Every encoder param, the head included: what prescreeners saved before recorded."""
        from dil_jax.checkpoints.fingerprint import params_fingerprint

        return params_fingerprint(self.encoder.params)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """[len(texts), D] unit vectors from the sentence encoder."""
        from dil_jax.prescreening.embed import sentence_embeddings

        if not texts:
            return np.zeros((0, self.config.embedding_dim), np.float32)
        return sentence_embeddings(self.encoder, texts, max_len=self.max_sentence_len)

    @property
    def word_overlap(self) -> WordOverlap | None:
        """The word overlap this prescreener reads (its encoder's tokenizer and its IDF), or
        None when it reads none."""
        from dil_jax.prescreening.overlap import WordOverlap

        return WordOverlap(self.encoder.tokenizer, self.idf) if self.config.overlap else None

    def overlap(self, questions: Sequence[str], sentences: Sequence[Sequence[str]]
                ) -> np.ndarray | None:
        """[n, S] each question's IDF-weighted word overlap with each of its sentences' texts
        (`overlap.overlap_scores`; sentences: per question, its sentences), or None when this
        prescreener does not read it."""
        overlap = self.word_overlap
        return None if overlap is None else overlap(questions, sentences,
                                                    self.config.max_sentences)

    def score(self, question: np.ndarray, sentences: np.ndarray, mask: np.ndarray,
              overlap: np.ndarray | None = None) -> np.ndarray:
        """[n, S] logits; see `sentence_scores` (overlap: `overlap`'s, with config.overlap)."""
        return sentence_scores(self.params, self.config, question, sentences, mask, overlap)

    def save(self, directory: str | os.PathLike, **record: Any) -> Path:
        """Writes the checkpoint folder (replacing one that exists); `record`: JSON extras."""
        import orbax.checkpoint as ocp

        manifest = PrescreenerManifest(self.config, self.encoder_name, self.encoder_fingerprint,
                                       self.max_sentence_len, record)
        directory = Path(directory).absolute()
        with staged_directory(directory) as staging:
            checkpointer = ocp.StandardCheckpointer()
            checkpointer.save(staging / PARAMS_DIR, jax.tree.map(np.asarray, self.params))
            checkpointer.wait_until_finished()
            if self.idf is not None:
                np.save(staging / IDF_FILE, np.asarray(self.idf, np.float32))
            (staging / MANIFEST_FILE).write_text(json.dumps(manifest.to_json(), indent=2,
                                                            default=str))
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike, encoder: Reader | None = None
             ) -> SentencePrescreener:
        """directory: a prescreener folder, or "default" (the bundled one). encoder: an already
        loaded sentence encoder to use instead of loading the recorded one."""
        import orbax.checkpoint as ocp

        directory = BUNDLED_PRESCREENER if str(directory) == "default" else Path(directory)
        manifest_path = directory.absolute() / MANIFEST_FILE
        if not manifest_path.is_file():
            raise PrescreenerError(f"{directory}: not a prescreener (no {MANIFEST_FILE}); train "
                                   "one with `dil-jax prescreen --config configs/prescreen.py "
                                   "--config.workdir=DIR`")
        manifest = PrescreenerManifest.read(manifest_path)
        config = manifest.config
        abstract = jax.eval_shape(
            lambda: Prescreener(config).init(
                jax.random.key(0), np.zeros((1, config.embedding_dim), np.float32),
                np.zeros((1, config.max_sentences, config.embedding_dim), np.float32),
                np.ones((1, config.max_sentences), np.int32),
                np.zeros((1, config.max_sentences), np.float32))["params"])
        params_dir = directory.absolute() / PARAMS_DIR
        if not params_dir.is_dir():
            raise PrescreenerError(f"{params_dir}: missing; retrain or re-copy the prescreener")
        try:
            params = ocp.StandardCheckpointer().restore(params_dir, abstract)
        except Exception as error:  # orbax/tensorstore: truncated or mismatched array files
            raise PrescreenerError(
                f"{params_dir}: cannot restore the prescreener's params ({type(error).__name__}: "
                f"{str(error)[:500]}); the folder is damaged or was written for another config: "
                "retrain or re-copy it") from error
        idf = _read_idf(directory.absolute() / IDF_FILE) if config.overlap else None
        encoder = encoder or load_sentence_encoder(manifest.encoder, manifest.max_sentence_len)
        if idf is not None and len(idf) != len(encoder.tokenizer):
            raise PrescreenerError(
                f"{directory.absolute() / IDF_FILE}: {len(idf)} IDF values, but the sentence "
                f"encoder's vocabulary has {len(encoder.tokenizer)} pieces")
        prescreener = cls(config, params, encoder, manifest.encoder, manifest.max_sentence_len,
                          idf)
        if manifest.encoder_fingerprint not in (prescreener.encoder_fingerprint,
                                                prescreener.legacy_encoder_fingerprint):
            raise PrescreenerError(
                f"{manifest_path}: trained on sentence embeddings of encoder "
                f"{manifest.encoder!r} with weights {manifest.encoder_fingerprint}, but the "
                f"loaded encoder's weights are {prescreener.encoder_fingerprint}")
        return prescreener


def _read_idf(path: Path) -> np.ndarray:
    """The [vocab] float32 IDF table of a prescreener that reads word overlaps."""
    if not path.is_file():
        raise PrescreenerError(f"{path}: missing (this prescreener reads word overlaps, "
                               "config.overlap); retrain or re-copy the prescreener")
    try:
        idf = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise PrescreenerError(f"{path}: not a readable .npy file ({error}); retrain or "
                               "re-copy the prescreener") from None
    if idf.ndim != 1 or idf.dtype != np.float32 or not np.isfinite(idf).all():
        raise PrescreenerError(f"{path}: expected a finite float32 vector, got "
                               f"{idf.dtype} {idf.shape}; retrain or re-copy the prescreener")
    return idf


@dataclasses.dataclass(frozen=True)
class PrescreenerManifest:
    """A prescreener folder's `prescreener.json`: the model config, the sentence encoder it was
    trained on (a checkpoint name and its weights' fingerprint), the sentence length, and the
    training's records (free-form: what it measured, notes)."""

    config: PrescreenConfig
    encoder: str
    encoder_fingerprint: str
    max_sentence_len: int
    records: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dict(format=PRESCREENER_FORMAT, config=config_json(self.config),
                    encoder=self.encoder, encoder_fingerprint=self.encoder_fingerprint,
                    max_sentence_len=self.max_sentence_len, **self.records)

    @classmethod
    def from_json(cls, manifest: Any, path: Path) -> PrescreenerManifest:
        """The manifest of a parsed JSON value, every field checked: PrescreenerError naming
        `path` and the field (not a KeyError or TypeError)."""
        if not isinstance(manifest, dict):
            raise PrescreenerError(f"{path}: expected a JSON object, got "
                                   f"{type(manifest).__name__}")
        if manifest.get("format") != PRESCREENER_FORMAT:
            raise PrescreenerError(f"{path}: format {manifest.get('format')!r}, "
                                   f"expected {PRESCREENER_FORMAT!r}")
        for key, kind in (("config", dict), ("encoder", str), ("encoder_fingerprint", str),
                          ("max_sentence_len", int)):
            if not isinstance(manifest.get(key), kind) or isinstance(manifest.get(key), bool):
                raise PrescreenerError(f"{path}: field {key!r} must be a {kind.__name__}, got "
                                       f"{manifest.get(key)!r}")
        return cls(config=_prescreen_config(manifest["config"], path),
                   encoder=manifest["encoder"],
                   encoder_fingerprint=manifest["encoder_fingerprint"],
                   max_sentence_len=manifest["max_sentence_len"],
                   records={key: value for key, value in manifest.items()
                            if key not in _MANIFEST_FIELDS})

    @classmethod
    def read(cls, path: Path) -> PrescreenerManifest:
        """`prescreener.json` at `path`, checked (`from_json`)."""
        try:
            manifest = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise PrescreenerError(f"{path}: not valid JSON ({error}); retrain or re-copy the "
                                   "prescreener") from error
        return cls.from_json(manifest, path)


_MANIFEST_FIELDS = ("format", "config", "encoder", "encoder_fingerprint", "max_sentence_len")
# PrescreenConfig fields added after the first prescreeners were saved, each off by default.
LATER_FIELDS = ("interaction", "overlap")


def config_json(config: PrescreenConfig) -> dict[str, Any]:
    """The manifest's "config": a later field only when it is on, so a manifest written before
    it reads back to the same JSON, and code older than it still loads a prescreener without
    it."""
    values = dataclasses.asdict(config)
    return {key: value for key, value in values.items()
            if key not in LATER_FIELDS or value != getattr(PrescreenConfig, key)}


def _prescreen_config(values: dict[str, Any], path: Path) -> PrescreenConfig:
    """The manifest's "config" as a PrescreenConfig, every field checked by name."""
    try:
        config = PrescreenConfig(**values)
    except (TypeError, ValueError) as error:
        raise PrescreenerError(f"{path}: field 'config' is not a prescreener config ({error})"
                               ) from error
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if field.name == "dropout":
            valid = isinstance(value, (int, float)) and 0 <= value < 1
            expected = "a number in [0, 1)"
        elif field.name in LATER_FIELDS:  # switches
            valid = isinstance(value, bool)
            expected = "true or false"
        else:  # widths and counts
            valid = isinstance(value, int) and value > 0
            expected = "a positive integer"
        if (isinstance(value, bool) and field.name not in LATER_FIELDS) or not valid:
            raise PrescreenerError(f"{path}: config.{field.name} = {value!r} is invalid "
                                   f"({expected} expected)")
    return config


def load_sentence_encoder(checkpoint: str, max_sentence_len: int) -> Reader:
    """A sentence encoder: a reader checkpoint whose QA head is never used, so the import
    report's "QA head initialised" warning is not shown."""
    import logging

    from dil_jax.readers import load_reader

    logger = logging.getLogger("dil_jax.checkpoints")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return load_reader(checkpoint, None, max_sentence_len)
    finally:
        logger.setLevel(level)


@dataclasses.dataclass
class Screening:
    """What prescreening kept over SQuAD-style examples and their windows.

    keep: [n_windows, p_len] bool tokens the reader reads; spans: each example's sentence spans
    (cut to max_sentences); kept_sentences: [n_examples, S] bool.
    """

    keep: np.ndarray
    spans: list[list[tuple[int, int]]]
    kept_sentences: np.ndarray

    def answer_kept(self, examples: Sequence) -> np.ndarray:
        """[n_examples] bool: the sentence of the first gold answer was kept (P(SEP) in the
        seed's decomposition); False for examples without an answer."""
        kept = []
        for example, spans, row in zip(examples, self.spans, self.kept_sentences, strict=True):
            label = answer_sentence(spans, example.answer_starts[0]) \
                if example.answer_starts else -1
            kept.append(bool(0 <= label < len(row) and row[label]))
        return np.asarray(kept, bool)


def screen_features(prescreener: SentencePrescreener, rule: SentenceRule, examples: Sequence,
                    features) -> Screening:
    """Scores every example's context sentences against its question and keeps, per window,
    the tokens of the kept sentences (dil_jax.prescreening.screen)."""
    max_sentences = prescreener.config.max_sentences
    contexts: dict[str, int] = {}
    for example in examples:
        contexts.setdefault(example.context, len(contexts))
    context_spans = [split_sentences(context)[:max_sentences] for context in contexts]
    texts = [context[a:b] for context, spans in zip(contexts, context_spans)
             for a, b in spans]
    vectors = prescreener.embed(texts)
    first = np.concatenate([[0], np.cumsum([len(spans) for spans in context_spans])])
    dim = prescreener.config.embedding_dim
    sentences = np.zeros((len(examples), max_sentences, dim), np.float32)
    mask = np.zeros((len(examples), max_sentences), np.int32)
    owner = np.asarray([contexts[example.context] for example in examples], np.int64)
    for row, c in enumerate(owner):
        count = first[c + 1] - first[c]
        sentences[row, :count] = vectors[first[c]:first[c + 1]]
        mask[row, :count] = 1
    questions = prescreener.embed([example.question for example in examples])
    overlap = prescreener.overlap(
        [example.question for example in examples],
        [[example.context[a:b] for a, b in context_spans[c]]
         for example, c in zip(examples, owner, strict=True)])
    kept = rule.select(prescreener.score(questions, sentences, mask, overlap), mask)
    window_example = np.asarray(features.example_index)
    token_sentence = token_sentences(features.offsets, owner[window_example], context_spans)
    keep = window_keep(token_sentence, kept[window_example], features.p_mask)
    return Screening(keep, [context_spans[c] for c in owner], kept)
