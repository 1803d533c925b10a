"""Featurizers for `data.featurizer`: synthetic windows, and an INTERIM SQuAD featurizer.

`featurize` is a stand-in so that `dil-jax train` runs end-to-end on the shared SQuAD articles
before the real featurizer (`dil_jax.data.features`, SQuAD issue) is merged; the integrator
points `data.featurizer` of the configs at that one and deletes this function. It produces the
same contract (see dil_jax.train.data): each question encoded once, each paragraph cut into
windows of `max_passage_len - 1` tokens every `stride` tokens, one training window per
(question, window of its paragraph), the first answer's token span or -1 when outside the window.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_collections
import numpy as np

from dil_jax.train.data import NO_ANSWER, Features, synthetic_features

SPLIT_SEEDS = {"train": 0, "validation": 1}


def synthetic(data_cfg: ml_collections.ConfigDict, split: str, *,
              max_question_len: int) -> Features:
    """Synthetic windows sized by the config (validation uses another seed)."""
    s = data_cfg.synthetic
    return synthetic_features(
        num_questions=s.num_questions, windows_per_question=s.windows_per_question,
        question_len=max_question_len, passage_len=data_cfg.max_passage_len,
        vocab_size=s.vocab_size, seed=SPLIT_SEEDS[split], null_fraction=s.null_fraction)


def article_slice(spec: str) -> slice:
    """"a:b" (either side optional) -> slice(a, b)."""
    start, _, stop = spec.partition(":")
    return slice(int(start) if start else None, int(stop) if stop else None)


def _answer_tokens(offsets: list[tuple[int, int]], start_char: int,
                   end_char: int) -> tuple[int, int]:
    """Token span [first, last] covering characters [start_char, end_char) of the context."""
    first = next(i for i, (_, end) in enumerate(offsets) if end > start_char)
    last = max(i for i, (begin, _) in enumerate(offsets) if begin < end_char)
    return first, last


def featurize(data_cfg: ml_collections.ConfigDict, split: str, *,
              max_question_len: int) -> Features:
    """INTERIM: SQuAD v1.1 JSON -> training windows (see the module docstring)."""
    from dil_jax.tokenization import encode_questions, load_tokenizer

    path = Path(data_cfg.squad_file)
    if not path.is_file():
        raise FileNotFoundError(f"data.squad_file {path} not found")
    spec = data_cfg.train_articles if split == "train" else data_cfg.validation_articles
    articles = json.loads(path.read_text(encoding="utf-8"))["data"][article_slice(spec)]
    tokenizer = load_tokenizer(data_cfg.tokenizer)
    room = data_cfg.max_passage_len - 1  # `p_window [SEP]`
    questions: list[str] = []
    windows: list[tuple[int, list[int], int, int]] = []  # question row, ids, start, end
    for article in articles:
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            encoded = tokenizer(context, add_special_tokens=False, return_offsets_mapping=True)
            ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
            starts = list(range(0, max(len(ids) - room, 0) + 1, data_cfg.stride))
            if starts[-1] + room < len(ids):
                starts.append(len(ids) - room)
            for qa in paragraph["qas"]:
                if 0 < data_cfg.max_questions <= len(questions):
                    break
                row = len(questions)
                questions.append(qa["question"])
                answer = qa["answers"][0] if qa.get("answers") else None
                span = None
                if answer is not None:
                    begin = answer["answer_start"]
                    span = _answer_tokens(offsets, begin, begin + len(answer["text"]))
                for w0 in starts:
                    inside = span is not None and w0 <= span[0] and span[1] < w0 + room
                    start, end = (span[0] - w0, span[1] - w0) if inside else (NO_ANSWER,
                                                                              NO_ANSWER)
                    windows.append((row, ids[w0:w0 + room], start, end))
    q = encode_questions(tokenizer, questions, max_question_len)
    p_ids = np.full((len(windows), room + 1), tokenizer.pad_token_id, np.int32)
    p_mask = np.zeros((len(windows), room + 1), np.int32)
    for i, (_, ids, _, _) in enumerate(windows):
        p_ids[i, :len(ids)], p_ids[i, len(ids)] = ids, tokenizer.sep_token_id
        p_mask[i, :len(ids) + 1] = 1
    q_index = np.asarray([w[0] for w in windows], np.int64)
    return Features(q_ids=q.ids, q_mask=q.mask, p_ids=p_ids, p_mask=p_mask,
                    window_question_index=q_index,
                    start_positions=np.asarray([w[2] for w in windows], np.int32),
                    end_positions=np.asarray([w[3] for w in windows], np.int32),
                    example_index=q_index.copy())
