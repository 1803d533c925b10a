"""Training data for QANet / BiDAF: the SQuAD windows plus each token's characters.

    config.data.featurizer = "dil_jax.train.char_data:featurize"   # SQuAD, as squad_data's
    config.data.featurizer = "dil_jax.train.char_data:synthetic"   # tests and smoke runs

Characters come from the texts through the tokenizer's character offsets
(`data.characters.squad_characters`, which `predict` reads with too). They are stored as
uint16 (ids < 512), `MAX_CHARS` (16, the paper's) slots per token, questions once and distinct
passage windows once: about 240 MB for the complete training set, against 1.4 GB per (question,
window) pair at int32. The model keeps its own `max_chars` of them (`qanet_inputs.fit_chars`).

A QANet / BiDAF here is a SQuAD v1.1 reader: it has no no-answer score (its null logits are
PADDED_LOGIT), so a window that does not hold its question's answer has no label it can learn.
`char_windows` leaves those windows out of training and of the validation loss (23% of the
complete training set's windows at 160 tokens, stride 80); evaluation still reads every window.
"""

from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np

from dil_jax.data.characters import CHAR_DTYPE, squad_characters
from dil_jax.data.features import FeaturizationError
from dil_jax.errors import UsageError
from dil_jax.model.qanet_inputs import MAX_CHARS, char_id
from dil_jax.readers.protocol import Reader
from dil_jax.train import data as data_lib


@dataclasses.dataclass
class CharFeatures(data_lib.TrainingFeatures):
    """`TrainingFeatures` plus characters:
      q_chars: [n_questions, Lq, MAX_CHARS] uint16, the characters of each question token;
      p_chars: [n_passages, Lp, MAX_CHARS] uint16, of each distinct passage window's tokens;
      p_source: [n_windows] int, the row of p_chars of each window.
    """

    q_chars: np.ndarray | None = None
    p_chars: np.ndarray | None = None
    p_source: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class CharWindows(data_lib.Windows):
    """Windows whose batches carry "q_chars" [*S, Lq, C] and "p_chars" [*S, Lp, C] too (a
    padding row's passage characters all CHAR_PAD, as its ids)."""

    q_chars: np.ndarray | None = None
    p_chars: np.ndarray | None = None
    p_source: np.ndarray | None = None

    def batch(self, rows: np.ndarray, valid: np.ndarray | None = None
              ) -> dict[str, np.ndarray]:
        out = super().batch(rows, valid)
        rows = np.asarray(rows)
        valid = np.ones(rows.shape, bool) if valid is None else np.asarray(valid, bool)
        out["q_chars"] = self.q_chars[self.question_index[rows]]
        out["p_chars"] = np.where(valid[..., None, None], self.p_chars[self.p_source[rows]],
                                  0).astype(CHAR_DTYPE)
        return out


def char_windows(features: CharFeatures) -> CharWindows:
    """The windows that hold their answer (module docstring), with their characters."""
    windows = data_lib.windows_from_features(features)
    q_chars, p_chars, p_source = (np.asarray(features.q_chars), np.asarray(features.p_chars),
                                  np.asarray(features.p_source))
    if q_chars.shape[:2] != windows.q_ids.shape or p_chars.shape[1] != windows.p_ids.shape[1] \
            or p_source.shape != (len(windows),) or q_chars.shape[2:] != p_chars.shape[2:]:
        raise FeaturizationError(f"characters q {q_chars.shape} / p {p_chars.shape} / source "
                                 f"{p_source.shape} do not fit q_ids {windows.q_ids.shape}, "
                                 f"p_ids {windows.p_ids.shape}")
    rows = np.nonzero(windows.start >= 0)[0]

    def take(values: np.ndarray | None) -> np.ndarray | None:
        return None if values is None else values[rows]

    return CharWindows(
        q_ids=windows.q_ids, q_mask=windows.q_mask, p_ids=windows.p_ids[rows],
        p_mask=windows.p_mask[rows], question_index=windows.question_index[rows],
        start=windows.start[rows], end=windows.end[rows],
        is_distractor=windows.is_distractor[rows], labelled=windows.labelled[rows],
        start_candidates=take(windows.start_candidates),
        end_candidates=take(windows.end_candidates),
        q_chars=q_chars.astype(CHAR_DTYPE), p_chars=p_chars.astype(CHAR_DTYPE),
        p_source=p_source[rows])


def windows_of(student: Reader, features: data_lib.FeaturesLike,
               featurizer: str) -> data_lib.Windows:
    """The trainer's windows of `features` for `student`: with their characters where it reads
    them (`ReaderCapabilities.reads_characters`). featurizer: config.data.featurizer, named in
    errors."""
    if not student.capabilities.reads_characters:
        return data_lib.windows_from_features(features)
    if getattr(features, "q_chars", None) is None or getattr(features, "p_chars", None) is None:
        raise UsageError(f"config.model.kind = {student.kind!r} reads characters: the "
                         f"features of config.data.featurizer = {featurizer!r} have "
                         "none (q_chars / p_chars); use dil_jax.train.char_data:featurize")
    windows = char_windows(features)
    if not len(windows):
        raise UsageError(f"config.data.featurizer = {featurizer!r}: no window holds "
                         "its answer; a QANet / BiDAF (no no-answer score) has nothing to learn")
    return windows


def featurize(data_cfg: ml_collections.ConfigDict, split: str, *,
              max_question_len: int) -> CharFeatures:
    """`squad_data.featurize`'s windows of the split (no distractors or unlabelled questions:
    the config rules refuse them for these readers), with answer candidates when
    data.answer_candidates_file is set (training), and the characters."""
    from dil_jax.data.features import featurize as featurize_examples
    from dil_jax.tokenization import load_tokenizer
    from dil_jax.train.answer_candidates import load_answer_candidates, window_candidates
    from dil_jax.train.squad_data import split_examples

    examples = split_examples(data_cfg, split)
    tokenizer = load_tokenizer(data_cfg.tokenizer)
    features = featurize_examples(examples, tokenizer, max_question_len=max_question_len,
                                  max_passage_len=data_cfg.max_passage_len,
                                  doc_stride=data_cfg.doc_stride)
    characters = squad_characters(examples, features, tokenizer)
    labels = {"start_positions": features.start_positions,
              "end_positions": features.end_positions}
    if split == "train" and data_cfg.get("answer_candidates_file", ""):
        spans = window_candidates(features, examples,
                                  load_answer_candidates(data_cfg.answer_candidates_file))
        labels = {"start_positions": spans.start_positions,
                  "end_positions": spans.end_positions,
                  "start_candidates": spans.start_candidates,
                  "end_candidates": spans.end_candidates}
    return CharFeatures(q_ids=features.q_ids, q_mask=features.q_mask, p_ids=features.p_ids,
                        p_mask=features.p_mask, example_index=features.example_index,
                        q_chars=characters.q_chars, p_chars=characters.p_chars,
                        p_source=characters.p_source, **labels)


def id_characters(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Synthetic tokens' characters: each real token spells its id in decimal digits (so equal
    ids have equal characters, as words do), padding none. [..., L] -> [..., L, MAX_CHARS]."""
    digits = {str(d): char_id(str(d)) for d in range(10)}
    out = np.zeros(ids.shape + (MAX_CHARS,), CHAR_DTYPE)
    for index in zip(*np.nonzero(mask)):
        spelled = str(int(ids[index]))[:MAX_CHARS]
        out[index][:len(spelled)] = [digits[d] for d in spelled]
    return out


def synthetic(data_cfg: ml_collections.ConfigDict, split: str, *,
              max_question_len: int) -> CharFeatures:
    """`data.synthetic`'s windows (the answer starts where the passage holds the question's
    second token) with `id_characters`."""
    base = data_lib.synthetic(data_cfg, split, max_question_len=max_question_len)
    fields = {field.name: getattr(base, field.name)
              for field in dataclasses.fields(data_lib.TrainingFeatures)}
    return CharFeatures(**fields, q_chars=id_characters(base.q_ids, base.q_mask),
                        p_chars=id_characters(base.p_ids, base.p_mask),
                        p_source=np.arange(len(base.p_ids)))
